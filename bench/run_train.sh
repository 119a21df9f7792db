#!/usr/bin/env bash
# One device call: trains the reasoner (scripts/train_reasoner.py, detached so it survives a timed-out
# call while the machine is held), runs the compression GPU tests beside it, then exports the checkpoint
# to $OUT as a tar split in 15 MB parts (reassemble: cat reasoner.tar.part-* | tar x) and checks parity
# of the trained model with transformers and zipage-logits.
#   BIN=.carry-bin OUT=out bench/run_train.sh
set -u
OUT=${OUT:-out}
BIN=${BIN:-.carry-bin}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BIN:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
export ZIPAGE_TEST_MODEL="$PWD/models/stories260K.gguf"
S="$OUT/summary.txt"
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$S"
rm -rf /tmp/reasoner /tmp/train.done
setsid nohup bash -c "python3 scripts/train_reasoner.py --out /tmp/reasoner --log /tmp/train.log > /tmp/train.out 2>&1; echo \$? > /tmp/train.done" \
  > /dev/null 2>&1 < /dev/null &
( timeout 300 "$BIN/test_cuda_compression" > "$OUT/test_cuda_compression.log" 2>&1; echo "test_cuda_compression rc=$?" >> "$S" )
( timeout 300 "$BIN/test_cuda_engine" --test-case='*compression*' > "$OUT/test_cuda_engine.log" 2>&1; echo "test_cuda_engine rc=$?" >> "$S" )
echo "[$(($(date +%s) - t0)) s] tests" >> "$S"
grep -E "FAIL|checks passed" "$OUT/test_cuda_compression.log" | head -20 >> "$S"
grep -E "ERROR|test cases|assertions" "$OUT/test_cuda_engine.log" | head -20 >> "$S"
while [ ! -f /tmp/train.done ] && [ $(($(date +%s) - t0)) -lt ${TRAIN_WAIT_S:-560} ]; do sleep 5; done
echo "[$(($(date +%s) - t0)) s] training rc=$(cat /tmp/train.done 2>/dev/null || echo running)" >> "$S"
cp /tmp/train.log "$OUT/train.log" 2>/dev/null; tail -5 /tmp/train.out >> "$S"
if [ -f /tmp/reasoner/model.safetensors ]; then
  tar cf /tmp/reasoner.tar -C /tmp reasoner && split -b 15000000 /tmp/reasoner.tar "$OUT/reasoner.tar.part-"
  timeout 120 python3 scripts/reasoner_parity.py --zipage-logits "$BIN/zipage-logits" --model /tmp/reasoner --transformers \
    > "$OUT/parity.txt" 2>&1
  echo "parity rc=$?" >> "$S"; tail -15 "$OUT/parity.txt" >> "$S"
fi
tail -25 "$OUT/train.log" >> "$S" 2>/dev/null
cat "$S"
