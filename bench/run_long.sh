#!/usr/bin/env bash
# The long-generation workload at its real size on one device call: 1,024 requests, 128-token prompts,
# 16,384 new tokens each (EOS ignored), full KV then Compressed PagedAttention (budget 2048, block 256),
# each time-boxed to $SECONDS_PER_MODE seconds (steady state: the box's second half). Prebuilt binaries
# from $BIN, logs to $OUT.   SHAPE=qwen3-0.6b SECONDS_PER_MODE=270 BIN=.carry-bin OUT=out bench/run_long.sh
set -u
SHAPE=${SHAPE:-qwen3-0.6b}
SECS=${SECONDS_PER_MODE:-270}
. "$(dirname "$0")/lib.sh"
for mode in full compressed; do
  timeout $((SECS + 90)) "$BIN/zipage-bench" --shape "$SHAPE" --workload long --mode "$mode" --num-requests 1024 \
    --output-len 16384 --max-num-seqs 1024 --seconds "$SECS" --json "$OUT/bench.jsonl" >> "$OUT/bench.txt" 2>&1
  echo "$SHAPE $mode rc=$?" >> "$OUT/summary.txt"
done
grep -E "^\||KV pool" "$OUT/bench.txt" | grep -v "^|---" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
