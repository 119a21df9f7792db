#!/usr/bin/env python3
"""Parity of the reasoning model (scripts/train_reasoner.py) across implementations, in fp32 on the CPU:

  * the training script's own PyTorch model, loaded back from the exported checkpoint (safetensors read
    by its stdlib reader) — the reference here;
  * zipage's CPU backend through zipage-logits (examples/tools/zipage_logits.cpp): fp32 logits at the
    last prompt position (--all-positions: every position) and the greedy continuation through the engine
    (full KV, EOS ignored);
  * with --transformers (needs transformers, e.g. on the GPU machine): AutoModelForCausalLM (eager, fp32)
    on the same directory, and AutoTokenizer's ids for the prompts (BOS + one token a byte) and decoding.

Prompts: the first --prompts problems of --data (their prompt text, BOS first), cut to --max-prompt
tokens. Pass criteria as scripts/hf_parity.py: max |Δlogit| / max |logit| under --tol, greedy tokens equal
for all --steps, or parting only on a near-tie (reference's two candidates within 10x the logit error).

--random builds a model with random weights (norm weights too, scaled so logits are well separated) of
the training script's default shape (or --smoke's) and exports it to a temporary directory, in fp32 and
bf16, instead of reading --model: a check of the export path independent of training.

Usage:
  cmake -S . -B build-h1 -DZIPAGE_ENABLE_CUDA=OFF -DZIPAGE_BUILD_BENCH=OFF && cmake --build build-h1 --target zipage-logits
  /usr/bin/python3 scripts/reasoner_parity.py --zipage-logits build-h1/examples/zipage-logits --model /tmp/reasoner-smoke
  /usr/bin/python3 scripts/reasoner_parity.py --zipage-logits build-h1/examples/zipage-logits --random
  python3 scripts/reasoner_parity.py --zipage-logits build/examples/zipage-logits --model models/reasoner --transformers
Exit status 0 when every comparison passes.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_reasoner as tr  # noqa: E402


@torch.no_grad()
def reference(model, prompts, steps, all_positions):
    """Our model, fp32: logits (last or every position) and greedy steps (EOS ignored, as zipage-logits),
    with the logits of each step (for near-tie judgement)."""
    res = []
    for p in prompts:
        ids = torch.tensor([p])
        logits = model(ids)[0].float()
        rows = logits if all_positions else logits[-1:]
        outs = tr.greedy(model, [p], steps, stop_eos=False)[0]
        # logits along the greedy path, from one pass over prompt + greedy tokens
        full = model(torch.tensor([p + outs]))[0].float()
        step_logits = [full[len(p) - 1 + i] for i in range(steps)]
        res.append((rows, outs, step_logits))
    return res


def compare(name, ref, other, steps, tol):
    """ref: [(logits rows, greedy, step logits)], other: [(logits rows, greedy)]. Returns (ok, line)."""
    max_abs = max_logit = 0.0
    for (rl, _, _), (ol, _) in zip(ref, other):
        ol = torch.as_tensor(ol, dtype=torch.float32)
        if ol.shape != rl.shape:
            return False, f"FAIL {name}: logits shape {tuple(ol.shape)} vs {tuple(rl.shape)}"
        max_abs = max(max_abs, float((ol - rl).abs().max()))
        max_logit = max(max_logit, float(rl.abs().max()))
    rel = max_abs / max(max_logit, 1e-30)
    ok = rel <= tol
    notes, agree = [], []
    tie_tol = 10 * max_abs + 1e-6
    for i, ((_, rg, rsteps), (_, og)) in enumerate(zip(ref, other)):
        k = next((j for j in range(steps) if og[j] != rg[j]), steps)
        agree.append(k)
        if k < steps:
            gap = float(rsteps[k][rg[k]] - rsteps[k][og[k]])
            if gap <= tie_tol:
                notes.append(f"prompt {i}: parted at step {k} on a near-tie (gap {gap:.2e})")
            else:
                ok = False
                notes.append(f"prompt {i}: greedy differs at step {k}: {rg[k]} vs {og[k]}, gap {gap:.2e}")
    line = (f"{'PASS' if ok else 'FAIL'} {name}: max|Δlogit| {max_abs:.3e} / max|logit| {max_logit:.3e} = {rel:.2e} "
            f"(tol {tol:.0e}); greedy agrees for {agree} of {steps} steps" + (f"; {'; '.join(notes)}" if notes else ""))
    return ok, line


def run_zipage(exe, path, prompts, steps, all_positions):
    cmd = [exe, "--model", path, "--steps", str(steps)]
    if all_positions:
        cmd.append("--all-positions")
    for p in prompts:
        cmd += ["--tokens", ",".join(map(str, p))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("zipage-logits failed: " + r.stderr.strip()[-800:])
    z = json.loads(r.stdout)
    return [(zp["logits"], zp["greedy"]) for zp in z["prompts"]]


@torch.no_grad()
def run_transformers(path, prompts, texts, steps, all_positions):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    notes = []
    tok = AutoTokenizer.from_pretrained(path)
    tok_ok = True
    for text, p in zip(texts, prompts):
        ids = tok(text)["input_ids"]
        if ids != tr.encode(text)[:len(ids)] or len(ids) != len(tr.encode(text)):
            tok_ok = False
            notes.append(f"tokenizer: {ids[:12]}... vs ours {tr.encode(text)[:12]}...")
        if tok.decode(ids, skip_special_tokens=True) != text:
            tok_ok = False
            notes.append("tokenizer: decode(encode(text)) != text")
    if tok.eos_token_id != tr.EOS_ID or tok.bos_token_id != tr.BOS_ID:
        tok_ok = False
        notes.append(f"tokenizer: bos/eos {tok.bos_token_id}/{tok.eos_token_id}")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        o = model(ids, use_cache=True)
        logits = o.logits[0].float()
        rows = logits if all_positions else logits[-1:]
        past, last, greedy = o.past_key_values, o.logits[0, -1], []
        for _ in range(steps):
            t = int(torch.argmax(last))
            greedy.append(t)
            o = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past, last = o.past_key_values, o.logits[0, -1]
        out.append((rows, greedy))
    return out, tok_ok, notes


@torch.no_grad()
def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zipage-logits", help="path to the zipage-logits executable")
    ap.add_argument("--model", help="checkpoint directory (from train_reasoner.py)")
    ap.add_argument("--random", action="store_true", help="random weights of the default shape, exported here")
    ap.add_argument("--smoke-shape", action="store_true", help="with --random: the --smoke shape")
    ap.add_argument("--transformers", action="store_true", help="also compare with transformers")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                    "reasoning", "L1.jsonl"))
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-prompt", type=int, default=400, help="prompt tokens at most (cut at the end)")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--all-positions", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.model and not args.random:
        ap.error("--model or --random")
    if not args.zipage_logits and not args.transformers:
        ap.error("nothing to compare with: --zipage-logits and/or --transformers")
    torch.manual_seed(args.seed)
    texts = []
    with open(args.data) as f:
        for line in f:
            texts.append(json.loads(line)["prompt"][:args.max_prompt - 1])
            if len(texts) == args.prompts:
                break
    prompts = [tr.encode(t) for t in texts]
    print(f"torch {torch.__version__}; {len(prompts)} prompts of {[len(p) for p in prompts]} tokens, "
          f"{args.steps} greedy steps; fp32 on the CPU")

    results = []
    with tempfile.TemporaryDirectory(prefix="reasoner_parity_") as tmp:
        dirs = []
        if args.random:
            c = tr.Config(128, 2, 2, 1, 64, 256) if args.smoke_shape else tr.Config()
            model = tr.Qwen3(c)
            randomise(model, args.seed)
            for dt in ("float32", "bfloat16"):
                d = os.path.join(tmp, dt)
                m = model
                if dt == "bfloat16":  # the reference then holds the rounded weights, as the file does
                    m = tr.Qwen3(c)
                    m.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
                tr.export(m, d, dt, tr.GENERATION_CONFIG)
                dirs.append((f"random {dt}", d))
        else:
            dirs.append((os.path.basename(os.path.normpath(args.model)), args.model))
        for name, d in dirs:
            ours = tr.load_checkpoint(d).float()
            ref = reference(ours, prompts, args.steps, args.all_positions)
            print(f"{name}: our greedy (prompt 0): {tr.decode(ref[0][1])!r}")
            if args.zipage_logits:
                try:
                    z = run_zipage(args.zipage_logits, d, prompts, args.steps, args.all_positions)
                    results.append(compare(f"{name}: zipage-logits vs ours", ref, z, args.steps, args.tol))
                except RuntimeError as e:
                    results.append((False, f"FAIL {name}: {e}"))
            if args.transformers:
                h, tok_ok, notes = run_transformers(d, prompts, texts, args.steps, args.all_positions)
                results.append(compare(f"{name}: transformers vs ours", ref, h, args.steps, args.tol))
                results.append((tok_ok, f"{'PASS' if tok_ok else 'FAIL'} {name}: transformers tokenizer "
                                        f"(BOS + bytes, decode round trip, bos/eos ids)" +
                                (f": {'; '.join(notes)}" if notes else "")))
            for ok, line in results[-3:] if args.transformers else results[-1:]:
                print(line, flush=True)
    failed = [line for ok, line in results if not ok]
    print("all comparisons pass" if not failed else f"{len(failed)} comparison(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
