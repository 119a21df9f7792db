#!/usr/bin/env bash
# One device call: every GPU test with prebuilt binaries, then the throughput runs behind docs/benchmarks.md
# (Qwen3-0.6B long generation full vs compressed, nano-vllm on Qwen3-0.6B and Qwen3-8B, the shape the
# transformers peer runs, the peer itself) and the plot. Binaries from $BIN, logs to $OUT.
#   BIN=.carry-bin OUT=out bench/run_final.sh
set -u
OUT=${OUT:-out}
BIN=${BIN:-.carry-bin}
mkdir -p "$OUT"
export ZIPAGE_TEST_MODEL="$PWD/models/stories260K.gguf" PYTHONUNBUFFERED=1
S="$OUT/summary.txt"
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$S"
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
  ( timeout 120 "$BIN/$t" > "$OUT/$t.log" 2>&1; echo "$t: rc=$?" > "$OUT/$t.rc" ) &
done
wait
cat "$OUT"/*.rc >> "$S"; rm -f "$OUT"/*.rc
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do tail -3 "$OUT/$t.log" | sed "s/^/$t: /" >> "$S"; done
echo "tests: $(($(date +%s) - t0)) s" >> "$S"
bench() { local limit=$1; shift; timeout "$limit" "$BIN/zipage-bench" --json "$OUT/bench.jsonl" "$@" >> "$OUT/bench.txt" 2>&1; echo "bench rc=$?: $*" >> "$S"; }
bench 120 --shape qwen3-0.6b --workload long --mode both --num-requests 256 --seconds 40
bench 60 --shape qwen3-0.6b --workload nano --mode full --seconds 50
bench 90 --shape qwen3-8b --workload nano --mode full --seconds 70
bench 40 --shape qwen3-0.6b --workload long --mode full --num-requests 256 --output-len 256 --seconds 30
timeout 90 python3 scripts/hf_peer_bench.py --num-requests 256 --prompt-len 128 --output-len 256 --json "$OUT/bench.jsonl" > "$OUT/hf.txt" 2>&1
echo "hf peer rc=$?" >> "$S"
python3 scripts/plot_benchmarks.py "$OUT/bench.jsonl" "$OUT/benchmarks.png" >> "$S" 2>&1
grep -E "^\||KV pool" "$OUT/bench.txt" | grep -v "^|---" >> "$S"
echo "total: $(($(date +%s) - t0)) s" >> "$S"
cat "$S"
