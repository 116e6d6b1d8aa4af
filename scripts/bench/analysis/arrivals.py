#!/usr/bin/env python3
"""Requests that met a full pod, from a `prefix-bench compare` results file.

Usage: python3 scripts/bench/analysis/arrivals.py results/compare-<ts>.json [--slots 4] [more.json ...]

For every workload and router in the file, each request's pod load at the
moment it was sent is rebuilt from the outcomes (the client's start time and
latency of every request to that pod: a request is in flight on its pod from
its start until its end). A request *met a full pod* when its pod already had
`--slots` (podsim's `--slots`, 4 in `compare`) or more in flight: it waits
for a slot. It was *misplaced* when, at that moment, another pod had a free
slot: a router that knew every pod's load then would not have queued it.

Printed per router: requests that met a full pod, how many of those were
misplaced, and the slowest requests' TTFT with their pod's load and every
pod's load when each was sent. Client-side times include the network and
Envoy, so a load read at an exact end or start can be off by one.
Only the stdlib is used.
"""

import json
import sys


def in_flight(events, t, pod):
    """Requests on `pod` in flight at time `t` (ms)."""
    return sum(1 for start, end, p, _ in events if p == pod and start < t < end)


def report(path, slots):
    with open(path) as f:
        data = json.load(f)
    for workload in data["workloads"]:
        for result in workload["results"]:
            events = [
                (o["start_ms"], o["start_ms"] + o["latency_ms"], o["pod"], o["ttft_ms"])
                for o in result["outcomes"]
                if o.get("pod") is not None and o.get("ttft_ms") is not None
            ]
            pods = sorted({e[2] for e in events})
            full = misplaced = 0
            for start, _, pod, _ in events:
                if in_flight(events, start, pod) >= slots:
                    full += 1
                    if min(in_flight(events, start, q) for q in pods) < slots:
                        misplaced += 1
            print(
                f"{workload.get('workload', '?'):15} {result['router']:15} met a full pod {full}"
                f" of {len(events)}, misplaced {misplaced}"
            )
            worst = sorted(events, key=lambda e: -e[3])[:8]
            shown = [
                f"{round(ttft)} ms on {pod} at {in_flight(events, start, pod)}"
                f" (all {[in_flight(events, start, q) for q in pods]})"
                for start, _, pod, ttft in worst
            ]
            print("    slowest: " + "; ".join(shown))


def main(argv):
    slots = 4
    paths = []
    args = iter(argv)
    for a in args:
        if a == "--slots":
            slots = int(next(args))
        else:
            paths.append(a)
    if not paths:
        print(__doc__)
        return 2
    for p in paths:
        print(f"# {p}")
        report(p, slots)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
