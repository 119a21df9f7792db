#!/usr/bin/env bash
# One device call: the accuracy grid of issue 11 (zipage-eval accuracy: full KV and every built-in policy at
# budgets of 1/2, 1/4 and 1/8 of full KV's mean sequence length) on the shipped reasoner, one level after
# another, each cell's JSON line appended to $OUT/accuracy.jsonl and the tables to $OUT/acc_LEVEL.txt.
# With TESTS=1 the GPU test binaries run first (in parallel, logs in $OUT).
#   BIN=.carry-bin OUT=out LEVELS="L2 L1" LIMIT=128 SAMPLES=4 TESTS=1 DEADLINE_S=570 bench/run_accuracy.sh
set -u
DEFAULT_DEADLINE=570
LEVELS=${LEVELS:-L2 L1}
LIMIT=${LIMIT:-128}
SAMPLES=${SAMPLES:-4}
MODEL=${MODEL:-models/reasoner}
FRACTIONS=${FRACTIONS:-0.5,0.25,0.125}
. "$(dirname "$0")/lib.sh"
if [ "${TESTS:-0}" = 1 ]; then
  for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
    [ -x "$BIN/$t" ] || continue
    ( timeout 170 "$BIN/$t" > "$OUT/$t.log" 2>&1; echo "$t: rc=$?" > "$OUT/$t.rc" ) &
  done
  wait
  cat "$OUT"/*.rc >> "$S" 2>/dev/null; rm -f "$OUT"/*.rc
  for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
    [ -f "$OUT/$t.log" ] || continue
    grep -E "ERROR|FAILED|SKIP" "$OUT/$t.log" | head -20 | sed "s/^/$t: /" >> "$S"
    tail -3 "$OUT/$t.log" | sed "s/^/$t: /" >> "$S"
  done
  stamp tests
fi
for level in $LEVELS; do
  [ "$(left)" -gt 30 ] || { stamp "no time left for $level"; break; }
  timeout $(( $(left) - 10 )) "$BIN/zipage-eval" accuracy --device cuda --model "$MODEL" \
    --data "data/reasoning/$level.jsonl" --limit "$LIMIT" -n "$SAMPLES" --budget-fractions "$FRACTIONS" \
    --json-out "$OUT/accuracy.jsonl" -q ${EVAL_ARGS:-} > "$OUT/acc_$level.txt" 2>&1
  stamp "accuracy $level rc=$?"
  grep -E "^\| " "$OUT/acc_$level.txt" >> "$S" 2>/dev/null
done
cat "$S"
