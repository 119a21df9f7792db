#!/usr/bin/env python3
"""Load generator for zipage-serve (or any OpenAI-compatible /v1/completions server), standard library only
(the device image has Python but no npm registry): N concurrent streaming requests of one shape, and the
throughput, time to first token (TTFT), inter-token latency (ITL) and end-to-end latency percentiles.

  # prompts: one per line, `--words` random words after a unique "Request i:" (no shared prefix)
  python3 bench/serve_load.py prompts --out prompts.txt --num 256 --words 96 --seed 0
  # nano-vllm's shape: 100-1024 words per prompt and an output length of 100-1024 per request (uniform,
  # seeded), the lengths written one per line for `run --max-tokens-file` and zipage-generate's
  python3 bench/serve_load.py prompts --out prompts.txt --num 256 --words 100 --words-max 1024 \
      --tokens 100 1024 --tokens-out lengths.txt
  # the load: every prompt once, at most --concurrency in flight, each streamed with max_tokens and
  # ignore_eos (so every request generates exactly --max-tokens tokens), greedy
  python3 bench/serve_load.py run --base http://127.0.0.1:8000 --model qwen3-8b --prompts prompts.txt \
      --max-tokens 1024 --concurrency 256 --json load.json

With --request-rate R the requests arrive as a Poisson process of R per second (seeded exponential gaps,
as vLLM's benchmark_serving; default inf: all at once), at most --concurrency in flight; a request's times
count from when it is actually sent. The requests are spread over --procs processes (threads inside each, one per request in flight), so the
client's JSON parsing does not become the bottleneck at tens of thousands of chunks per second. Times are
CLOCK_MONOTONIC (shared by the processes). Throughput = completion tokens (from each stream's usage chunk)
/ (last response end - first request sent). TTFT: request sent -> first chunk with text; ITL: gaps between a
request's consecutive text chunks (a chunk per text delta, as vLLM's benchmark_serving counts them); TPOT:
(end - first chunk) / (completion tokens - 1) per request. Exit status 1 if any request failed.
"""
import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("the a little girl boy dog cat sun tree house park ball red blue green big small happy sad day night "
         "play run jump walk look find friend mom dad bird fish water sky cloud rain snow flower garden book "
         "story time once upon there was named loved went saw said very good bad new old fast slow warm cold "
         "river hill road school cake apple toy car boat train star moon light dark sound song door window").split()


def make_prompts(args):
    rng = random.Random(args.seed)
    hi = max(args.words, args.words_max or args.words)
    with open(args.out, "w") as f:
        for i in range(args.num):
            words = rng.randint(args.words, hi)
            f.write(f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\n")
    if args.tokens_out:
        lo, hi_tokens = args.tokens
        if not 1 <= lo <= hi_tokens:
            sys.exit(f"serve_load: --tokens {lo} {hi_tokens}: need 1 <= LO <= HI")
        lengths_rng = random.Random(args.seed + 1)
        with open(args.tokens_out, "w") as f:
            for _ in range(args.num):
                f.write(f"{lengths_rng.randint(lo, hi_tokens)}\n")
    words_desc = f"{args.words}" if hi == args.words else f"{args.words}-{hi}"
    print(f"serve_load: wrote {args.num} prompts of {words_desc} words to {args.out}"
          + (f", output lengths {args.tokens[0]}-{args.tokens[1]} to {args.tokens_out}" if args.tokens_out else ""))


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def one_request(url, headers, body, timeout):
    """Streams one completion; returns its record (times in CLOCK_MONOTONIC seconds)."""
    rec = {"sent": time.monotonic(), "first": None, "end": None, "chunks": [], "tokens": 0, "prompt_tokens": 0,
           "error": None}
    conn = None
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(500).decode(errors='replace')}"
            return rec
        done = False
        while not done:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.monotonic()
            chunk = json.loads(payload)
            if "error" in chunk:
                rec["error"] = str(chunk["error"])
                break
            if any(c.get("text") for c in chunk.get("choices") or []):
                if rec["first"] is None:
                    rec["first"] = now
                rec["chunks"].append(now)
            usage = chunk.get("usage")
            if usage:
                rec["tokens"] = usage.get("completion_tokens", 0)
                rec["prompt_tokens"] = usage.get("prompt_tokens", 0)
        rec["end"] = time.monotonic()
        if not done and rec["error"] is None:
            rec["error"] = "the stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return rec


def worker(proc_index, jobs, args, start_at, out_queue):
    url = urllib.parse.urlsplit(args.base)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    bodies = []
    for index, prompt, _, max_tokens in jobs:
        body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": args.temperature,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "seed": index}
        bodies.append((index, json.dumps(body)))
    offsets = {index: offset for index, _, offset, _ in jobs}
    lock = threading.Lock()
    records = []
    pending = list(reversed(bodies))
    threads_here = max(1, min(len(bodies), math.ceil(args.concurrency / args.procs)))

    def run():
        while True:
            with lock:
                if not pending:
                    return
                index, body = pending.pop()
            wait = start_at + offsets[index] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            rec = one_request(url, headers, body, args.timeout)
            rec["index"] = index
            with lock:
                records.append(rec)

    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    threads = [threading.Thread(target=run) for _ in range(threads_here)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out_queue.put(records)


def run_load(args):
    with open(args.prompts) as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    n = args.requests or len(prompts)
    rng = random.Random(args.seed)
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        if math.isfinite(args.request_rate) and args.request_rate > 0:
            t += rng.expovariate(args.request_rate)
    lengths = [args.max_tokens] * len(prompts)
    if args.max_tokens_file:
        with open(args.max_tokens_file) as f:
            lengths = [int(line) for line in f if line.strip()]
        if len(lengths) != len(prompts) or min(lengths) < 1:
            sys.exit(f"serve_load: --max-tokens-file {args.max_tokens_file}: need one positive length per prompt "
                     f"({len(lengths)} for {len(prompts)} prompts)")
    jobs = [(i, prompts[i % len(prompts)], offsets[i], lengths[i % len(prompts)]) for i in range(n)]
    args.concurrency = min(args.concurrency, n)
    args.procs = max(1, min(args.procs, args.concurrency))
    queue = mp.Queue()
    start_at = time.monotonic() + 0.5  # every process starts sending at once
    procs = [mp.Process(target=worker, args=(p, jobs[p::args.procs], args, start_at, queue)) for p in range(args.procs)]
    for p in procs:
        p.start()
    records = []
    for _ in procs:
        records.extend(queue.get())
    for p in procs:
        p.join()

    ok = [r for r in records if r["error"] is None]
    failed = [r for r in records if r["error"] is not None]
    t0 = min(r["sent"] for r in records)
    t1 = max((r["end"] or r["sent"]) for r in records)
    wall = t1 - t0
    tokens = sum(r["tokens"] for r in ok)
    ttft = [1e3 * (r["first"] - r["sent"]) for r in ok if r["first"] is not None]
    itl = [1e3 * (b - a) for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    tpot = [1e3 * (r["end"] - r["first"]) / (r["tokens"] - 1) for r in ok if r["first"] is not None and r["tokens"] > 1]
    e2e = [r["end"] - r["sent"] for r in ok]
    result = {
        "requests": n, "completed": len(ok), "failed": len(failed), "concurrency": args.concurrency,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "max_tokens": args.max_tokens_file or args.max_tokens, "prompt_tokens_mean": (sum(r["prompt_tokens"] for r in ok) / len(ok)) if ok else 0,
        "output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
    }
    for name, values in (("ttft_ms", ttft), ("itl_ms", itl), ("tpot_ms", tpot), ("e2e_s", e2e)):
        for q in (50, 90, 99):
            result[f"{name}_p{q}"] = percentile(values, q)
        result[f"{name}_mean"] = sum(values) / len(values) if values else float("nan")
    print(f"serve_load: rate {result['request_rate']}: {len(ok)}/{n} requests, {tokens} output tokens in {wall:.2f} s: {result['output_tok_s']:.1f} tok/s; "
          f"TTFT p50/p90/p99 {result['ttft_ms_p50']:.1f}/{result['ttft_ms_p90']:.1f}/{result['ttft_ms_p99']:.1f} ms; "
          f"ITL p50/p90/p99 {result['itl_ms_p50']:.2f}/{result['itl_ms_p90']:.2f}/{result['itl_ms_p99']:.2f} ms; "
          f"TPOT p50 {result['tpot_ms_p50']:.2f} ms; e2e p50/p99 {result['e2e_s_p50']:.2f}/{result['e2e_s_p99']:.2f} s")
    for r in failed[:5]:
        print(f"serve_load: request {r['index']} failed: {r['error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write the prompts file")
    p.add_argument("--out", required=True)
    p.add_argument("--num", type=int, default=256)
    p.add_argument("--words", type=int, default=96, help="words per prompt (the least, with --words-max)")
    p.add_argument("--words-max", type=int, default=0, help="words per prompt uniform in [--words, --words-max]")
    p.add_argument("--tokens", type=int, nargs=2, default=(100, 1024), metavar=("LO", "HI"),
                   help="with --tokens-out: output lengths uniform in [LO, HI]")
    p.add_argument("--tokens-out", default="", help="write one output length per prompt here")
    p.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="run the load against a server")
    r.add_argument("--base", required=True, help="http://HOST:PORT")
    r.add_argument("--model", required=True)
    r.add_argument("--prompts", required=True)
    r.add_argument("--requests", type=int, default=0, help="requests (default: one per prompt)")
    r.add_argument("--concurrency", type=int, default=256, help="requests in flight at most")
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--max-tokens-file", default="", help="one max_tokens per prompt (overrides --max-tokens)")
    r.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second (inf: all at once)")
    r.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--procs", type=int, default=min(8, os.cpu_count() or 1), help="client processes")
    r.add_argument("--api-key", default="")
    r.add_argument("--timeout", type=float, default=3600.0, help="socket timeout per request (s)")
    r.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    if args.cmd == "prompts":
        make_prompts(args)
        return 0
    return run_load(args)


if __name__ == "__main__":
    sys.exit(main())
