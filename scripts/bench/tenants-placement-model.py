#!/usr/bin/env python3
"""How balanced can the `tenants` workload be without copies? A model, not a benchmark.

The `tenants` workload of `prefix-bench compare`: 512 requests of 16 tenants, tenant drawn
Zipf(s = 1), 4 pods. A router that never copies a tenant keeps each tenant on the pod its first
request went to, so the pods' request counts are decided by where each tenant's first request
was placed. This draws 400 request orders and reports requests per pod max/min for:

- three online rules (the pod is chosen at the tenant's first request, from what came before):
  fewest tenants placed, fewest requests so far, lowest sum of the placed tenants' observed rates;
- the offline split that knows each tenant's final size (largest first onto the emptiest pod).

Usage: python3 scripts/bench/tenants-placement-model.py [orders]
"""
import random
import sys

TENANTS, PODS, REQUESTS = 16, 4, 512
WEIGHTS = [1 / k for k in range(1, TENANTS + 1)]


def order(seed):
    return random.Random(seed).choices(range(TENANTS), weights=WEIGHTS, k=REQUESTS)


def online(seq, rule):
    home, per_pod, per_tenant, first, placed = {}, [0] * PODS, [0] * TENANTS, {}, [0] * PODS
    for i, t in enumerate(seq):
        if t not in home:
            first[t] = i
            if rule == "fewest tenants":
                key = lambda p: (placed[p], per_pod[p])
            elif rule == "fewest requests":
                key = lambda p: per_pod[p]
            else:  # observed rates
                rate = [0.0] * PODS
                for u, p in home.items():
                    rate[p] += per_tenant[u] / (i - first[u] + 1)
                key = lambda p: (rate[p], per_pod[p])
            home[t] = min(range(PODS), key=key)
            placed[home[t]] += 1
        per_pod[home[t]] += 1
        per_tenant[t] += 1
    return max(per_pod) / max(1, min(per_pod))


def offline(seq):
    sizes = sorted((seq.count(t) for t in range(TENANTS)), reverse=True)
    per_pod = [0] * PODS
    for s in sizes:
        per_pod[per_pod.index(min(per_pod))] += s
    return max(per_pod) / max(1, min(per_pod))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    orders = [order(s) for s in range(n)]
    rows = [(r, [online(o, r) for o in orders]) for r in ("fewest tenants", "fewest requests", "observed rates")]
    rows.append(("offline, sizes known", [offline(o) for o in orders]))
    print(f"requests per pod max/min over {n} request orders (no copies: every tenant's first request is its only miss)")
    print(f"{'placement':<22} {'median':>7} {'p10':>6} {'p90':>6} {'<= 1.5':>7}")
    for name, xs in rows:
        xs.sort()
        q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
        ok = sum(x <= 1.5 for x in xs) / len(xs)
        print(f"{name:<22} {q(0.5):>7.2f} {q(0.1):>6.2f} {q(0.9):>6.2f} {ok:>7.0%}")


if __name__ == "__main__":
    main()
