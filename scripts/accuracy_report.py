#!/usr/bin/env python3
"""Tables, plot and lost-answer analysis of a `zipage-eval accuracy` run (docs/accuracy.md, issue 11).

    python3 scripts/accuracy_report.py docs/accuracy.jsonl --data-dir data/reasoning \
        --plot docs/accuracy.png > /tmp/report.md

Reads the JSON lines that `zipage-eval accuracy --json-out` writes (one per policy and budget cell, full KV
first, one run per test-set file) and prints, per test set:
  * the table: pass@1 with its 95% CI, % of full KV, greedy pass@1, trace tokens, tokens evicted, tok/s;
  * where the lost answers go wrong: for every problem full KV solves greedily and a policy does not, the
    first token where the policy's greedy output leaves full KV's (`lost_answers` in the JSON). Because full
    KV's greedy output of a solved problem is the reference trace (the shipped model writes it exactly),
    that token is classified by what it writes in the reference trace (a step line's counter, node, weight,
    new sum or successor, a walk header, a result line, the answer line), and its distance from the
    request's first compression is given (the engine compresses when the sequence reaches the budget plus
    one block, so the first compression happens after trace token budget + block - prompt - 1).
--plot draws pass@1 (with its CI) against the budget as a fraction of the mean sequence, one line per
policy, one panel per test set (needs matplotlib).
"""
import argparse
import collections
import json
import os
import re
import statistics
import sys

STEP = re.compile(r"^(\d+) ([a-z]{2})\+(\d)=(\d)>([a-z]{2})$")


def field_of(trace, k):
    """What the reference trace writes at character k: (kind, field)."""
    start = trace.rfind("\n", 0, k) + 1
    end = trace.find("\n", k)
    end = len(trace) if end < 0 else end
    line, col = trace[start:end], k - start
    if k == end:
        return "newline"
    if line.startswith("####"):
        return "answer line"
    if re.match(r"^w\d+=", line):
        return "result line"
    if re.match(r"^w\d+:", line):
        return "walk header" + (" (recalled result)" if "s=w" in line and col >= line.find("s=w") else "")
    m = STEP.match(line)
    if not m:
        return "other"
    # columns of the fields: counter, ' ', node, '+', weight, '=', sum, '>', successor
    bounds = [("counter", m.end(1)), ("node", m.end(2)), ("weight", m.end(3)), ("new sum", m.end(4)),
              ("successor", m.end(5))]
    for name, e in bounds:
        if col < e:
            return "step: " + name
    return "step: other"


def load(path):
    runs = collections.OrderedDict()
    for line in open(path):
        d = json.loads(line)
        runs.setdefault(d["data"], []).append(d)
    return runs


def fmt_ci(ci):
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def table(rows):
    out = ["| policy | budget | pass@1 | 95% CI | % of full KV | greedy | 95% CI | trace tokens | evicted/request | tok/s |",
           "|---|---:|---:|---|---:|---:|---|---:|---:|---:|"]
    for d in rows:
        b = "full" if d["budget"] is None else f"{d['budget']} ({d['budget_fraction']:g})"
        out.append(f"| {d['policy']} | {b} | {d['pass_at_1']:.3f} | {fmt_ci(d['pass_at_1_ci'])} | "
                   f"{d['pct_of_full_kv']:.1f}% | {d['greedy_pass_at_1']:.3f} | {fmt_ci(d['greedy_ci'])} | "
                   f"{d['mean_trace_tokens']:.0f} | {d['tokens_evicted_per_request']:.0f} | "
                   f"{d['throughput_tok_s']:,.0f} |")
    return "\n".join(out)


def lost_answers(rows, problems):
    out = ["| policy | budget | lost | first compression (trace token, median) | divergence (median) | "
           "divergence - first compression (median) | what the diverging token writes (top 3) |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for d in rows:
        la = d.get("lost_answers") or []
        if not la or d["budget"] is None:
            continue
        firsts, gaps, kinds = [], [], collections.Counter()
        for x in la:
            p = problems.get(x["id"])
            if p is None:
                continue
            first = d["budget"] + d["block_size"] - (p["prompt_tokens"] + 1) - 1
            firsts.append(first)
            gaps.append(x["diverge_token"] - first)
            kinds[field_of(p["trace"], x["diverge_token"])] += 1
        if not gaps:
            continue
        top = ", ".join(f"{k} {v}" for k, v in kinds.most_common(3))
        out.append(f"| {d['policy']} | {d['budget']} | {len(la)} | {statistics.median(firsts):.0f} | "
                   f"{statistics.median(x['diverge_token'] for x in la):.0f} | {statistics.median(gaps):.0f} | "
                   f"{top} |")
    return "\n".join(out)


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), squeeze=False)
    for ax, (data, rows) in zip(axes[0], runs.items()):
        full = next((d for d in rows if d["budget"] is None), None)
        by = collections.defaultdict(list)
        for d in rows:
            if d["budget"] is not None:
                by[d["policy"]].append(d)
        for pol, ds in by.items():
            ds.sort(key=lambda d: d["budget_fraction"])
            x = [d["budget_fraction"] for d in ds]
            y = [d["pass_at_1"] for d in ds]
            lo = [d["pass_at_1"] - d["pass_at_1_ci"][0] for d in ds]
            hi = [d["pass_at_1_ci"][1] - d["pass_at_1"] for d in ds]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=pol)
        if full:
            ax.axhline(full["pass_at_1"], color="black", linestyle="--", label="full_kv")
        ax.set_xscale("log", base=2)
        ax.set_xticks([0.125, 0.25, 0.5])
        ax.set_xticklabels(["1/8", "1/4", "1/2"])
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("KV budget / mean sequence length")
        ax.set_ylabel("pass@1")
        ax.set_title(os.path.basename(data))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--data-dir", default=None, help="where the test sets are (default: the paths in the JSON)")
    ap.add_argument("--plot", default=None, help="write the plot to this PNG")
    args = ap.parse_args()
    runs = load(args.jsonl)
    for data, rows in runs.items():
        path = os.path.join(args.data_dir, os.path.basename(data)) if args.data_dir else data
        problems = {}
        if os.path.exists(path):
            for line in open(path):
                p = json.loads(line)
                problems[p["id"]] = p
        print(f"### {os.path.basename(data)}\n")
        print(table(rows) + "\n")
        if problems:
            print(lost_answers(rows, problems) + "\n")
    if args.plot:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
