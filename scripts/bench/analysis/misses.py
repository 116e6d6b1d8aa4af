#!/usr/bin/env python3
"""Why each router's misses happened, from a `prefix-bench compare` results file.

Usage: python3 scripts/bench/analysis/misses.py results/compare-<ts>.json [more.json ...]

For every workload and router in the file, the requests of each prompt family
(shared-prefix group, tenant, system prompt) are taken in the order they were
sent. A request is a miss when its pod reported fewer than half its prompt
tokens cached. A pod *holds* a family from the end of the first request of
that family it served (its first token: podsim caches the prompt then). Each
miss gets one class:

- first:          the family's first request (no router can hit it);
- pending-same:   sent to a pod whose first request of the family was still
                  in prefill (it misses there as it would anywhere);
- pending-other:  sent to a pod that never served the family while another
                  pod's first one was still in prefill, none done yet;
- not-holder:     sent to a pod that never served the family while another
                  pod already held it (a copy, or a request diverted by load);
- evicted:        sent to a pod that had held the family (its cache dropped it).

Printed per router: hit rate (cached over prompt tokens, as `compare` prints
it), misses and lost prompt tokens per class (as a share of all prompt
tokens), and how many families each pod served first, the cache footprint
placement gave it. Then how often a family's request went to the pod that
served its previous request, and how often it went elsewhere and missed,
split by whether the previous request came through the same replica (the
`target` a request was sent to; one Envoy is one target). Only the stdlib is
used.
"""

import collections
import json
import sys

CLASSES = ("first", "pending-same", "pending-other", "not-holder", "evicted")


def classify(outcomes):
    """(class counts, lost tokens per class, families placed per pod)."""
    families = collections.defaultdict(list)
    for o in outcomes:
        if o.get("status") == 200 and o.get("family") is not None:
            families[o["family"]].append(o)
    counts = collections.Counter()
    lost = collections.Counter()
    placed = collections.Counter()
    for requests in families.values():
        requests.sort(key=lambda o: o["start_ms"])
        placed[requests[0]["pod"]] += 1
        # pod -> when its first request of the family produced a token
        ready = {}
        for i, o in enumerate(requests):
            start, pod = o["start_ms"], o["pod"]
            if o["cached_tokens"] * 2 < o["prompt_tokens"]:
                if i == 0:
                    kind = "first"
                elif pod in ready:
                    kind = "pending-same" if ready[pod] > start else "evicted"
                elif any(t <= start for t in ready.values()):
                    kind = "not-holder"
                else:
                    kind = "pending-other"
                counts[kind] += 1
                lost[kind] += o["prompt_tokens"] - o["cached_tokens"]
            ready.setdefault(pod, start + (o["ttft_ms"] or 0))
    return counts, lost, placed


def follow(outcomes):
    """Per (same replica as the previous request?): requests of a family
    after its first, those sent to the previous request's pod, and those
    sent elsewhere that missed."""
    families = collections.defaultdict(list)
    for o in outcomes:
        if o.get("status") == 200 and o.get("family") is not None:
            families[o["family"]].append(o)
    counts = collections.Counter()
    for requests in families.values():
        requests.sort(key=lambda o: o["start_ms"])
        for prev, o in zip(requests, requests[1:]):
            same = "same" if prev.get("target") == o.get("target") else "other"
            counts[same, "all"] += 1
            if o["pod"] == prev["pod"]:
                counts[same, "followed"] += 1
            elif o["cached_tokens"] * 2 < o["prompt_tokens"]:
                counts[same, "elsewhere-miss"] += 1
    return counts


def report(path):
    with open(path) as f:
        data = json.load(f)
    print(f"# {path}")
    for workload in data.get("workloads", []):
        for result in workload.get("results", []):
            outcomes = result.get("outcomes") or []
            if not outcomes:
                continue
            prompt = sum(o["prompt_tokens"] for o in outcomes if o.get("status") == 200)
            cached = sum(o["cached_tokens"] for o in outcomes if o.get("status") == 200)
            if prompt == 0:
                continue
            counts, lost, placed = classify(outcomes)
            classes = "  ".join(
                f"{k} {counts[k]} ({lost[k] / prompt:.3f})" for k in CLASSES if counts[k]
            )
            pods = " ".join(f"{p}:{placed[p]}" for p in sorted(placed))
            print(
                f"{workload['workload']:<15} {result['router']:<16} hit {cached / prompt:.3f}"
                f"  first requests per pod {pods}\n{'':<33} misses: {classes}"
            )
            f = follow(outcomes)
            sides = "  ".join(
                f"{side} replica: {f[side, 'followed']}/{f[side, 'all']} to the previous pod, "
                f"{f[side, 'elsewhere-miss']} elsewhere and missed"
                for side in ("same", "other")
                if f[side, "all"]
            )
            print(f"{'':<33} after the previous request: {sides}")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    for path in argv[1:]:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
