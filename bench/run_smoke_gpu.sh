#!/usr/bin/env bash
# Device smoke of the tools on the GPU (prebuilt $BIN, logs to $OUT): zipage-generate --device cuda (fp32
# must give the golden CPU text of stories260K), the trained reasoner through zipage-generate (fp32, for a
# CPU comparison) and zipage-eval accuracy on the GPU, and compute-sanitizer memcheck of the compression
# kernels (quick grid).
set -u
. "$(dirname "$0")/lib.sh"
"$BIN/zipage-generate" --device cuda --dtype fp32 --prompt "Once upon a time" -n 40 --temperature 0 > "$OUT/gen_fp32.txt" 2>&1
echo "generate fp32 rc=$? golden=$(grep -c 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.' "$OUT/gen_fp32.txt")" >> "$S"
"$BIN/zipage-generate" --device cuda --prompt "Once upon a time" -n 40 --temperature 0 > "$OUT/gen_bf16.txt" 2>&1
echo "generate bf16 rc=$?" >> "$S"; tail -4 "$OUT/gen_bf16.txt" >> "$S"
"$BIN/zipage-generate" --device cuda --dtype fp32 --model "$BIN/reasoner" --prompt "$(cat "$BIN/l1_prompt.txt")" \
  --temperature 0 -n 200 --ignore-eos > "$OUT/gen_reasoner_fp32.txt" 2>&1
echo "generate reasoner fp32 rc=$?" >> "$S"
timeout 200 "$BIN/zipage-eval" accuracy --device cuda --model "$BIN/reasoner" --data data/reasoning/L1.jsonl --limit 64 \
  -n 4 --policies full_kv,streaming_llm,zipage --budget-fractions 0.5,0.25 --json-out "$OUT/acc.jsonl" > "$OUT/acc.txt" 2>&1
echo "eval accuracy rc=$? [$(($(date +%s) - t0)) s]" >> "$S"; cat "$OUT/acc.txt" | tail -20 >> "$S"
ZIPAGE_CUDA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck "$BIN/test_cuda_compression" > "$OUT/memcheck.txt" 2>&1
echo "memcheck compression rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt") [$(($(date +%s) - t0)) s]" >> "$S"
grep -E "checks passed" "$OUT/memcheck.txt" >> "$S"
cat "$S"
