#!/usr/bin/env python3
"""Synthetic long-reasoning task for Zipage's accuracy testbed (issue 11): branching table walks.

Stdlib only; deterministic from a seed; one character = one token (the task's tokenizer is byte level).

The problem (prompt, 100-1,000 characters):

    nodes:
    ab=7>cd,fg          node ab: weight 7; next node cd when the running sum is even, fg when odd
    ...                 (N nodes, two-letter names, weights 0-9, successors two random permutations)
    walks:
    w1:ab*35            walk 1: start at ab, 35 steps, running sum starts at 0
    w2:kq*42+w1         walk 2: start at kq, 42 steps, running sum starts at the result of walk 1
    ...

One step at node x with running sum s: s = (s + weight(x)) mod 10, then go to the first successor of x if
s is even, else to the second. The result of a walk is s after its last step. The answer is the results
of all walks in order, each with its key, e.g. "w1=5 w2=3 w3=8".

The reference trace (1k-8k characters) writes every step out, one line each:

    w1: ab*35 s=0       walk header (copied from the prompt; s = 0 or the recalled earlier result)
    01 ab+7=7>fg        step counter, node, +weight, =new sum, >next node
    02 fg+3=0>kq
    ...
    35 pe+2=5>ab
    w1=5                the walk's result
    w2: kq*42 s=w1=5    a later walk recalls an earlier result
    ...
    #### w1=5 w2=3      all results, each after its key

A walk's result is only ever written or read right after its key `wK=` (the result line, a later walk's
recall, the answer), and `wK=` appears nowhere else (the prompt's walk lines use `wK:`): every read of a
result is "the digit after the last `wK=`", the same kind of keyed look-up as a node's weight. (Version 1
of the task wrote the prompt's walk lines as `wK=...` and the answer as bare digits, "#### 53": a model
trained on it learnt every step but not these reads, which are a few tokens per problem; see
data/reasoning/README.md.)

What each step needs, and how far back it lies (the point of the task):
  * local (the previous line): the current node name, the running sum, the step counter;
  * far, every step: the node's weight and its chosen successor from the node table in the prompt, or from
    the last time the walk passed that node (the weight) / passed it with the same parity (the successor).
    With N nodes a node comes back about every N steps (N x 13 tokens), and its first visit reads the prompt,
    up to the whole trace back. The table is read throughout the trace: a cache that keeps only the first
    tokens and the most recent ones (StreamingLLM) loses it as soon as the trace outgrows the window;
  * far, once per walk: the walk's start node and length (prompt), the recalled result of an earlier walk
    (written up to several thousand tokens before), and at the end every walk's result for the answer.
`--analyse` prints the distribution of these read distances per level, and the largest share of problems a
recency-only cache of B tokens could still solve (every read within B - 4 tokens back), for B = 1/2, 1/4
and 1/8 of the mean sequence length.

Output: JSONL, one problem per line (the contract with `zipage-eval accuracy`):
  {"id": "L2-00017", "level": "L2", "prompt": ..., "answer": ..., "trace": ..., "prompt_tokens": n,
   "trace_tokens": n}
The model is fed `prompt` as raw text (BOS first) and must write the trace and then EOS; the answer is the
text after the last '####' of the output, stripped, up to the end of that line.

Usage:
  python3 scripts/reasoning_task.py --level L2 --count 500 --seed 1 --out data/reasoning/L2.jsonl
  python3 scripts/reasoning_task.py --level L3 --count 200 --seed 1 --self-test --analyse
  python3 scripts/reasoning_task.py --check data/reasoning/L1.jsonl   # re-verify a file (traces, lengths)
  python3 scripts/reasoning_task.py --nodes 80 --walks 4-6 --steps 50-90 --trace-len 3000-8000 ...  # custom
"""
import argparse
import json
import random
import string
import sys

# Level parameters: nodes in the table, walks per problem, steps per walk, accepted trace length
# (characters = tokens, inclusive), accepted prompt length.
LEVELS = {
    "L1": dict(nodes=24, walks=(2, 3), steps=(25, 45), trace_len=(800, 1600), prompt_len=(100, 1000)),
    "L2": dict(nodes=40, walks=(3, 5), steps=(40, 70), trace_len=(2000, 4000), prompt_len=(100, 1000)),
    "L3": dict(nodes=64, walks=(5, 8), steps=(60, 99), trace_len=(4000, 8000), prompt_len=(100, 1000)),
}

NAMES = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]


def make_problem(rng, nodes, walks, steps):
    """A random instance: (table {name: (weight, even_next, odd_next)}, node order, walk specs)."""
    names = rng.sample(NAMES, nodes)
    # The successors are two permutations of the nodes (no node its own successor, the two successors of a
    # node distinct): then a step is a bijection on the states (node, sum), a walk lies on a random
    # permutation's cycle of up to 10 N states, and nodes come back about every N steps. (Successors drawn
    # independently at random make walks fall into short loops, and every read local.)
    perms = []
    while len(perms) < 2:
        p = names[:]
        rng.shuffle(p)
        if all(p[i] != names[i] and all(q[i] != p[i] for q in perms) for i in range(nodes)):
            perms.append(p)
    table = {n: (rng.randrange(10), perms[0][i], perms[1][i]) for i, n in enumerate(names)}
    q = rng.randint(*walks)
    specs = []  # (start node, steps, index of the recalled earlier walk (1-based) or 0)
    for k in range(1, q + 1):
        specs.append((rng.choice(names), rng.randint(*steps), rng.randint(1, k - 1) if k > 1 else 0))
    return table, names, specs


def render_prompt(table, names, specs):
    lines = ["nodes:"]
    lines += [f"{n}={table[n][0]}>{table[n][1]},{table[n][2]}" for n in names]
    lines.append("walks:")
    for k, (start, n, recall) in enumerate(specs, 1):
        lines.append(f"w{k}:{start}*{n}" + (f"+w{recall}" if recall else ""))
    return "\n".join(lines) + "\n"


def solve(table, specs, reads=None, prompt=None):
    """Executes the walks; returns (trace, answer). With `reads` (a list) and `prompt`, appends one
    (kind, read position, source position) per dependency, positions in characters of prompt + trace:
    the source is the most recent earlier place holding the needed fact."""
    out = []          # trace pieces
    pos = [len(prompt) if prompt is not None else 0]  # absolute position of the next character

    def emit(s):
        out.append(s)
        pos[0] += len(s)

    track = reads is not None
    if track:
        # prompt positions: weight char and successor names of each node; walk lines
        entry_pos = {}
        p = prompt.index("nodes:\n") + len("nodes:\n")
        for line in prompt[p:].split("\n"):
            if line == "walks:":
                break
            name = line[:2]
            entry_pos[name] = (p + 3, p + 5, p + 8)  # weight, even successor, odd successor
            p += len(line) + 1
        walk_pos = []
        p = prompt.index("walks:\n") + len("walks:\n")
        for line in prompt[p:].split("\n"):
            if line:
                walk_pos.append(p)
            p += len(line) + 1
        last_weight = {}          # node -> position of the weight digit last written in the trace
        last_succ = {}            # (node, parity) -> position of the successor last written
        result_pos = {}           # walk -> position of its result digit
    results = []
    for k, (start, n, recall) in enumerate(specs, 1):
        s = results[recall - 1] if recall else 0
        head = f"w{k}: {start}*{n} s=" + (f"w{recall}={s}" if recall else "0") + "\n"
        if track:
            wp = walk_pos[k - 1]
            reads.append(("walk", pos[0] + len(f"w{k}: "), wp + len(f"w{k}:")))
            if recall:
                reads.append(("recall", pos[0] + len(head) - 2, result_pos[recall]))
        emit(head)
        node_src = pos[0] - len(head) + len(f"w{k}: ")  # where the current node's name was written
        s_src = pos[0] - 2                               # where the running sum was written
        node = start
        for i in range(1, n + 1):
            w, even, odd = table[node]
            s = (s + w) % 10
            nxt = even if s % 2 == 0 else odd
            line = f"{i:02d} {node}+{w}={s}>{nxt}\n"
            if track:
                p0 = pos[0]
                ep = entry_pos[node]
                reads.append(("node", p0 + 3, node_src))
                reads.append(("weight", p0 + 6, max(ep[0], last_weight.get(node, -1))))
                reads.append(("sum", p0 + 8, s_src))
                succ_prompt = ep[1] if s % 2 == 0 else ep[2]
                reads.append(("succ", p0 + 10, max(succ_prompt, last_succ.get((node, s % 2), -1))))
                last_weight[node] = p0 + 6
                last_succ[(node, s % 2)] = p0 + 10
                node_src = p0 + 10
                s_src = p0 + 8
            emit(line)
            node = nxt
        results.append(s)
        res = f"w{k}={s}\n"
        if track:
            reads.append(("sum", pos[0] + len(res) - 2, s_src))
            result_pos[k] = pos[0] + len(res) - 2
        emit(res)
    answer = format_answer(results)
    if track:
        at = pos[0] + len("#### ")
        for k in range(1, len(specs) + 1):
            at += len(f"w{k}=")
            reads.append(("answer", at, result_pos[k]))
            at += 2
    emit("#### " + answer)
    return "".join(out), answer


def format_answer(results):
    """The answer: every walk's result after its key, e.g. "w1=5 w2=3"."""
    return " ".join(f"w{k}={r}" for k, r in enumerate(results, 1))


def generate(level, index, seed, params, max_tries=1000):
    """Problem `index` of a level: deterministic in (seed, level, index)."""
    rng = random.Random(f"zipage-reasoning:{seed}:{level}:{index}")
    for _ in range(max_tries):
        table, names, specs = make_problem(rng, params["nodes"], params["walks"], params["steps"])
        prompt = render_prompt(table, names, specs)
        trace, answer = solve(table, specs)
        lo, hi = params["trace_len"]
        plo, phi = params["prompt_len"]
        if lo <= len(trace) <= hi and plo <= len(prompt) <= phi:
            return dict(id=f"{level}-{index:05d}", level=level, prompt=prompt, answer=answer, trace=trace,
                        prompt_tokens=len(prompt), trace_tokens=len(trace))
    raise ValueError(f"{level}: no problem with trace length in {params['trace_len']} and prompt length in "
                     f"{params['prompt_len']} after {max_tries} tries; the parameters do not fit")


def extract_answer(text):
    """The text after the last '####', up to the end of its line, stripped (the harness's rule)."""
    at = text.rfind("####")
    if at < 0:
        return None
    return text[at + 4:].split("\n", 1)[0].strip()


# ---- verification: an independent re-execution from the prompt text alone ----

def parse_prompt(prompt):
    lines = prompt.rstrip("\n").split("\n")
    assert lines[0] == "nodes:", "prompt must start with 'nodes:'"
    k = lines.index("walks:")
    table = {}
    for line in lines[1:k]:
        name, rest = line.split("=")
        w, succ = rest.split(">")
        a, b = succ.split(",")
        assert len(name) == 2 and name.isalpha() and len(w) == 1 and w.isdigit(), line
        assert name not in table, f"node {name} twice"
        table[name] = (int(w), a, b)
    for name, (_, a, b) in table.items():
        assert a in table and b in table, f"{name}: successor not in the table"
    specs = []
    for i, line in enumerate(lines[k + 1:], 1):
        head, rest = line.split(":", 1)
        assert head == f"w{i}", line
        recall = 0
        if "+" in rest:
            rest, r = rest.split("+")
            assert r.startswith("w")
            recall = int(r[1:])
            assert 1 <= recall < i
        start, n = rest.split("*")
        assert start in table
        specs.append((start, int(n), recall))
    return table, specs


def check_trace(table, specs, trace):
    """Walks the trace line by line against the rules (not against solve()'s output)."""
    lines = trace.split("\n")
    li = 0
    results = []
    for k, (start, n, recall) in enumerate(specs, 1):
        s = results[recall - 1] if recall else 0
        want = f"w{k}: {start}*{n} s=" + (f"w{recall}={s}" if recall else "0")
        assert lines[li] == want, f"line {li}: {lines[li]!r} != {want!r}"
        li += 1
        node = start
        for i in range(1, n + 1):
            cnt, body = lines[li].split(" ")
            assert int(cnt) == i and len(cnt) == 2, lines[li]
            x, rest = body.split("+")
            w, rest = rest.split("=")
            s_new, nxt = rest.split(">")
            assert x == node, f"line {li}: at {x}, expected {node}"
            assert int(w) == table[x][0], f"line {li}: weight"
            s = (s + int(w)) % 10
            assert int(s_new) == s, f"line {li}: sum"
            assert nxt == (table[x][1] if s % 2 == 0 else table[x][2]), f"line {li}: successor"
            node = nxt
            li += 1
        assert lines[li] == f"w{k}={s}", f"line {li}: result"
        results.append(s)
        li += 1
    assert lines[li] == "#### " + format_answer(results) and li == len(lines) - 1, "final line"
    return format_answer(results)


def check_problem(p, params=None):
    table, specs = parse_prompt(p["prompt"])
    answer = check_trace(table, specs, p["trace"])
    assert answer == p["answer"], f"{p['id']}: answer {p['answer']!r}, re-executed {answer!r}"
    assert extract_answer(p["trace"]) == p["answer"], f"{p['id']}: extraction"
    assert p["prompt_tokens"] == len(p["prompt"].encode()) and p["trace_tokens"] == len(p["trace"].encode())
    assert p["prompt"].isascii() and p["trace"].isascii()
    if params:
        lo, hi = params["trace_len"]
        plo, phi = params["prompt_len"]
        assert lo <= p["trace_tokens"] <= hi, f"{p['id']}: trace length {p['trace_tokens']}"
        assert plo <= p["prompt_tokens"] <= phi, f"{p['id']}: prompt length {p['prompt_tokens']}"


# ---- analysis: how far back each read reaches ----

def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def analyse(problems, out=sys.stdout):
    by_level = {}
    for p in problems:
        by_level.setdefault(p["level"], []).append(p)
    for level, ps in by_level.items():
        kinds = {}
        max_read = []   # per problem: the farthest read (tokens back to the nearest source)
        for p in ps:
            table, specs = parse_prompt(p["prompt"])
            reads = []
            trace, _ = solve(table, specs, reads=reads, prompt=p["prompt"])
            assert trace == p["trace"]
            text = p["prompt"] + trace
            for kind, r, src in reads:
                assert 0 <= src < r <= len(text)
                kinds.setdefault(kind, []).append(r - src)
            max_read.append(max(r - src for _, r, src in reads))
        seq = [p["prompt_tokens"] + p["trace_tokens"] + 2 for p in ps]  # + BOS + EOS
        mean_seq = sum(seq) / len(seq)
        print(f"\n{level}: {len(ps)} problems; prompt tokens mean {sum(p['prompt_tokens'] for p in ps) / len(ps):.0f} "
              f"[{min(p['prompt_tokens'] for p in ps)}, {max(p['prompt_tokens'] for p in ps)}], trace tokens mean "
              f"{sum(p['trace_tokens'] for p in ps) / len(ps):.0f} [{min(p['trace_tokens'] for p in ps)}, "
              f"{max(p['trace_tokens'] for p in ps)}], sequence mean {mean_seq:.0f}", file=out)
        print(f"  read distance (tokens back to the nearest earlier copy of the needed fact), by kind:", file=out)
        print(f"  {'kind':8s} {'reads':>8s} {'p10':>6s} {'p50':>6s} {'p90':>6s} {'max':>6s} "
              f"{'>256':>6s} {'>512':>6s} {'>1024':>6s} {'>2048':>6s} {'>4096':>6s}", file=out)
        all_d = []
        for kind in ["node", "sum", "weight", "succ", "walk", "recall", "answer"]:
            d = kinds.get(kind, [])
            if not d:
                continue
            all_d += d
            frac = lambda t: sum(x > t for x in d) / len(d)
            print(f"  {kind:8s} {len(d):8d} {percentile(d, .1):6d} {percentile(d, .5):6d} {percentile(d, .9):6d} "
                  f"{max(d):6d} {frac(256):6.1%} {frac(512):6.1%} {frac(1024):6.1%} {frac(2048):6.1%} "
                  f"{frac(4096):6.1%}", file=out)
        frac = lambda t: sum(x > t for x in all_d) / len(all_d)
        print(f"  {'all':8s} {len(all_d):8d} {percentile(all_d, .1):6d} {percentile(all_d, .5):6d} "
              f"{percentile(all_d, .9):6d} {max(all_d):6d} {frac(256):6.1%} {frac(512):6.1%} {frac(1024):6.1%} "
              f"{frac(2048):6.1%} {frac(4096):6.1%}", file=out)
        print("  recency-only cache (StreamingLLM: first 4 + last B-4 tokens): share of problems whose every read "
              "lies within the window (an upper bound on its accuracy):", file=out)
        for div in (2, 4, 8):
            b = int(mean_seq / div)
            ok = sum(m <= b - 4 for m in max_read) / len(max_read)
            print(f"    B = mean/{div} = {b:5d} tokens: {ok:6.1%}", file=out)


def parse_range(s):
    a, _, b = s.partition("-")
    return (int(a), int(b or a))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="L1", help="L1, L2, L3 (comma-separated for several), or 'custom'")
    ap.add_argument("--count", type=int, default=500, help="problems per level")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="index of the first problem")
    ap.add_argument("--out", help="JSONL output file ('-' = stdout); a {level} in it is replaced per level")
    ap.add_argument("--no-trace", action="store_true", help="leave the 'trace' field out of the output")
    ap.add_argument("--self-test", action="store_true", help="verify every generated problem by re-execution")
    ap.add_argument("--analyse", action="store_true", help="print the read-distance analysis")
    ap.add_argument("--check", nargs="+", metavar="FILE", help="verify JSONL files (with traces) and analyse them")
    g = ap.add_argument_group("custom level (--level custom)")
    g.add_argument("--nodes", type=int, help="nodes in the table (reuse distance grows with it)")
    g.add_argument("--walks", type=parse_range, help="walks per problem, e.g. 4-6")
    g.add_argument("--steps", type=parse_range, help="steps per walk, e.g. 40-80 (at most 99)")
    g.add_argument("--trace-len", type=parse_range, help="accepted trace length, e.g. 2000-4000")
    g.add_argument("--prompt-len", type=parse_range, default=(100, 1000), help="accepted prompt length")
    args = ap.parse_args()

    if args.check:
        problems = []
        for f in args.check:
            with open(f) as fh:
                for line in fh:
                    p = json.loads(line)
                    check_problem(p, LEVELS.get(p["level"]))
                    problems.append(p)
        print(f"checked {len(problems)} problems: traces re-executed, answers and lengths as recorded")
        analyse(problems)
        return 0

    levels = [x.strip() for x in args.level.split(",") if x.strip()]
    problems = []
    for level in levels:
        if level == "custom":
            if not (args.nodes and args.walks and args.steps and args.trace_len):
                ap.error("--level custom needs --nodes, --walks, --steps and --trace-len")
            params = dict(nodes=args.nodes, walks=args.walks, steps=args.steps, trace_len=args.trace_len,
                          prompt_len=args.prompt_len)
        elif level in LEVELS:
            params = LEVELS[level]
        else:
            ap.error(f"unknown level {level!r}")
        if params["steps"][1] > 99 or params["nodes"] > len(NAMES) or params["nodes"] < 3:
            ap.error("steps per walk must be at most 99 and nodes in [3, 676]")
        ps = [generate(level, i, args.seed, params) for i in range(args.start, args.start + args.count)]
        if args.self_test:
            for p in ps:
                check_problem(p, params)
            print(f"{level}: self-test passed on {len(ps)} problems", file=sys.stderr)
        problems += ps
        if args.out:
            path = args.out.replace("{level}", level)
            fh = sys.stdout if path == "-" else open(path, "w")
            for p in ps:
                q = dict(p)
                if args.no_trace:
                    del q["trace"]
                fh.write(json.dumps(q) + "\n")
            if fh is not sys.stdout:
                fh.close()
    if args.analyse:
        analyse(problems, out=sys.stderr if args.out == "-" else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
