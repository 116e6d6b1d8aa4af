#!/usr/bin/env python3
"""Queueing model of the no-sharing workload: how balancers that see all, or
only their own share of, the requests in flight place new prompts.

4 pods with 4 FIFO slots each (podsim --slots 4), Poisson arrivals at 39.4
req/s sent to R balancers in turn (the bench client alternates between
replicas), every request holding its slot for S = 308 ms of which the first
P = 213 ms are its prefill (a 4,224-token prompt at 50 us per token, 16
output tokens). TTFT = wait for a slot + P. Deterministic service, no
network, no sync: only what each balancer knows differs.

Policies, each a sort key per pod (lowest wins; ties rotate per balancer):
  rr               each balancer round-robins on its own
  jsq              fewest in flight on the pod (everyone's: R = 1 sees all)
  jsq_sent         jsq, then fewest sent by this balancer so far
  jsq_oldest       jsq, then the oldest request in flight (frees first)
  own              fewest of this balancer's own requests in flight
  own_sent         own, then fewest sent by this balancer (the filter's
                   tie-break before the age tie)
  own_oldest       own, then this balancer's oldest request in flight there
  own_sent_oldest  own, sent, then oldest (the filter with the age tie)

Replicas of several worker VMs (<policy>:<R>:<V>, V VMs per replica, a
request to a VM of its replica at random; in-flight counts are the
replica's, as the filter exchanges them per request):
  vm_sent          replica's in-flight count, then the VM's sent count
  vm_sent_own_age  then the oldest of this VM's own requests in flight
  vm_sent_rep_age  then the oldest of the replica's requests in flight
  vm_sent_rep_tick20, vm_sent_rep_tick250
                   the same, send times known to the tick (20 or 250 ms)
  rep_sent_rep_tick20
                   replica's in-flight count, the replica's sent count,
                   then the replica's oldest known to 20 ms (the filter
                   since sent counts and ages travel with the counts)

Pictures of the other balancers' requests (each balancer's own exact):
  snap20, snap50, snap100, snap250
                   every request in flight and the oldest, the others'
                   as of a snapshot every 20/50/100/250 ms (a background
                   exchange, balancers' snapshots staggered)
  shared20         a fleet-wide picture every placement updates at once
                   (a per-request exchange through one store), whose
                   completions show within 20 ms: count, then oldest

usage: balance-model.py <policy>:<R>[:<V>] ...   e.g. own_sent:3 own_sent_oldest:3
Prints TTFT p90/p99/p99.9 ms for seeds 1-3, 60,000 requests each.
"""
import random
import sys

RATE, S, P, PODS, SLOTS, N = 39.4, 0.308, 0.213, 4, 4, 60000


def sim(policy, replicas, seed, vms=1):
    """TTFT p90/p99/p99.9 ms of one run: `replicas` balancers in turn, each of
    `vms` worker VMs (a request goes to one of its replica's at random)."""
    rnd = random.Random(seed)
    t = 0.0
    free_at = [[0.0] * SLOTS for _ in range(PODS)]  # when each slot frees
    inflight = [[] for _ in range(PODS)]  # (end, replica, vm, sent at)
    recent = [[] for _ in range(PODS)]  # the same, ended up to 1 s ago too
    sent = [[[0] * PODS for _ in range(vms)] for _ in range(replicas)]
    turn = [[rnd.randrange(PODS) for _ in range(vms)] for _ in range(replicas)]
    ttfts = []
    for i in range(N):
        t += rnd.expovariate(RATE)
        r = i % replicas
        v = rnd.randrange(vms) if vms > 1 else 0
        for p in range(PODS):
            recent[p] = [x for x in recent[p] if x[0] > t - 1.0]
            inflight[p] = [x for x in recent[p] if x[0] > t]
        total = [len(inflight[p]) for p in range(PODS)]
        # The replica's requests in flight (with one VM: the balancer's own).
        own = [sum(1 for x in inflight[p] if x[1] == r) for p in range(PODS)]

        def oldest(p, scope, tick=0.0):
            """The earliest send time in flight on `p` (now with none): of
            every request, the replica's, or this VM's, known to `tick`."""
            times = [
                x[3] if tick == 0 else x[3] - (x[3] % tick)
                for x in inflight[p]
                if scope == "all" or (x[1] == r and (scope == "replica" or x[2] == v))
            ]
            return min(times, default=t)

        def snap(p, period):
            """(count, oldest) of `p`: the others' requests as of this
            balancer's last snapshot (sent by then, not ended by then),
            its own now."""
            at = t - ((t + r * period / 3) % period)
            seen = [x for x in recent[p] if x[1] != r and x[3] <= at < x[0]]
            seen += [x for x in inflight[p] if x[1] == r]
            return (len(seen), min((x[3] for x in seen), default=t))

        def shared(p, lag):
            """(count, oldest) of `p` in a store every placement updates at
            once, whose completions show `lag` late."""
            seen = [x for x in recent[p] if x[0] + lag > t]
            return (len(seen), min((x[3] for x in seen), default=t))

        sent_here = sent[r][v]
        sent_rep = [sum(sent[r][w][p] for w in range(vms)) for p in range(PODS)]
        keys = {
            "snap20": lambda p: snap(p, 0.02),
            "snap50": lambda p: snap(p, 0.05),
            "snap100": lambda p: snap(p, 0.1),
            "snap250": lambda p: snap(p, 0.25),
            "shared20": lambda p: shared(p, 0.02),
            "jsq": lambda p: (total[p],),
            "jsq_sent": lambda p: (total[p], sent_here[p]),
            "jsq_oldest": lambda p: (total[p], oldest(p, "all")),
            "own": lambda p: (own[p],),
            "own_sent": lambda p: (own[p], sent_here[p]),
            "own_oldest": lambda p: (own[p], oldest(p, "replica")),
            "own_sent_oldest": lambda p: (own[p], sent_here[p], oldest(p, "replica")),
            "vm_sent": lambda p: (own[p], sent_here[p]),
            "vm_sent_own_age": lambda p: (own[p], sent_here[p], oldest(p, "vm")),
            "vm_sent_rep_age": lambda p: (own[p], sent_here[p], oldest(p, "replica")),
            "vm_sent_rep_tick20": lambda p: (own[p], sent_here[p], oldest(p, "replica", 0.02)),
            "vm_sent_rep_tick250": lambda p: (own[p], sent_here[p], oldest(p, "replica", 0.25)),
            "rep_sent_rep_tick20": lambda p: (own[p], sent_rep[p], oldest(p, "replica", 0.02)),
        }
        if policy == "rr":
            pod = turn[r][v] % PODS
        else:
            key = keys[policy]
            best = min(key(p) for p in range(PODS))
            ties = [p for p in range(PODS) if key(p) == best]
            pod = ties[turn[r][v] % len(ties)]
        turn[r][v] += 1
        slot = min(range(SLOTS), key=lambda j: free_at[pod][j])
        start = max(t, free_at[pod][slot])
        free_at[pod][slot] = start + S
        ttfts.append(start - t + P)
        recent[pod].append((start + S, r, v, t))
        sent[r][v][pod] += 1
    ttfts.sort()
    return [ttfts[int(f * len(ttfts))] * 1000 for f in (0.9, 0.99, 0.999)]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    for arg in sys.argv[1:]:
        policy, r, v = (arg.split(":") + ["1", "1"])[:3]
        runs = [sim(policy, int(r), seed, int(v)) for seed in (1, 2, 3)]
        print(arg, " ".join("%.0f/%.0f/%.0f" % tuple(x) for x in runs))


if __name__ == "__main__":
    main()
