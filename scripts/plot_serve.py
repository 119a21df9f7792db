#!/usr/bin/env python3
"""Latency against request rate from bench/run_serve.sh's load results (load-POLICY-RATE.json).

    python3 scripts/plot_serve.py OUT_DIR docs/serve.png [TITLE]

One panel each for TTFT, inter-token latency and end-to-end latency (p50 solid, p99 dashed) and one for the
server's output tokens per second, against the Poisson request rate, one colour per policy. The `inf` rate
(every request at once) is drawn at the right edge. Needs matplotlib.
"""
import glob
import json
import os
import re
import sys


def load(directory):
    runs = {}
    for path in glob.glob(os.path.join(directory, "load-*-*.json")):
        m = re.match(r"load-(.+)-([^-]+)\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            r = json.load(f)
        rate = float("inf") if m.group(2) == "inf" else float(m.group(2))
        runs.setdefault(m.group(1), []).append((rate, r))
    for v in runs.values():
        v.sort(key=lambda t: t[0])
    return runs


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    runs = load(sys.argv[1])
    if not runs:
        sys.exit(f"no load-*-*.json in {sys.argv[1]}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    finite = sorted({rate for v in runs.values() for rate, _ in v if rate != float("inf")})
    edge = (finite[-1] * 2) if finite else 1.0  # where 'inf' is drawn
    panels = [("TTFT (ms)", "ttft_ms"), ("inter-token latency (ms)", "itl_ms"), ("end-to-end (s)", "e2e_s")]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for k, (policy, points) in enumerate(sorted(runs.items())):
        colour = f"C{k}"
        xs = [edge if rate == float("inf") else rate for rate, _ in points]
        for ax, (title, key) in zip(axes, panels):
            ax.plot(xs, [r[f"{key}_p50"] for _, r in points], "o-", color=colour, label=f"{policy} p50")
            ax.plot(xs, [r[f"{key}_p99"] for _, r in points], "o--", color=colour, label=f"{policy} p99")
            ax.set_title(title)
        axes[3].plot(xs, [r["output_tok_s"] for _, r in points], "o-", color=colour, label=policy)
        axes[3].set_title("server output tok/s")
    ticks = finite + [edge]
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in finite] + ["all at once"])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # log-scale minor labels collide with ours
        ax.set_xlabel("request rate (requests/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if len(sys.argv) == 4:
        fig.suptitle(sys.argv[3])
        fig.tight_layout(rect=(0, 0, 1, 0.93))
    else:
        fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
