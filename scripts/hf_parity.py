#!/usr/bin/env python3
"""Parity of zipage's CPU backend with Hugging Face transformers on random-initialised checkpoints.

For Qwen3, Qwen2 and Llama (plus Llama with Llama 3.1 RoPE scaling) this script
  1. builds a model with transformers from a config (a small one, and one of Qwen3-0.6B's shape),
     re-initialises every parameter at random (norm weights and biases too, so each is exercised),
     and saves it with save_pretrained (safetensors; the 0.6B shape sharded, to exercise the index);
  2. runs transformers in fp32 on the CPU (eager attention): logits at every prompt position, and 64
     greedy steps with the KV cache;
  3. runs zipage-logits (examples/tools/zipage_logits.cpp) on the saved directory: zipage's CPU backend,
     fp32, full KV, greedy through the engine;
  4. compares: max |Δlogit| over all positions relative to max |logit| must stay under the case's
     tolerance (1e-4 for the small configs, 1e-3 for the 28-layer 0.6B shape), and the greedy tokens must
     agree for all steps — or, where they part, transformers' own logits must show a near-tie there (its
     two candidates within 10x the measured logit error), which fp32 rounding may break either way.

Needs PyTorch and transformers (tested with torch 2.11, transformers 5.17); no network. Usage:
  cmake -S . -B build -DZIPAGE_ENABLE_CUDA=OFF && cmake --build build -j --target zipage-logits
  python3 scripts/hf_parity.py --zipage-logits build/examples/zipage-logits            # every case
  python3 scripts/hf_parity.py --zipage-logits build/examples/zipage-logits --cases qwen3-small,llama3-small
Exit status 0 when every case passes; a table of the errors is printed either way.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6)
QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=3072, vocab_size=151936, max_position_embeddings=40960,
                 bos_token_id=151643, eos_token_id=151645, rms_norm_eps=1e-6)

# name: (config class, base shape, extra config fields, rope theta, rope scaling, logits tolerance, tied)
CASES = {
    "qwen3-small": ("Qwen3Config", SMALL, dict(head_dim=32), 1e6, None, 1e-4, True),
    "qwen2-small": ("Qwen2Config", SMALL, {}, 1e4, None, 1e-4, False),
    "llama-small": ("LlamaConfig", SMALL, {}, 1e4, None, 1e-4, False),
    # Original context 64 so that the prompts and the greedy steps reach every regime of the scaling.
    "llama3-small": ("LlamaConfig", SMALL, {}, 5e5,
                     dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64), 1e-4, False),
    "qwen3-0.6b": ("Qwen3Config", QWEN3_06B, dict(head_dim=128), 1e6, None, 1e-3, True),
    "qwen2-0.6b": ("Qwen2Config", QWEN3_06B, {}, 1e4, None, 1e-3, False),
    "llama-0.6b": ("LlamaConfig", QWEN3_06B, {}, 5e5,
                   dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192), 1e-3, False),
}


def make_config(name):
    cls_name, shape, extra, theta, scaling, _, tied = CASES[name]
    kwargs = dict(shape, **extra, tie_word_embeddings=tied, hidden_act="silu", use_cache=True)
    if TRANSFORMERS_5:
        params = dict(rope_type="default", rope_theta=theta)
        if scaling:
            params.update(scaling)
        kwargs["rope_parameters"] = params
    else:
        kwargs["rope_theta"] = theta
        if scaling:
            kwargs["rope_scaling"] = scaling
    return getattr(transformers, cls_name)(**kwargs)


@torch.no_grad()
def randomise(model, seed):
    """Every parameter at random, scaled so activations stay O(1) and logits are well separated."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:  # [out][in] projections and lm_head
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


@torch.no_grad()
def hf_reference(model, prompt, steps):
    ids = torch.tensor([prompt])
    out = model(ids, use_cache=True)
    logits = out.logits[0].float()
    past = out.past_key_values
    greedy, step_logits = [], []
    last = out.logits[0, -1].float()
    for _ in range(steps):
        step_logits.append(last)
        tok = int(torch.argmax(last))
        greedy.append(tok)
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].float()
    return logits, greedy, step_logits


def run_case(name, exe, steps, workdir, seed):
    cfg = make_config(name)
    tol = CASES[name][5]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    model.eval()
    randomise(model, seed)
    path = os.path.join(workdir, name)
    big = cfg.num_hidden_layers > 2
    model.save_pretrained(path, safe_serialization=True, max_shard_size="500MB" if big else "5GB")

    gen = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist() for n in (7, 33)]
    t0 = time.time()
    hf = [hf_reference(model, p, steps) for p in prompts]
    t_hf = time.time() - t0

    cmd = [exe, "--model", path, "--all-positions", "--steps", str(steps)]
    for p in prompts:
        cmd += ["--tokens", ",".join(map(str, p))]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True)
    t_z = time.time() - t0
    if res.returncode != 0:
        return dict(name=name, ok=False, note="zipage-logits failed: " + res.stderr.strip()[-500:])
    z = json.loads(res.stdout)

    max_abs, max_logit = 0.0, 0.0
    for (hf_logits, _, _), zp in zip(hf, z["prompts"]):
        zl = torch.tensor(zp["logits"], dtype=torch.float32)
        if zl.shape != hf_logits.shape:
            return dict(name=name, ok=False, note=f"logits shape {tuple(zl.shape)} vs {tuple(hf_logits.shape)}")
        max_abs = max(max_abs, float((zl - hf_logits).abs().max()))
        max_logit = max(max_logit, float(hf_logits.abs().max()))
    rel = max_abs / max_logit
    ok = rel <= tol
    notes = []
    tie_tol = 10 * max_abs + 1e-6
    agree_steps = []
    for i, ((_, hf_greedy, hf_steps), zp) in enumerate(zip(hf, z["prompts"])):
        zg = zp["greedy"]
        k = next((j for j in range(steps) if zg[j] != hf_greedy[j]), steps)
        agree_steps.append(k)
        if k < steps:
            lg = hf_steps[k]
            gap = float(lg[hf_greedy[k]] - lg[zg[k]])
            if gap <= tie_tol:
                notes.append(f"prompt {i}: parted at step {k} on a near-tie (gap {gap:.2e} <= {tie_tol:.2e})")
            else:
                ok = False
                notes.append(f"prompt {i}: greedy differs at step {k}: hf {hf_greedy[k]} vs zipage {zg[k]}, "
                             f"gap {gap:.3e} > {tie_tol:.3e}")
    return dict(name=name, ok=ok, max_abs=max_abs, max_logit=max_logit, rel=rel, tol=tol,
                agree=agree_steps, steps=steps, t_hf=t_hf, t_zipage=t_z, note="; ".join(notes))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zipage-logits", required=True, help="path to the zipage-logits executable")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    ap.add_argument("--steps", type=int, default=64, help="greedy steps per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="save the checkpoints under this directory instead of a temporary one")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    for n in names:
        if n not in CASES:
            ap.error(f"unknown case '{n}'")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; fp32 on the CPU, eager attention")
    results = []
    with tempfile.TemporaryDirectory(prefix="zipage_parity_") as tmp:
        workdir = args.keep or tmp
        os.makedirs(workdir, exist_ok=True)
        for i, n in enumerate(names):
            r = run_case(n, args.zipage_logits, args.steps, workdir, args.seed + 100 * i)
            results.append(r)
            status = "PASS" if r["ok"] else "FAIL"
            if "rel" in r:
                print(f"{status} {n:14s} max|Δlogit| {r['max_abs']:.3e} / max|logit| {r['max_logit']:.3e} = "
                      f"{r['rel']:.2e} (tol {r['tol']:.0e}); greedy agrees for {r['agree']} of {r['steps']} steps; "
                      f"hf {r['t_hf']:.1f}s zipage {r['t_zipage']:.1f}s" + (f"; {r['note']}" if r["note"] else ""),
                      flush=True)
            else:
                print(f"{status} {n:14s} {r['note']}", flush=True)
    failed = [r["name"] for r in results if not r["ok"]]
    print("all cases pass" if not failed else "failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
