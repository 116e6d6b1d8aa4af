#!/usr/bin/env python3
"""Which prompt families were first served by the slowest pod, and when.

Usage: python3 scripts/bench/analysis/slow-pod-firsts.py results/compare-<ts>.json [more.json ...]

For the hetero-fleet workload of each file and every router whose key starts
with `filter`, the slow pod is the one with the highest median request
latency. For each family whose first request went there, it prints the
request's start (ms into the run), the target (replica) that sent it, and how
many requests on the slow pod had returned their first token before it: from
that replica, and from any. A router can only time a pod's prefill once one
of its requests there has answered (or by a prefill still open, see
`route/prefill`). Only the stdlib is used.
"""

import json
import statistics
import sys


def firsts_on_slow(outcomes):
    """(slow pod, its request count, [(start ms, target, known here, known anywhere)])."""
    o = sorted(outcomes, key=lambda x: x["start_ms"])
    pods = sorted({x["pod"] for x in o})
    lat = {p: statistics.median(x["latency_ms"] for x in o if x["pod"] == p) for p in pods}
    slow = max(lat, key=lat.get)
    seen, firsts = set(), []
    for x in o:
        if x["family"] in seen:
            continue
        seen.add(x["family"])
        if x["pod"] != slow:
            continue
        answered = [
            y for y in o if y["pod"] == slow and y["start_ms"] + y["ttft_ms"] < x["start_ms"]
        ]
        here = [y for y in answered if y["target"] == x["target"]]
        firsts.append((round(x["start_ms"]), x["target"], len(here), len(answered)))
    return slow, sum(1 for x in o if x["pod"] == slow), firsts


def main(paths):
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for w in doc["workloads"]:
            if w["workload"] != "hetero-fleet":
                continue
            for r in w["results"]:
                if not r["router"].startswith("filter"):
                    continue
                slow, n, firsts = firsts_on_slow(r["outcomes"])
                print(f"{path} {r['router']}: slow pod {slow}, {n} requests; "
                      f"families first served there (start ms, target, answered there "
                      f"before: from this target, from any): {firsts}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
