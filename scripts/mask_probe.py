#!/usr/bin/env python3
"""What a reasoner checkpoint needs to keep: teacher-forced decoding of test problems with an attention mask
that hides part of the context, instead of evicting it (docs/accuracy.md, "Where the lost answers go wrong").

Each query sees, besides itself, only what the mask keeps:
  full                   everything before it (the baseline: 0 errors for a problem the model solves);
  prompt+recent          the whole prompt (the complete node table) and the last R tokens;
  prompt+headers+recent  also every walk header, result and answer line of the trace;
  sink+recent            the first 4 tokens and the last R tokens (StreamingLLM's shape).
Prints per mask: problems written exactly, the token error rate on the trace, and the first wrong trace
position per problem (-1: none). fp32 on the CPU with the training script's own model.

    python3 scripts/mask_probe.py --model models/reasoner --data data/reasoning/L1.jsonl --problems 4 \
        --recent 256 --masks full,prompt+recent,sink+recent
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_reasoner as tr  # noqa: E402

MASKS = ("full", "prompt+recent", "prompt+headers+recent", "sink+recent")


def header_positions(trace, start, total):
    """[total] bool: tokens of the trace's walk header, result and answer lines."""
    keep = torch.zeros(total, dtype=torch.bool)
    pos = 0
    for line in trace.split("\n"):
        if line.startswith("w") or line.startswith("#"):
            keep[start + pos:start + pos + len(line) + 1] = True
        pos += len(line) + 1
    return keep


def probe(model, problem, kind, recent):
    ids, start = tr.problem_ids(problem)
    x = torch.tensor(ids[:-1])[None]
    y = torch.tensor(ids[1:])
    t = x.shape[1]
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    mask = j <= i
    if kind == "prompt+recent":
        mask &= (j < start) | (i - j < recent)
    elif kind == "prompt+headers+recent":
        mask &= (j < start) | (i - j < recent) | header_positions(problem["trace"], start, t)[None, :]
    elif kind == "sink+recent":
        mask &= (j < 4) | (i - j < recent)
    with torch.no_grad():
        pred = model(x, mask=mask[None, None])[0].argmax(-1)
    on_trace = torch.arange(t) >= start - 1
    wrong = (pred != y) & on_trace
    first = int(torch.nonzero(wrong)[0]) - start + 1 if wrong.any() else -1
    return int(wrong.sum()), int(on_trace.sum()), first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/reasoner")
    ap.add_argument("--data", default="data/reasoning/L1.jsonl")
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--recent", type=int, default=256, help="R: recent tokens every mask but 'full' keeps")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    masks = [m for m in args.masks.split(",") if m]
    bad = [m for m in masks if m not in MASKS]
    if bad:
        ap.error(f"--masks: unknown {bad}; choose from {', '.join(MASKS)}")
    torch.set_num_threads(args.threads)
    model = tr.load_checkpoint(args.model)
    with open(args.data) as f:
        problems = [json.loads(line) for line in f][:args.problems]
    for kind in masks:
        errors = tokens = exact = 0
        firsts = []
        for p in problems:
            w, n, first = probe(model, p, kind, args.recent)
            errors, tokens, exact = errors + w, tokens + n, exact + (w == 0)
            firsts.append(first)
        print(f"{os.path.basename(args.data)} R={args.recent} {kind:22s} exact {exact}/{len(problems)} "
              f"token error {errors / max(tokens, 1):.2e} first wrong trace position {firsts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
