#!/usr/bin/env python3
"""PyTorch peers for bench/bench_decode_attention.cu: one decode step of paged attention (one query
token per sequence), bf16 K/V, head_dim 128, on one GPU, against the device-to-device copy bandwidth
measured in the same run.

Methods (each timed per case; a case = batch x context x (q heads, kv heads) x block size):

  flex_paged       torch.nn.attention.flex_attention, compiled (torch.compile, static shapes, fullgraph),
                   reading the paged pool itself. The page table enters as a BlockMask whose KV blocks are
                   physical pages, made by PyTorch's own helper: PagedAttention.convert_logical_block_mask
                   (torch.nn.attention.experimental._paged_attention) maps a logical mask (block j of
                   sequence b = its tokens [j*block, (j+1)*block)) through the page table and swaps in a
                   mask_mod that looks the physical page up in its physical->logical table. If the helper
                   is missing or fails, the same physical mask is built directly (BlockMask.from_kv_blocks
                   with the page ids, mask_mod = noop_mask); see --flex-mask. enable_gqa=True.
  sdpa_contiguous  torch.nn.functional.scaled_dot_product_attention (enable_gqa=True) on K/V already
                   contiguous per sequence, [batch, kv_heads, context, 128]: the dense kernel alone. It does
                   not depend on the block size: measured once per (batch, context, heads), block "-".
  gather_sdpa      gather the sequences' pages out of the pool into one buffer (index_select on K and on V),
                   then the same SDPA on it: what a paged engine without a paged kernel pays per step.

What flex_paged reads. Query [batch, q_heads, 1, 128]; K and V each [1, kv_heads, num_pages*block, 128],
batch 1 (the whole pool, shared by all sequences). --flex-layout hnd (default): the pool is
[kv_heads][num_pages][block][128], i.e. PyTorch's PagedAttention cache layout (contiguous [1, H, pages*block,
D]); nhd: the pool is [num_pages][block][kv_heads][128], the layout of our kernels, viewed (permute, no copy)
as [1, kv_heads, num_pages*block, 128] with token stride kv_heads*128. The BlockMask has shape (batch, 1 head,
1 query row of 128): row b lists sequence b's physical pages in logical order, so the kernel reads exactly
the K and V of those pages, once per KV head (query heads of a KV head are packed in one tile).
--flex-blocks partial (default): the pages are ordinary blocks and there is no full-block list
(full_kv_num_blocks=None), as vLLM's FlexAttention backend passes them; the kernel applies mask_mod (the
helper's page lookup; with the direct mask noop_mask, which folds away) and splits each sequence's own
blocks over its KV splits. full: the pages are "full" blocks (mask_mod never applied), but PyTorch's decode
kernel (current main at least) then sizes each KV split as the whole pool length / splits, so small batches
(where it splits: batch x kv_heads < number of SMs) run on few CTAs. Contexts must be multiples of the block
size (every page full), as in our grid.

PyTorch's decode kernel (flex_decoding) is used only when q_heads/kv_heads is a power of two (16/8, 32/8); for
28/4 and 12/2 Inductor uses its prefill kernel (one query head per program, KV read per query head).
Known limit: PyTorch's flex kernels form the K/V element offset token * token_stride in int32 (vLLM issue
#50427 / PR #50483, which say pytorch/pytorch#185264 fixes it after 2.13): with nhd that overflows once one K
pool holds more than 2^31 elements (K+V > 8 GiB; in the default grid 256 x 32768), with hnd only once one
head's pages do (pool tokens x 128 > 2^31, beyond every case under the 40 GiB cap); templates that form
head * head_stride in int32 too (no INDEX_DTYPE; checked in the installed template) also overflow once the
whole pool passes 2^31 elements. Such cases are skipped with that reason (--flex-no-overflow-guard runs them
anyway: a wrapped offset faults, which ends every later case, or silently reads the wrong memory).

Timing. CUDA events around a CUDA graph of P back-to-back calls (P sized for >= ~2 ms of work at 4 TB/s,
at most --max-passes), one warm-up replay, then --reps replays, median; the time per call is that over P.
If capture fails (or with --no-graphs) the same P calls run as a plain Python loop between the events (then
CPU launch overhead can show in small cases; the note column says so). Small cases rotate over R disjoint
KV sets (R page sets in one pool / R contiguous copies, R = ceil(1 GiB / case K+V), at most 32) so that they
are not served from the 60 MB L2, as in our benchmark. flex_paged's first call includes torch.compile and is
reported as compile_s. Checks (max |out - ref| / max |ref|, flagged in the table above 0.05): each method's
output for the first two sequences against an fp32 reference (max_rel_err), and flex_paged's output for
every sequence against gather_sdpa's (max_rel_diff_vs_sdpa; gather_sdpa runs first in each case, so that its
result is kept even if the flex kernel faults).

KV bytes = 2 (K and V) x batch x context x kv_heads x 128 x 2 B; KV GB/s = KV bytes / time; "of copy bw" =
KV GB/s / copy GB/s, the copy being torch copy_ of a 2 GiB tensor, bytes read + written, median of 15.

Usage (one H200, PyTorch 2.5+ with Triton; 2.11 intended):

  python3 scripts/torch_decode_peer.py --json out/decode_peer.jsonl [--ours out/bench.json]

Flags:
  --batches 1,16,64,256         batch sizes
  --contexts 2048,8192,32768    KV length of every sequence (multiples of every block size)
  --heads 32/8,16/8             q_heads/kv_heads pairs (our grid also has 28/4 and 12/2)
  --block-sizes 256,16          page sizes (tokens per block)
  --methods flex_paged,sdpa_contiguous,gather_sdpa
  --max-case-gib 40             skip cases whose K+V exceed this (GiB); peak use is about 2x that
  --time-budget-s 300           wall-clock cap from start; later cases are reported as skipped
  --reps 10                     timed replays (median)
  --max-passes 1000             most calls per timed graph
  --no-graphs                   plain loops instead of CUDA graphs
  --flex-layout hnd|nhd         pool layout (see above), used by flex_paged and gather_sdpa
  --flex-blocks partial|full    how the pages are listed in the BlockMask (see above)
  --flex-mask auto|paged_attention|direct
                                auto: PyTorch's PagedAttention helper, falling back to the direct mask
                                (and staying there) if the helper fails
  --flex-no-overflow-guard      run flex cases past PyTorch's int32 offset limit anyway
  --flex-compile-mode MODE      torch.compile mode for flex_attention (default: none given; not
                                reduce-overhead, the script captures its own CUDA graphs)
  --sdpa-backend auto|flash|efficient|cudnn|math   pin SDPA's backend (default: PyTorch's choice)
  --json FILE                   append one JSON line per (method, case), skipped ones included
  --ours FILE                   bench_decode_attention --benchmark_out JSON: also print peer/ours ratios
                                (our time = the entry's real_time in its time_unit)
  --seed 1234

JSON line: {"kind":"decode_peer","method","batch","context","q_heads","kv_heads","block" (null for
sdpa_contiguous),"time_us","kv_gbps","of_copy_bw" (fraction),"copy_gbps","date","device", and extras:
"torch","layout","flex_path" (paged_attention|direct),"flex_blocks","timing" (graph|loop),"passes",
"rotations","reps","compile_s","max_rel_err","max_rel_diff_vs_sdpa","sdpa_backend","note","skipped" (the
reason; then the numbers are null)}. Exit status 0 unless nothing was measured.

The default grid (48 paged cases, each timed with gather_sdpa and flex_paged, and 24 contiguous ones; the
largest, 256 x 32768 x 8 KV heads, has 32 GiB of K+V) is meant to take ~150-200 s on an H200, most of it
torch.compile: one compile per flex_paged case (shapes are static, so that Inductor picks its decode kernel,
which wants a static batch). Order: block sizes, then heads, batches, contexts; the time budget drops the
tail (block 16 first).
"""
import argparse
import contextlib
import datetime
import gc
import inspect
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

HEAD_DIM = 128
GIB = 1 << 30
REL_TOL = 0.05  # max |out - ref| / max |ref| above which the table flags a result (bf16 output: ~0.4%)
Q_BLOCK = 128  # BlockMask query block: the flex decode kernel needs it to be a multiple of its BLOCK_M (>= 16)
METHODS = ("flex_paged", "sdpa_contiguous", "gather_sdpa")
METHOD_TITLES = {
    "flex_paged": "FlexAttention on the paged pool (torch.compile)",
    "sdpa_contiguous": "SDPA on contiguous K/V (kernel alone)",
    "gather_sdpa": "gather pages + SDPA",
}

torch = None  # imported in main(), so that --help and the --ours parser work without PyTorch
F = None


# ---------------------------------------------------------------------------------------------- args


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def heads_list(text):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        qh, kvh = item.split("/")
        out.append((int(qh), int(kvh)))
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int_list, default=[1, 16, 64, 256])
    p.add_argument("--contexts", type=int_list, default=[2048, 8192, 32768])
    p.add_argument("--heads", type=heads_list, default=[(32, 8), (16, 8)])
    p.add_argument("--block-sizes", type=int_list, default=[256, 16])
    p.add_argument("--methods", type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                   default=list(METHODS))
    p.add_argument("--max-case-gib", type=float, default=40.0)
    p.add_argument("--time-budget-s", type=float, default=300.0)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--max-passes", type=int, default=1000)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--flex-layout", choices=("nhd", "hnd"), default="hnd")
    p.add_argument("--flex-blocks", choices=("partial", "full"), default="partial")
    p.add_argument("--flex-no-overflow-guard", action="store_true")
    p.add_argument("--flex-mask", choices=("auto", "paged_attention", "direct"), default="auto")
    p.add_argument("--flex-compile-mode", default=None)
    p.add_argument("--sdpa-backend", choices=("auto", "flash", "efficient", "cudnn", "math"), default="auto")
    p.add_argument("--json", default=None)
    p.add_argument("--ours", default=None)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown method(s) {bad}; known: {','.join(METHODS)}")
    for qh, kvh in args.heads:
        if kvh <= 0 or qh % kvh:
            p.error(f"--heads {qh}/{kvh}: q heads must be a multiple of kv heads")
    if args.reps < 1 or args.max_passes < 1:
        p.error("--reps and --max-passes must be >= 1")
    return args


# --------------------------------------------------------------------------- ours (Google Benchmark)

OURS_NAME = re.compile(r"^decode/bs(\d+)/q(\d+)_kv(\d+)/batch(\d+)/ctx(\d+)(?:/|$)")
UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def _entry_time_us(entry):
    """Time of one Google Benchmark entry in microseconds: real_time in time_unit (manual time for our
    benchmark), else a numeric field whose name contains "time" (unit from a _ns/_us/_ms/_s suffix, else
    time_unit, else seconds)."""
    unit = UNIT_US.get(str(entry.get("time_unit", "ns")))
    rt = entry.get("real_time")
    if isinstance(rt, (int, float)) and unit is not None:
        return float(rt) * unit
    for key, value in entry.items():
        lk = str(key).lower()
        if "time" not in lk or lk in ("real_time", "cpu_time", "time_unit") or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)):
            continue
        for suffix, scale in (("_ns", 1e-3), ("_us", 1.0), ("_ms", 1e3), ("_s", 1e6)):
            if lk.endswith(suffix):
                return float(value) * scale
        return float(value) * (unit if unit is not None else 1e6)
    return None


def load_ours(path):
    """{(block, q_heads, kv_heads, batch, context): time_us} from bench_decode_attention's JSON output.
    Prefers per-run entries (median over repetitions), then the median aggregate, then the mean."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        entries = data.get("benchmarks", [])
    elif isinstance(data, list):
        entries = data
    else:
        entries = []
    if not isinstance(entries, list):
        entries = []
    found = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("error_occurred"):
            continue
        m = None
        for field in ("run_name", "name"):
            if isinstance(e.get(field), str):
                m = OURS_NAME.match(e[field])
                if m:
                    break
        if not m:
            continue
        t = _entry_time_us(e)
        if t is None or not t > 0:
            continue
        kind = "iteration"
        if e.get("run_type") == "aggregate":
            kind = str(e.get("aggregate_name", "aggregate"))
        key = tuple(int(g) for g in m.groups())
        found.setdefault(key, {}).setdefault(kind, []).append(t)
    out = {}
    for key, kinds in found.items():
        for kind in ("iteration", "median", "mean"):
            if kinds.get(kind):
                out[key] = statistics.median(kinds[kind])
                break
    return out


# ------------------------------------------------------------------------------------------- helpers


def kv_bytes_of(batch, ctx, kvh):
    return 2 * batch * ctx * kvh * HEAD_DIM * 2


def rotations_for(kv_bytes):
    return int(min(32, max(1, math.ceil(GIB / kv_bytes))))


def free_cuda():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def short_error(exc):
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if len(first) > 160:
        first = first[:157] + "..."
    return f"{type(exc).__name__}: {first}"


def measure_copy_gbps():
    n = 2 * GIB
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(7)
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    ms = []
    for i in range(18):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        if i >= 3:
            ms.append(e0.elapsed_time(e1))
    del a, b
    free_cuda()
    return 2.0 * n / (statistics.median(ms) * 1e-3) / 1e9


def time_calls(fn, rot, kv_bytes, reps, use_graph, max_passes):
    """Median seconds per call of fn(r), r cycling over range(rot). Returns (seconds, timing, passes, note)."""
    est = kv_bytes / 4e12
    passes = int(min(max_passes, max(1, math.ceil(2e-3 / est))))
    passes = max(rot, (passes + rot - 1) // rot * rot)
    # Warm-up on a side stream (what torch.cuda.graph capture wants: lazy inits happen outside capture).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(3, rot)):  # every rotation once, so that none is first seen during capture
            fn(i % rot)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = None
    note = ""
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for i in range(passes):
                    fn(i % rot)
        except Exception as exc:  # capture unsupported for this call: time a plain loop instead
            graph = None
            note = f"graph capture failed ({short_error(exc)}), plain loop"
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()

    def one_run():
        if graph is not None:
            graph.replay()
        else:
            for i in range(passes):
                fn(i % rot)

    one_run()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        e0.record()
        one_run()
        e1.record()
        e1.synchronize()
        per_call.append(e0.elapsed_time(e1) * 1e-3 / passes)
    timing = "graph" if graph is not None else "loop"
    del graph
    return statistics.median(per_call), timing, passes, note


def reference_rows(q, kv_pairs):
    """fp32 attention for the first sequences: q [batch, qh, 1, D]; kv_pairs[b] = (K, V), each [kvh, ctx, D].
    Returns [n, qh, D] float32."""
    qh = q.shape[1]
    out = []
    for b, (k, v) in enumerate(kv_pairs):
        kvh = k.shape[0]
        qq = q[b, :, 0, :].float().reshape(kvh, qh // kvh, HEAD_DIM)
        s = torch.einsum("hgd,hnd->hgn", qq, k.float()) / math.sqrt(HEAD_DIM)
        p = torch.softmax(s, dim=-1)
        out.append(torch.einsum("hgn,hnd->hgd", p, v.float()).reshape(qh, HEAD_DIM))
    return torch.stack(out)


def rel_err(out, ref):
    """max |out - ref| / max |ref| over the first ref.shape[0] sequences (out [batch, qh, 1, D])."""
    n = ref.shape[0]
    ref = ref.float().reshape(n, -1)
    return float((out[:n].float().reshape(n, -1) - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


class SdpaBackend:
    """Context manager factory pinning SDPA's backend (or not)."""

    def __init__(self, name):
        self.name = name
        self.backends = None
        if name != "auto":
            from torch.nn.attention import SDPBackend

            self.backends = [{
                "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION,
                "math": SDPBackend.MATH,
            }[name]]

    def __call__(self):
        if self.backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.backends)


# --------------------------------------------------------------------------------- the paged pool


class PagedPool:
    """K and V pools for one case, R disjoint page sets (rotations) of batch x pages_per_seq pages each,
    pages drawn by a random permutation of the whole pool (shuffled, non-contiguous page tables)."""

    def __init__(self, batch, ctx, kvh, block, layout, rot, gen):
        self.batch, self.ctx, self.kvh, self.block, self.layout, self.rot = batch, ctx, kvh, block, layout, rot
        self.pages_per_seq = ctx // block
        self.n_pages = rot * batch * self.pages_per_seq
        if layout == "nhd":
            shape = (self.n_pages, block, kvh, HEAD_DIM)
        else:
            shape = (kvh, self.n_pages, block, HEAD_DIM)
        self.k = torch.empty(shape, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        self.v = torch.empty(shape, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        perm = torch.randperm(self.n_pages, device="cuda", generator=gen)
        self.tables = perm.view(rot, batch, self.pages_per_seq)  # int64 physical page ids
        self.page_axis = 0 if layout == "nhd" else 1

    def flex_views(self):
        """K, V as [1, kv_heads, n_pages * block, 128] views of the pools (no copy)."""
        length = self.n_pages * self.block
        if self.layout == "nhd":
            return tuple(t.view(1, length, self.kvh, HEAD_DIM).permute(0, 2, 1, 3) for t in (self.k, self.v))
        return tuple(t.view(1, self.kvh, length, HEAD_DIM) for t in (self.k, self.v))

    def gather_target(self, n_seqs):
        if self.layout == "nhd":
            shape = (n_seqs * self.pages_per_seq, self.block, self.kvh, HEAD_DIM)
        else:
            shape = (self.kvh, n_seqs * self.pages_per_seq, self.block, HEAD_DIM)
        return torch.empty(shape, dtype=torch.bfloat16, device="cuda")

    def as_bhsd(self, gathered, n_seqs):
        """A gather target (pages of n_seqs sequences in order) viewed as [n_seqs, kv_heads, ctx, 128]."""
        if self.layout == "nhd":
            return gathered.view(n_seqs, self.ctx, self.kvh, HEAD_DIM).transpose(1, 2)
        return gathered.view(self.kvh, n_seqs, self.ctx, HEAD_DIM).transpose(0, 1)

    def gather(self, pool, page_ids, out):
        return torch.index_select(pool, self.page_axis, page_ids, out=out)

    def sequence_kv(self, r, b):
        """(K, V) of sequence b of rotation r, each [kv_heads, ctx, 128] (a copy)."""
        ids = self.tables[r, b]
        res = []
        for pool in (self.k, self.v):
            g = torch.index_select(pool, self.page_axis, ids)
            res.append(self.as_bhsd(g, 1)[0])
        return tuple(res)


# ------------------------------------------------------------------------------ FlexAttention masks


def _block_mask(page_ids, n_cols, block, kv_len, mask_mod, full):
    """page_ids [batch, P] -> BlockMask of shape (batch, 1 head, 1 query row) listing those KV blocks, kv
    indices padded with zeros to n_cols columns. full=False: as ordinary (partial) blocks and no full-block
    list (full_kv_num_blocks=None); full=True: as full blocks (mask_mod never applied), no partial ones."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, pages = page_ids.shape
    idx = torch.zeros((batch, 1, 1, n_cols), dtype=torch.int32, device=page_ids.device)
    idx[:, 0, 0, :pages] = page_ids.to(torch.int32)
    num = torch.full((batch, 1, 1), pages, dtype=torch.int32, device=page_ids.device)
    if full:
        return BlockMask.from_kv_blocks(torch.zeros_like(num), torch.zeros_like(idx), num, idx,
                                        BLOCK_SIZE=(Q_BLOCK, block), mask_mod=mask_mod, seq_lengths=(1, kv_len))
    return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(Q_BLOCK, block), mask_mod=mask_mod,
                                    seq_lengths=(1, kv_len))


def _with_seq_lengths(bm, seq_lengths):
    """Older converters set seq_lengths from the block grid (q length 128); flex_attention wants (1, L)."""
    from torch.nn.attention.flex_attention import BlockMask

    if tuple(getattr(bm, "seq_lengths", ())) == tuple(seq_lengths):
        return bm
    return BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
                                    BLOCK_SIZE=tuple(bm.BLOCK_SIZE), mask_mod=bm.mask_mod,
                                    seq_lengths=tuple(seq_lengths))


def masks_paged_attention(pool, full):
    """One physical BlockMask per rotation through PyTorch's PagedAttention helper
    (convert_logical_block_mask: logical block j of sequence b -> page_table[b, j]; mask_mod replaced by
    the helper's physical->logical lookup). The helper's tables are filled directly with our shuffled
    assignment instead of through reserve(), which hands pages out in order. Sequence b of rotation r is
    the helper's batch row r*B+b for the conversion; physical_to_logical row b (what the kernel's mask_mod
    reads for batch index b) maps the pages of sequence b of every rotation (they are disjoint), so one
    mask_mod serves all rotations."""
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
    except ImportError:  # the module's name in some versions
        from torch.nn.attention.experimental.paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import noop_mask

    rot, batch, pages = pool.tables.shape
    rows = rot * batch
    kwargs = {"n_pages": pool.n_pages, "page_size": pool.block, "max_batch_size": rows, "device": "cuda"}
    if "max_seq_len" in inspect.signature(PagedAttention.__init__).parameters:  # some versions take it
        kwargs["max_seq_len"] = pool.ctx
    pa = PagedAttention(**kwargs)
    pa.page_table[:, :pages] = pool.tables.reshape(rows, pages).to(pa.page_table.dtype)
    union = pool.tables.permute(1, 0, 2).reshape(batch, rot * pages)  # pages of sequence b, all rotations
    logical_ids = torch.arange(pages, device="cuda", dtype=pa.physical_to_logical.dtype).repeat(rot)
    pa.physical_to_logical[:batch].scatter_(1, union, logical_ids.expand(batch, rot * pages).contiguous())
    pa.capacity.fill_(pages * pool.block)
    if hasattr(pa, "seq_lens"):  # read by some versions' mask_mod
        pa.seq_lens.fill_(pool.ctx)
    pa.empty_pages = []
    # Logical mask: sequence b attends to its blocks 0..P-1 (of `block` tokens each).
    logical = _block_mask(torch.arange(pages, device="cuda").expand(batch, pages), pages, pool.block, pool.ctx,
                          noop_mask, full)
    kv_len = pool.n_pages * pool.block
    masks = []
    for r in range(rot):
        rows_r = torch.arange(r * batch, (r + 1) * batch, device="cuda")
        masks.append(_with_seq_lengths(pa.convert_logical_block_mask(logical, batch_idx=rows_r), (1, kv_len)))
    # Each conversion makes a new mask_mod closure; give every rotation the same object so that Dynamo sees
    # one function (no recompiles). It is valid for all rotations (see above).
    for bm in masks[1:]:
        bm.mask_mod = masks[0].mask_mod
    return masks, pa


def masks_direct(pool, full):
    """The same physical masks without the helper: blocks = the sequence's physical page ids, mask_mod =
    noop_mask (valid because every page of every sequence is full; the kernel then applies no mask)."""
    from torch.nn.attention.flex_attention import noop_mask

    kv_len = pool.n_pages * pool.block
    return [_block_mask(pool.tables[r], pool.n_pages, pool.block, kv_len, noop_mask, full)
            for r in range(pool.rot)], None


def flex_head_offsets_64bit():
    """True if the installed flex decode template computes the per-head K/V offset in INDEX_DTYPE (int64
    for large tensors); older templates compute it in int32."""
    import importlib

    texts = []
    with contextlib.suppress(Exception):
        from importlib import resources

        texts.append((resources.files("torch._inductor.kernel.flex") / "templates" / "flex_decode.py.jinja")
                     .read_text())
    for mod in ("torch._inductor.kernel.flex.flex_decoding", "torch._inductor.kernel.flex_decoding"):
        with contextlib.suppress(Exception):
            texts.append(inspect.getsource(importlib.import_module(mod)))
    return any("program_id(1).to(INDEX_DTYPE)" in t for t in texts)


def flex_overflow_reason(pool, head_offsets_64bit):
    """Why PyTorch's flex kernels would compute a wrapped int32 K/V element offset for this pool, or None.
    The token offset is offs_n * stride_n in int32 (offs_n < n_pages * block, the physical token index;
    see vLLM issue #50427); older templates also form head * stride_h in int32."""
    tokens = pool.n_pages * pool.block
    limit = 2 ** 31 - 1
    row = pool.kvh * HEAD_DIM if pool.layout == "nhd" else HEAD_DIM  # token stride of the K/V view
    if (tokens - 1) * row + HEAD_DIM - 1 > limit:  # last token's offset + last element of its row
        return (f"PyTorch's flex kernel would overflow int32 K/V offsets ({tokens} pool tokens x stride {row}"
                f"{'; try --flex-layout hnd' if pool.layout == 'nhd' else ''})")
    if pool.layout == "hnd" and not head_offsets_64bit and (pool.kvh - 1) * tokens * HEAD_DIM > limit:
        return ("this PyTorch's flex decode kernel forms head offsets in int32 and the pool has more than "
                "2^31 elements")
    return None


# ------------------------------------------------------------------------------------------- runner


class Runner:
    def __init__(self, args, copy_gbps, device_name):
        self.args = args
        self.copy_gbps = copy_gbps
        self.device_name = device_name
        self.results = []
        self.t0 = time.monotonic()
        self.flex_path = "direct" if args.flex_mask == "direct" else "paged_attention"
        self.flex_compiled = None
        self.head_offsets_64bit = False
        self.sdpa = SdpaBackend(args.sdpa_backend)
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(args.seed)

    # -- bookkeeping

    def budget_left(self):
        return self.args.time_budget_s - (time.monotonic() - self.t0)

    def record(self, method, batch, ctx, qh, kvh, block, seconds=None, skipped=None, **extra):
        row = {
            "kind": "decode_peer",
            "method": method,
            "batch": batch,
            "context": ctx,
            "q_heads": qh,
            "kv_heads": kvh,
            "block": block,
            "time_us": None,
            "kv_gbps": None,
            "of_copy_bw": None,
            "copy_gbps": round(self.copy_gbps, 1),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": self.device_name,
            "torch": torch.__version__,
        }
        if seconds is not None:
            gbps = kv_bytes_of(batch, ctx, kvh) / seconds / 1e9
            row.update(time_us=round(seconds * 1e6, 2), kv_gbps=round(gbps, 1),
                       of_copy_bw=round(gbps / self.copy_gbps, 4))
        if skipped is not None:
            row["skipped"] = skipped
        for k, v in extra.items():  # keep the JSON strict: no NaN / Infinity
            row[k] = v if not isinstance(v, float) or math.isfinite(v) else str(v)
        self.results.append(row)
        shape = f"batch {batch} ctx {ctx} q/kv {qh}/{kvh} block {block if block else '-'}"
        if seconds is not None:
            info = [str(row.get("timing", ""))]
            for key, label in (("max_rel_err", "rel err vs fp32 %.2g"), ("max_rel_diff_vs_sdpa", "vs sdpa %.2g"),
                               ("compile_s", "compile %.1f s")):
                if isinstance(row.get(key), (int, float)):
                    info.append(label % row[key])
            print(f"  {method:16s} {shape}: {row['time_us']:.1f} us, {row['kv_gbps']:.0f} GB/s, "
                  f"{100 * row['of_copy_bw']:.1f}% of copy ({', '.join(info)})", flush=True)
        else:
            print(f"  {method:16s} {shape}: skipped ({skipped})", flush=True)
        if self.args.json:
            with open(self.args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    def guarded(self, method, batch, ctx, qh, kvh, block, body):
        """Runs body() -> dict(seconds=..., **extra); records the result or the reason it was skipped."""
        if self.budget_left() <= 0:
            self.record(method, batch, ctx, qh, kvh, block, skipped="time budget")
            return
        try:
            res = body()
            self.record(method, batch, ctx, qh, kvh, block, **res)
        except torch.cuda.OutOfMemoryError as exc:
            self.record(method, batch, ctx, qh, kvh, block, skipped=f"out of memory ({short_error(exc)})")
        except Exception as exc:
            traceback.print_exc(limit=4, file=sys.stderr)
            self.record(method, batch, ctx, qh, kvh, block, skipped=f"error: {short_error(exc)}")
        finally:
            with contextlib.suppress(Exception):
                free_cuda()

    # -- methods

    def sdpa_contiguous(self, batch, ctx, qh, kvh):
        a = self.args
        kvb = kv_bytes_of(batch, ctx, kvh)
        rot = rotations_for(kvb)

        def body():
            shape = (rot, batch, kvh, ctx, HEAD_DIM)
            kc = torch.empty(shape, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
            vc = torch.empty(shape, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
            q = torch.randn(batch, qh, 1, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            n = min(batch, 2)
            ref = reference_rows(q, [(kc[0, b], vc[0, b]) for b in range(n)])

            def fn(r):
                return F.scaled_dot_product_attention(q, kc[r], vc[r], enable_gqa=True)

            with self.sdpa():
                err = rel_err(fn(0), ref)
                seconds, timing, passes, note = time_calls(fn, rot, kvb, a.reps, not a.no_graphs, a.max_passes)
            extra = dict(seconds=seconds, timing=timing, passes=passes, rotations=rot, reps=a.reps,
                         max_rel_err=round(err, 5), sdpa_backend=a.sdpa_backend)
            if note:
                extra["note"] = note
            return extra

        self.guarded("sdpa_contiguous", batch, ctx, qh, kvh, None, body)

    def flex_paged(self, pool, q, ref, gathered_out, batch, ctx, qh, kvh, block):
        a = self.args
        full = a.flex_blocks == "full"

        def build_masks():
            if self.flex_path == "paged_attention":
                try:
                    return masks_paged_attention(pool, full)
                except Exception as exc:
                    if a.flex_mask != "auto":
                        raise
                    print(f"  PagedAttention helper unusable ({short_error(exc)}); using the direct mask",
                          file=sys.stderr, flush=True)
                    self.flex_path = "direct"
            return masks_direct(pool, full)

        def run(masks):
            kf, vf = pool.flex_views()

            def fn(r):
                return self.flex_compiled(q, kf, vf, block_mask=masks[r], enable_gqa=True)

            torch._dynamo.reset()  # one compiled variant at a time (each case compiles anyway)
            t = time.perf_counter()
            out = fn(0)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t
            extra = dict(max_rel_err=round(rel_err(out, ref), 5))
            if gathered_out is not None:  # every sequence, against gather_sdpa's output on the same data
                extra["max_rel_diff_vs_sdpa"] = round(rel_err(out, gathered_out), 5)
            del out
            seconds, timing, passes, note = time_calls(fn, pool.rot, kv_bytes_of(batch, ctx, kvh), a.reps,
                                                       not a.no_graphs, a.max_passes)
            extra.update(seconds=seconds, timing=timing, passes=passes, rotations=pool.rot, reps=a.reps,
                         compile_s=round(compile_s, 2), layout=pool.layout, flex_blocks=a.flex_blocks)
            if note:
                extra["note"] = note
            return extra

        def body():
            masks, helper = build_masks()  # may switch self.flex_path to "direct" (auto mode)
            path = self.flex_path
            try:
                res = run(masks)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:
                if a.flex_mask != "auto" or path != "paged_attention":
                    raise
                # The helper's mask failed in compile or at run time: retry with the direct mask, for good.
                print(f"  flex_paged with the PagedAttention mask failed ({short_error(exc)}); retrying with "
                      "the direct mask", file=sys.stderr, flush=True)
                traceback.print_exc(limit=4, file=sys.stderr)
                del masks, helper
                try:
                    masks, helper = masks_direct(pool, full)
                    res = run(masks)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception:
                    raise exc  # fails with the direct mask too: not the helper's fault, keep the helper
                self.flex_path = path = "direct"
                res["paged_attention_error"] = short_error(exc)
            res["flex_path"] = path
            del masks, helper
            return res

        reason = None if a.flex_no_overflow_guard else flex_overflow_reason(pool, self.head_offsets_64bit)
        if reason:
            self.record("flex_paged", batch, ctx, qh, kvh, block, skipped=reason, layout=pool.layout)
            return
        self.guarded("flex_paged", batch, ctx, qh, kvh, block, body)

    def gather_sdpa(self, pool, q, ref, outputs, batch, ctx, qh, kvh, block):
        """outputs["gather_sdpa"] = its output on rotation 0 (for flex_paged to compare with)."""
        a = self.args

        def body():
            ids = pool.tables.reshape(pool.rot, batch * pool.pages_per_seq)
            gk = pool.gather_target(batch)
            gv = pool.gather_target(batch)
            k_view = pool.as_bhsd(gk, batch)
            v_view = pool.as_bhsd(gv, batch)

            def fn(r):
                pool.gather(pool.k, ids[r], gk)
                pool.gather(pool.v, ids[r], gv)
                return F.scaled_dot_product_attention(q, k_view, v_view, enable_gqa=True)

            with self.sdpa():
                out = fn(0)
                err = rel_err(out, ref)
                outputs["gather_sdpa"] = out
                seconds, timing, passes, note = time_calls(fn, pool.rot, kv_bytes_of(batch, ctx, kvh), a.reps,
                                                           not a.no_graphs, a.max_passes)
            extra = dict(seconds=seconds, timing=timing, passes=passes, rotations=pool.rot, reps=a.reps,
                         max_rel_err=round(err, 5), layout=pool.layout, sdpa_backend=a.sdpa_backend)
            if note:
                extra["note"] = note
            return extra

        self.guarded("gather_sdpa", batch, ctx, qh, kvh, block, body)

    def paged_case(self, batch, ctx, qh, kvh, block):
        a = self.args
        methods = [m for m in ("gather_sdpa", "flex_paged") if m in a.methods]
        if not methods:
            return
        if self.budget_left() <= 0:
            for m in methods:
                self.record(m, batch, ctx, qh, kvh, block, skipped="time budget")
            return
        kvb = kv_bytes_of(batch, ctx, kvh)
        pool = q = ref = None
        try:
            pool = PagedPool(batch, ctx, kvh, block, a.flex_layout, rotations_for(kvb), self.gen)
            q = torch.randn(batch, qh, 1, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            ref = reference_rows(q, [pool.sequence_kv(0, b) for b in range(min(batch, 2))])
        except Exception as exc:
            reason = ("out of memory" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error") + \
                f" allocating the pool ({short_error(exc)})"
            del pool, q, ref
            with contextlib.suppress(Exception):
                free_cuda()
            for m in methods:
                self.record(m, batch, ctx, qh, kvh, block, skipped=reason)
            return
        # gather_sdpa first: its output checks flex_paged's on every sequence, and its result is in even if
        # the flex kernel then faults (a CUDA fault ends every later case of this process).
        outputs = {}
        if "gather_sdpa" in methods:
            self.gather_sdpa(pool, q, ref, outputs, batch, ctx, qh, kvh, block)
        if "flex_paged" in methods:
            self.flex_paged(pool, q, ref, outputs.get("gather_sdpa"), batch, ctx, qh, kvh, block)
        del pool, q, ref, outputs
        free_cuda()

    def run_grid(self):
        a = self.args
        done_contiguous = set()
        for block in a.block_sizes:
            for qh, kvh in a.heads:
                for batch in a.batches:
                    for ctx in a.contexts:
                        kvb = kv_bytes_of(batch, ctx, kvh)
                        too_big = kvb > a.max_case_gib * GIB
                        key = (batch, ctx, qh, kvh)
                        if "sdpa_contiguous" in a.methods and key not in done_contiguous:
                            done_contiguous.add(key)
                            if too_big:
                                self.record("sdpa_contiguous", batch, ctx, qh, kvh, None,
                                            skipped=f"K+V > {a.max_case_gib:g} GiB")
                            else:
                                self.sdpa_contiguous(batch, ctx, qh, kvh)
                        paged = [m for m in ("flex_paged", "gather_sdpa") if m in a.methods]
                        if too_big or ctx % block:
                            why = f"K+V > {a.max_case_gib:g} GiB" if too_big else "context not a multiple of block"
                            for m in paged:
                                self.record(m, batch, ctx, qh, kvh, block, skipped=why)
                            continue
                        self.paged_case(batch, ctx, qh, kvh, block)

    # -- reports

    def print_tables(self):
        print(f"\n## PyTorch decode peers (head_dim {HEAD_DIM}, bf16 KV; copy bandwidth {self.copy_gbps:.0f} GB/s "
              f"read+write; {self.device_name}; torch {torch.__version__})")
        for method in METHODS:
            rows = [r for r in self.results if r["method"] == method]
            if not rows:
                continue
            title = METHOD_TITLES[method]
            if method != "sdpa_contiguous":
                title += f", layout {self.args.flex_layout}"
            if method == "flex_paged":
                title += f", {self.args.flex_blocks} blocks"
                paths = sorted({r.get("flex_path") for r in rows if r.get("flex_path")})
                if paths:
                    title += f", mask via {'/'.join(paths)}"
            if method != "flex_paged" and self.args.sdpa_backend != "auto":
                title += f", SDPA backend {self.args.sdpa_backend}"
            print(f"\n### {method}: {title}\n")
            print("| batch | context | q/kv heads | block | time (us) | KV GB/s | of copy bw | note |")
            print("|---:|---:|---:|---:|---:|---:|---:|---|")
            for r in rows:
                block = r["block"] if r["block"] else "-"
                if r["time_us"] is None:
                    print(f"| {r['batch']} | {r['context']} | {r['q_heads']}/{r['kv_heads']} | {block} | "
                          f"skipped | | | {r.get('skipped', '')} |")
                    continue
                notes = [r.get("timing", "")]
                for key, what in (("max_rel_err", "vs fp32"), ("max_rel_diff_vs_sdpa", "vs gather_sdpa")):
                    if key not in r:
                        continue
                    v = r[key]
                    if not isinstance(v, (int, float)) or v > REL_TOL:  # NaN is stored as a string
                        notes.append(f"CHECK: rel err {v} {what}")
                if r.get("note"):
                    notes.append(r["note"])
                print(f"| {r['batch']} | {r['context']} | {r['q_heads']}/{r['kv_heads']} | {block} | "
                      f"{r['time_us']:.1f} | {r['kv_gbps']:.0f} | {100 * r['of_copy_bw']:.1f}% | "
                      f"{'; '.join(n for n in notes if n)} |")

    def print_ratios(self, ours):
        print("\n## Ours vs PyTorch peers (peer time / our time; > 1 = ours faster)")
        for method in METHODS:
            lines = []
            for r in self.results:
                if r["method"] != method or r["time_us"] is None:
                    continue
                blocks = [r["block"]] if r["block"] else sorted({k[0] for k in ours}, reverse=True)
                for block in blocks:
                    t_ours = ours.get((block, r["q_heads"], r["kv_heads"], r["batch"], r["context"]))
                    if t_ours is None:
                        continue
                    lines.append(f"| {r['batch']} | {r['context']} | {r['q_heads']}/{r['kv_heads']} | {block} | "
                                 f"{t_ours:.1f} | {r['time_us']:.1f} | {r['time_us'] / t_ours:.2f}x |")
            if not lines:
                continue
            print(f"\n### {method}\n")
            print("| batch | context | q/kv heads | block | ours (us) | peer (us) | peer/ours |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            print("\n".join(lines))


def configure_dynamo():
    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 1 << 16), ("accumulated_cache_size_limit", 1 << 16),
                        ("fail_on_recompile_limit_hit", True)):
        if hasattr(cfg, name):
            with contextlib.suppress(Exception):
                setattr(cfg, name, value)


def main(argv=None):
    global torch, F
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.json and os.path.dirname(args.json):
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
    ours = None
    if args.ours:
        try:
            ours = load_ours(args.ours)
            print(f"ours: {len(ours)} decode cases from {args.ours}")
        except (OSError, ValueError) as exc:
            print(f"ours: cannot read {args.ours}: {exc}", file=sys.stderr)
    import torch as _torch
    import torch.nn.functional as _F

    torch, F = _torch, _F
    if not torch.cuda.is_available():
        print("torch_decode_peer: no CUDA device; nothing measured", file=sys.stderr)
        return 1
    import torch._dynamo  # noqa: F401  (config below)

    configure_dynamo()
    device_name = torch.cuda.get_device_name(0)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = "none"
    print(f"device: {device_name}; torch {torch.__version__}, triton {triton_version}, CUDA {torch.version.cuda}")
    with torch.no_grad():
        copy_gbps = measure_copy_gbps()
        print(f"device-to-device copy: {copy_gbps:.1f} GB/s (torch copy_ of 2 GiB, bytes read + written, median of 15)",
              flush=True)
        runner = Runner(args, copy_gbps, device_name)
        if "flex_paged" in args.methods:
            try:
                from torch.nn.attention.flex_attention import flex_attention

                runner.flex_compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True,
                                                     mode=args.flex_compile_mode)
                runner.head_offsets_64bit = flex_head_offsets_64bit()
            except Exception as exc:
                print(f"flex_attention unavailable ({short_error(exc)}); skipping flex_paged", file=sys.stderr)
                args.methods = [m for m in args.methods if m != "flex_paged"]
        runner.run_grid()
    runner.print_tables()
    if ours:
        runner.print_ratios(ours)
    measured = sum(1 for r in runner.results if r["time_us"] is not None)
    skipped = len(runner.results) - measured
    print(f"\n{measured} measured, {skipped} skipped, {time.monotonic() - runner.t0:.0f} s"
          + (f"; JSON lines appended to {args.json}" if args.json else ""))
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
