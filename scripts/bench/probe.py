#!/usr/bin/env python3
"""Probes used by scripts/bench/verify.sh (stdlib only, any Python 3.8+).

  probe.py wait URL TIMEOUT_S [N_WORKERS]   GET URL until 200 (and, with N_WORKERS, until
                                            its JSON says healthy_workers == N_WORKERS);
                                            prints the seconds it took
  probe.py smoke BASE_URL MODEL             one /v1/completions and one streaming
                                            /v1/chat/completions (with include_usage)
  probe.py affinity BASE_URL [GROUPS]       GROUPS long prefixes, round 1 concurrent (each
                                            request held 300 ms by podsim's x-sim-delay-ms),
                                            rounds 2-3 sequential; prints x-served-by and
                                            cached_tokens, and whether each group stuck
  probe.py ttft BASE_URL MODEL WORDS_FILE N_WORDS
                                            a shared prefix of N_WORDS words with 3 different
                                            questions, streamed: cold vs warm TTFT
"""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def conn(base):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=300)


def post(base, path, body, headers=None):
    c = conn(base)
    h = {"content-type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    return r, c


def wait(url, timeout, n_workers=None):
    t0 = time.monotonic()
    u = urllib.parse.urlsplit(url)
    while time.monotonic() - t0 < timeout:
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            c.request("GET", u.path or "/")
            r = c.getresponse()
            body = r.read()
            if r.status == 200:
                if n_workers is None or json.loads(body).get("healthy_workers") == n_workers:
                    print(f"{time.monotonic() - t0:.2f}")
                    return 0
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    print(f"not ready after {timeout}s: {url}", file=sys.stderr)
    return 1


def smoke(base, model):
    r, _ = post(base, "/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 4})
    body = json.loads(r.read())
    assert r.status == 200, (r.status, body)
    print(f"completions: {r.status} x-served-by={r.getheader('x-served-by')} "
          f"text={body['choices'][0]['text']!r} usage={json.dumps(body['usage'])}")
    r, _ = post(base, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4,
        "stream": True, "stream_options": {"include_usage": True}})
    assert r.status == 200, r.status
    events = [ln[6:] for ln in r.read().decode().split("\n") if ln.startswith("data: ")]
    usage = [json.loads(e)["usage"] for e in events if e != "[DONE]" and json.loads(e).get("usage")]
    assert events and events[-1] == "[DONE]" and usage, events[-3:]
    print(f"chat stream: {r.status} {r.getheader('content-type')} x-served-by={r.getheader('x-served-by')} "
          f"events={len(events)} last=[DONE] usage={json.dumps(usage[-1])}")
    return 0


def prefix(group):
    rnd = random.Random(group)
    words = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]
    return " ".join(rnd.choice(words) for _ in range(400))


def affinity(base, groups=6):
    res = {}

    def one(g, rnd, hold):
        h = {"x-sim-delay-ms": "300"} if hold else {}
        r, _ = post(base, "/v1/completions", {"model": "m", "prompt": f"{prefix(g)} question {rnd}?",
                                               "max_tokens": 2}, h)
        b = json.loads(r.read())
        res[(g, rnd)] = (r.getheader("x-served-by"), b["usage"]["prompt_tokens_details"]["cached_tokens"])

    gs = [f"G{i}" for i in range(1, groups + 1)]
    ts = [threading.Thread(target=one, args=(g, 1, True)) for g in gs]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for rnd in (2, 3):
        for g in gs:
            one(g, rnd, False)
    stuck = 0
    for g in gs:
        row = [res[(g, r)] for r in (1, 2, 3)]
        ok = len({p for p, _ in row}) == 1 and all(c > 0 for _, c in row[1:])
        stuck += ok
        print(f"  {g}: " + "  ".join(f"r{r}={p}/cached={c}" for r, (p, c) in zip((1, 2, 3), row)))
    pods = sorted({res[(g, 1)][0] for g in gs})
    print(f"affinity: {stuck}/{len(gs)} groups stayed on their first pod with cached tokens; "
          f"first-round pods: {', '.join(pods)}")
    return 0


def stream_ttft(base, model, prompt, max_tokens=16):
    t0 = time.perf_counter()
    r, _ = post(base, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                           "stream": True, "stream_options": {"include_usage": True}})
    ttft = usage = timings = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        d = json.loads(line[6:])
        if ttft is None and d.get("choices") and d["choices"][0].get("text"):
            ttft = time.perf_counter() - t0
        usage = d.get("usage") or usage
        timings = d.get("timings") or timings
    return ttft, time.perf_counter() - t0, usage, timings


def ttft(base, model, words_file, n_words):
    words = open(words_file).read().split()
    base_prompt = " ".join(words[: int(n_words)])
    qs = [" Question: what does the first section say about routing and its fallback?",
          " Question: which metrics are exported, and what do they count?",
          " Question: how should the benchmark harness start the servers?"]
    for i, q in enumerate(qs):
        t, total, u, tm = stream_ttft(base, model, base_prompt + q)
        print(f"{'cold' if i == 0 else 'warm'}: ttft={t * 1000:.0f}ms total={total * 1000:.0f}ms "
              f"prompt_tokens={u['prompt_tokens']} "
              f"cached_tokens={u.get('prompt_tokens_details', {}).get('cached_tokens')} "
              f"timings.cache_n={tm and tm.get('cache_n')}")
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "wait":
        sys.exit(wait(args[0], float(args[1]), int(args[2]) if len(args) > 2 else None))
    if cmd == "smoke":
        sys.exit(smoke(*args))
    if cmd == "affinity":
        sys.exit(affinity(args[0], int(args[1]) if len(args) > 1 else 6))
    if cmd == "ttft":
        sys.exit(ttft(*args))
    sys.exit(__doc__)
