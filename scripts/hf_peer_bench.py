#!/usr/bin/env python3
"""Peer throughput for zipage-bench: Hugging Face transformers' continuous batching
(`model.generate_batch(...)`, paged SDPA attention) on a random-initialised Qwen3-0.6B-shaped model in
bf16 on one GPU.

Workload (as zipage-bench's `long` workload with a fixed output length): N requests of `--prompt-len`
random token ids in [0, 10000), greedy, `--output-len` new tokens each (EOS is the last vocabulary id,
which a random model practically never emits; generated tokens are counted, not assumed). All requests
are submitted at once. generate_batch takes one GenerationConfig, so per-request output lengths (the
nano-vllm workload) are not expressible here.

Timed: one generate_batch call over all requests, after a small warm-up call (CUDA graphs / kernels).
Prints one JSON line (and appends it to --json when given).

  python3 scripts/hf_peer_bench.py --num-requests 256 --prompt-len 128 --output-len 256
"""
import argparse
import json
import random
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config


def qwen3_06b_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=151935,
        pad_token_id=0,
    )


def build(cfg, attn):
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=attn)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation=attn)
    return model.to(dtype=torch.bfloat16).eval()


def generate(model, inputs, max_new_tokens, eos):
    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    try:
        return model.generate_batch(inputs=inputs, generation_config=gen, progress_bar=False)
    except TypeError:
        return model.generate_batch(inputs=inputs, generation_config=gen)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="", help="attention implementation to try first")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = qwen3_06b_config()
    inputs = [[rng.randrange(10000) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    warm = [[rng.randrange(10000) for _ in range(args.prompt_len)] for _ in range(4)]

    # transformers 5.17 spells paged SDPA "paged|sdpa" ("sdpa_paged" is refused there).
    candidates = [a for a in [args.attn, "paged|sdpa", "sdpa_paged", "sdpa"] if a]
    errors = []
    for attn in candidates:
        try:
            model = build(cfg, attn)
            t0 = time.perf_counter()
            generate(model, warm, 8, cfg.eos_token_id)
            torch.cuda.synchronize()
            warm_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = generate(model, inputs, args.output_len, cfg.eos_token_id)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        except Exception as e:  # try the next implementation name
            errors.append(f"{attn}: {type(e).__name__}: {e}")
            print(f"hf_peer_bench: attn_implementation {attn!r} failed: {errors[-1]}", file=sys.stderr, flush=True)
            try:
                del model
            except NameError:
                pass
            torch.cuda.empty_cache()
            continue
        outputs = list(out.values()) if isinstance(out, dict) else list(out)
        generated = sum(len(o.generated_tokens) for o in outputs)
        result = {
            "peer": "transformers.generate_batch",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0),
            "attn_implementation": getattr(model.config, "_attn_implementation", attn),
            "requested_attn": attn,
            "requests": args.num_requests,
            "finished": len(outputs),
            "prompt_tokens": args.num_requests * args.prompt_len,
            "output_tokens": generated,
            "seconds": round(seconds, 3),
            "warmup_seconds": round(warm_s, 3),
            "tok_s": round(generated / seconds, 1),
            "total_tok_s": round((generated + args.num_requests * args.prompt_len) / seconds, 1),
        }
        line = json.dumps(result)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        return 0
    print("hf_peer_bench: no attention implementation worked:\n  " + "\n  ".join(errors), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
