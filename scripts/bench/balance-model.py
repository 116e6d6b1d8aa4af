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

usage: balance-model.py <policy>:<R> ...   e.g. own_sent:3 own_sent_oldest:3
Prints TTFT p90/p99/p99.9 ms for seeds 1-3, 60,000 requests each.
"""
import random
import sys

RATE, S, P, PODS, SLOTS, N = 39.4, 0.308, 0.213, 4, 4, 60000


def sim(policy, balancers, seed):
    rnd = random.Random(seed)
    t = 0.0
    free_at = [[0.0] * SLOTS for _ in range(PODS)]  # when each slot frees
    inflight = [[] for _ in range(PODS)]  # (end, balancer, sent at)
    sent = [[0] * PODS for _ in range(balancers)]
    turn = [rnd.randrange(PODS) for _ in range(balancers)]
    ttfts = []
    for i in range(N):
        t += rnd.expovariate(RATE)
        b = i % balancers
        for p in range(PODS):
            inflight[p] = [x for x in inflight[p] if x[0] > t]
        own = [sum(1 for x in inflight[p] if x[1] == b) for p in range(PODS)]
        total = [len(inflight[p]) for p in range(PODS)]
        # Oldest first: the earliest send time, none = never (sorts last
        # among equals only through the other fields).
        oldest = [min((x[2] for x in inflight[p] if x[1] == b), default=t) for p in range(PODS)]
        oldest_all = [min((x[2] for x in inflight[p]), default=t) for p in range(PODS)]
        if policy == "rr":
            pod = turn[b] % PODS
            turn[b] += 1
        else:
            keys = {
                "jsq": lambda p: (total[p],),
                "jsq_sent": lambda p: (total[p], sent[b][p]),
                "jsq_oldest": lambda p: (total[p], oldest_all[p]),
                "own": lambda p: (own[p],),
                "own_sent": lambda p: (own[p], sent[b][p]),
                "own_oldest": lambda p: (own[p], oldest[p]),
                "own_sent_oldest": lambda p: (own[p], sent[b][p], oldest[p]),
            }
            key = keys[policy]
            best = min(key(p) for p in range(PODS))
            ties = [p for p in range(PODS) if key(p) == best]
            pod = ties[turn[b] % len(ties)]
            turn[b] += 1
        slot = min(range(SLOTS), key=lambda j: free_at[pod][j])
        start = max(t, free_at[pod][slot])
        free_at[pod][slot] = start + S
        ttfts.append(start - t + P)
        inflight[pod].append((start + S, b, t))
        sent[b][pod] += 1
    ttfts.sort()
    return [ttfts[int(f * len(ttfts))] * 1000 for f in (0.9, 0.99, 0.999)]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    for arg in sys.argv[1:]:
        policy, _, r = arg.partition(":")
        runs = [sim(policy, int(r or 1), seed) for seed in (1, 2, 3)]
        print(arg, " ".join("%.0f/%.0f/%.0f" % tuple(x) for x in runs))


if __name__ == "__main__":
    main()
