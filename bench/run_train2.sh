#!/usr/bin/env bash
# One device call: train the reasoner (scripts/train_reasoner.py, detached), export it to $OUT as a tar
# split in 15 MB parts (reassemble: cat reasoner.tar.part-* | tar x), check parity with transformers and
# zipage-logits, then a small zipage-eval accuracy grid on the GPU in whatever time is left (DEADLINE_S).
#   BIN=.carry-bin OUT=out TRAIN_ARGS="--minutes 7.0" DEADLINE_S=580 bench/run_train2.sh
set -u
OUT=${OUT:-out}
BIN=${BIN:-.carry-bin}
DEADLINE=${DEADLINE_S:-580}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BIN:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
S="$OUT/summary.txt"
t0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - t0))); }
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } > "$S"
rm -rf /tmp/reasoner /tmp/train.done
setsid nohup bash -c "python3 scripts/train_reasoner.py --out /tmp/reasoner --log /tmp/train.log ${TRAIN_ARGS:-} > /tmp/train.out 2>&1; echo \$? > /tmp/train.done" \
  > /dev/null 2>&1 < /dev/null &
while [ ! -f /tmp/train.done ] && [ "$(left)" -gt 20 ]; do sleep 3; done
echo "[$(($(date +%s) - t0)) s] training rc=$(cat /tmp/train.done 2>/dev/null || echo running)" >> "$S"
cp /tmp/train.log "$OUT/train.log" 2>/dev/null
if [ -f /tmp/reasoner/model.safetensors ]; then
  tar cf /tmp/reasoner.tar -C /tmp reasoner && split -b 15000000 /tmp/reasoner.tar "$OUT/reasoner.tar.part-"
  for L in L3 L2 L1; do
    [ "$(left)" -gt 25 ] || break
    timeout $(( $(left) - 15 )) "$BIN/zipage-eval" accuracy --device cuda --model /tmp/reasoner --data data/reasoning/$L.jsonl \
      --limit 64 -n 2 --policies full_kv,streaming_llm,snapkv,zipage --budget-fractions 0.25 --json-out "$OUT/acc.jsonl" -q \
      > "$OUT/acc_$L.txt" 2>&1
    echo "eval $L rc=$? [$(($(date +%s) - t0)) s]" >> "$S"; grep -E "^\| " "$OUT/acc_$L.txt" >> "$S"
  done
  [ "$(left)" -gt 40 ] && timeout $(( $(left) - 10 )) python3 scripts/reasoner_parity.py --zipage-logits "$BIN/zipage-logits" \
    --model /tmp/reasoner --transformers > "$OUT/parity.txt" 2>&1 && echo "parity ok" >> "$S"
fi
grep -E "held-out|warm-up|greedy|cap|compile" "$OUT/train.log" | tail -14 >> "$S" 2>/dev/null
cat "$S"
