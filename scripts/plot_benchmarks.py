#!/usr/bin/env python3
"""Bar chart of throughput by workload and mode from zipage-bench / hf_peer_bench.py JSON lines.

    python3 scripts/plot_benchmarks.py bench.jsonl docs/benchmarks.png

Each zipage-bench line gives shape, workload, mode and tok/s (the bar); a time-boxed run also gets a black
tick at its steady-state tok/s (the box's second half). A transformers peer line (key "peer") is drawn as
its own bar. Needs matplotlib (present on the GPU machine's image).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(r):
    if "peer" in r:
        return f"transformers generate_batch\n{r['requests']} req, {r['prompt_tokens'] // max(r['requests'], 1)}->+{r['output_tokens'] // max(r['requests'], 1)}"
    what = f"{r['requests']} req"
    if r.get("finished") == r["requests"] and r["workload"] == "long":
        what += f", {r['output_tokens'] // r['requests']} out each"
    elif r.get("finished", 0) < r["requests"]:
        what += f", {r['seconds']:.0f} s box"
    if r.get("graphs") is False:
        what += ", no graphs"
    if r.get("prompt_len", 128) not in (0, 128):  # long-workload runs since 2026-12-04 record it (128: the default)
        what += f", {r['prompt_len']}-token prompts"
    # Storage formats (runs since issue 14 record them): KV cache and linear weights, and the nano-batch overlap.
    kv = {"fp8_e4m3": "FP8"}.get(r.get("kv_cache_dtype", "auto"), "bf16")
    weights = "FP8" if r.get("quantization") in ("fp8", "fp8_e4m3") else "bf16"
    if "kv_cache_dtype" in r:
        what += f"\nKV {kv}, weights {weights}"
    if r.get("nano_batch_steps"):
        what += ", 2 nano-batches"
    if r.get("fused_projections") is False:  # runs since the fused q|k|v, gate|up projections record it
        what += ", unfused"
    return f"{r['shape']} {r['workload']}, {r['mode']}\n{what}"


def main(src, dst):
    rows = [json.loads(line) for line in open(src) if line.strip().startswith("{")]
    if not rows:
        sys.exit(f"plot_benchmarks: no results in {src}")
    colors = {"full": "#4c72b0", "compressed": "#dd8452"}
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.5))
    for i, r in enumerate(rows):
        color = "#8c8c8c" if "peer" in r else colors.get(r.get("mode"), "#55a868")
        ax.bar(i, r["tok_s"], color=color)
        ax.text(i, r["tok_s"], f"{r['tok_s']:,.0f}", ha="center", va="bottom", fontsize=8)
        if "peer" not in r and r.get("finished", 0) < r["requests"] and r.get("steady_tok_s"):
            ax.plot([i - 0.35, i + 0.35], [r["steady_tok_s"]] * 2, color="black", linewidth=2)
            ax.text(i + 0.38, r["steady_tok_s"], f"steady {r['steady_tok_s']:,.0f}", va="center", fontsize=6)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([label(r) for r in rows], fontsize=7, rotation=20, ha="right")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Zipage on one H200: throughput by workload and mode (bf16 unless marked FP8)", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"plot_benchmarks: {len(rows)} bars -> {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
