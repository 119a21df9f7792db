#!/usr/bin/env bash
# One device call with prebuilt binaries ($BIN, default .carry-bin; logs to $OUT): the compression tests
# (every built-in policy's recipe on the GPU against the CPU reference; the engine with device compression
# against the host path) and the compression benchmark (every policy, batches 1/16/64/128).
#   BIN=.carry-bin OUT=out bench/run_compression_check.sh
set -u
. "$(dirname "$0")/lib.sh"
( timeout 300 "$BIN/test_cuda_compression" > "$OUT/test_cuda_compression.log" 2>&1; echo "test_cuda_compression rc=$?" >> "$S" ) &
( timeout 300 "$BIN/test_cuda_engine" --test-case='*compression*' > "$OUT/test_cuda_engine.log" 2>&1; echo "test_cuda_engine rc=$?" >> "$S" ) &
wait
echo "[$(($(date +%s) - t0)) s] tests" >> "$S"
timeout 200 "$BIN/bench_compression" --benchmark_out="$OUT/bench_compression.json" --benchmark_out_format=json \
  > "$OUT/bench_compression.txt" 2>&1
echo "bench_compression rc=$? [$(($(date +%s) - t0)) s]" >> "$S"
grep -E "FAIL|checks passed" "$OUT/test_cuda_compression.log" | head -30 >> "$S"
grep -E "ERROR|MESSAGE|device compression|test cases|assertions" "$OUT/test_cuda_engine.log" | head -40 >> "$S"
sed -n '/## Compression step/,$p' "$OUT/bench_compression.txt" >> "$S"
cat "$S"
