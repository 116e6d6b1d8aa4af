#!/usr/bin/env python3
"""What each router adds to a miss's time to first token, from `prefix-bench compare` results.

Usage: python3 scripts/bench/analysis/miss-overhead.py [--prefill-us-per-token 50] results/compare-<ts>.json [...]

podsim's time to first token is its queue plus `uncached tokens x --prefill-us-per-token`
(tools/podsim/src/scheduler.rs). For every request that missed (its pod reported fewer than half
its prompt tokens cached) this prints TTFT minus that prefill: the router's own path, the
client's and pod's I/O, the timer's granularity, and any queueing. At the prefill cliff
(cache-pressure's p90, high-load's p99) the slowest requests are such misses for every router, so
these figures are what decides the TTFT targets there. Per workload and router, one line per
results file: the misses counted, the 10th, 50th and 90th percentiles of that remainder in ms, and
the router's TTFT p90 and p99. Then, per workload and router, the median over the files of each
percentile. Only the stdlib is used.
"""

import json
import statistics
import sys


def percentile(xs, q):
    """The q-quantile of sorted `xs`: the element at rank floor(len x q)."""
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def main(argv):
    us_per_token = 50.0
    if len(argv) > 2 and argv[1] == "--prefill-us-per-token":
        us_per_token = float(argv[2])
        argv = argv[:1] + argv[3:]
    files = argv[1:]
    if not files:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    rows = {}
    for path in files:
        with open(path) as f:
            data = json.load(f)
        for workload in data["workloads"]:
            for result in workload["results"]:
                rest = sorted(
                    o["ttft_ms"] - (o["prompt_tokens"] - o["cached_tokens"]) * us_per_token / 1000
                    for o in result["outcomes"]
                    if o.get("status") == 200
                    and o.get("ttft_ms") is not None
                    and o["cached_tokens"] * 2 < o["prompt_tokens"]
                )
                if not rest:
                    continue
                ttft = result["stats"]["ttft_ms"]
                rows.setdefault((workload["workload"], result["router"]), []).append(
                    (
                        path,
                        len(rest),
                        percentile(rest, 0.1),
                        statistics.median(rest),
                        percentile(rest, 0.9),
                        ttft["p90"],
                        ttft["p99"],
                    )
                )
    print("TTFT minus podsim's prefill, misses only (ms)")
    for (workload, router), runs in sorted(rows.items()):
        for path, n, p10, p50, p90, t90, t99 in runs:
            print(
                f"{workload:15} {router:16} misses {n:3}  p10 {p10:5.2f}  p50 {p50:5.2f}"
                f"  p90 {p90:6.2f}   TTFT p90 {t90:7.2f}  p99 {t99:7.2f}  {path}"
            )
    print()
    print(f"median over {len(files)} file(s): p10 / p50 / p90 of the remainder; TTFT p90 / p99")
    for (workload, router), runs in sorted(rows.items()):
        med = [statistics.median(r[i] for r in runs) for i in range(2, 7)]
        print(
            f"{workload:15} {router:16} {med[0]:5.2f} / {med[1]:5.2f} / {med[2]:6.2f}"
            f"   {med[3]:7.2f} / {med[4]:7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
