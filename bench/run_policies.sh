#!/usr/bin/env bash
# One device call with prebuilt binaries ($BIN, default .carry-bin; logs to $OUT): every test_cuda_engine
# case (the Qwen3-8B-shape memory-plan case included), then zipage-bench for full KV and each built-in
# policy on the Qwen3-8B shape, long generation at budget 2048 (block 256, W 16), one process so the
# copy bandwidth and GEMM rate of the physical ceiling are measured once for all runs.
# Requests start with PROMPT_LEN-token prompts so the compressed steady state (a compression every 256
# tokens per request) is reached inside the time box.
#   BIN=.carry-bin OUT=out SECONDS_PER_POLICY=40 bench/run_policies.sh
set -u
SECS=${SECONDS_PER_POLICY:-40}
N=${NUM_REQUESTS:-256}
PROMPT_LEN=${PROMPT_LEN:-2048}
. "$(dirname "$0")/lib.sh"
timeout 200 "$BIN/test_cuda_engine" -s > "$OUT/test_cuda_engine.log" 2>&1
echo "test_cuda_engine rc=$? [$(($(date +%s) - t0)) s]" >> "$S"
grep -E "ERROR|test cases|assertions" "$OUT/test_cuda_engine.log" | head -20 >> "$S"
grep -E "memory plan|pool|profil|in use" "$OUT/test_cuda_engine.log" | head -12 >> "$S"
timeout 560 "$BIN/zipage-bench" --shape qwen3-8b --workload long --mode both --policy all --num-requests "$N" \
  --prompt-len "$PROMPT_LEN" --output-len 16384 --max-num-seqs "$N" --seconds "$SECS" --json "$OUT/bench.jsonl" \
  > "$OUT/bench.txt" 2>&1
echo "zipage-bench rc=$? [$(($(date +%s) - t0)) s]" >> "$S"
grep -E "^device|^shape|^\||KV pool|sampling|plan" "$OUT/bench.txt" | grep -v "^|---" >> "$S"
cat "$S"
