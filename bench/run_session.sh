#!/usr/bin/env bash
# One device call with prebuilt binaries ($BIN, default .carry-bin; logs to $OUT): every GPU test, the
# CUDA-graph tests under compute-sanitizer memcheck, zipage-bench with and without decode graphs (nano-vllm
# workload, Qwen3-0.6B and Qwen3-8B shapes), and decode attention against the PyTorch peers
# (scripts/torch_decode_peer.py) on the same shapes.
#   BIN=.carry-bin OUT=out bench/run_session.sh
set -u
. "$(dirname "$0")/lib.sh"
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
  ( timeout 170 "$BIN/$t" > "$OUT/$t.log" 2>&1; echo "$t: rc=$?" > "$OUT/$t.rc" ) &
done
wait
cat "$OUT"/*.rc >> "$S"; rm -f "$OUT"/*.rc
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
  grep -E "ERROR|FAILED|SKIP" "$OUT/$t.log" | head -20 | sed "s/^/$t: /" >> "$S"
  tail -3 "$OUT/$t.log" | sed "s/^/$t: /" >> "$S"
done
grep -E "graphs|graph" "$OUT/test_cuda_engine.log" | head -10 >> "$S"
stamp tests
bench() { local limit=$1; shift; timeout "$limit" "$BIN/zipage-bench" --json "$OUT/bench.jsonl" "$@" >> "$OUT/bench.txt" 2>&1; echo "bench rc=$?: $*" >> "$S"; }
bench 70 --shape qwen3-0.6b --workload nano --mode full --seconds 50
bench 70 --shape qwen3-0.6b --workload nano --mode full --seconds 50 --no-graphs
bench 70 --shape qwen3-0.6b --workload nano --mode compressed --seconds 50
bench 100 --shape qwen3-8b --workload nano --mode full --seconds 75
stamp benches
timeout 110 "$BIN/bench_decode_attention" \
  --benchmark_filter='^(copy_bandwidth|decode/bs(256|16)/q(32_kv8|16_kv8)/batch(1|16|64|256)/ctx(2048|8192|32768)/)' \
  --benchmark_out="$OUT/decode.json" --benchmark_out_format=json > "$OUT/decode.txt" 2>&1
echo "decode bench rc=$?" >> "$S"
stamp decode
timeout 200 python3 scripts/torch_decode_peer.py --ours "$OUT/decode.json" --json "$OUT/peer.jsonl" --time-budget-s 140 \
  > "$OUT/peer.txt" 2>&1
echo "torch peer rc=$?" >> "$S"
stamp peer
timeout 80 compute-sanitizer --tool memcheck "$BIN/test_cuda_engine" --test-case="CUDA graphs: replayed*" \
  > "$OUT/memcheck_graphs.txt" 2>&1
echo "memcheck graphs rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_graphs.txt")" >> "$S"
stamp memcheck
grep -E "^\||KV pool" "$OUT/bench.txt" | grep -v "^|---" >> "$S"
cat "$S"
