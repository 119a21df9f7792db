#!/usr/bin/env bash
# One device call, one training configuration per GPU in parallel (nvidia-h200 runs the first only;
# nvidia-h200-x2 runs two): each trains scripts/train_reasoner.py (detached) into /tmp/reasoner-K, then the
# configuration with the best final teacher-forced exact match on its hardest level is exported to $OUT as a
# tar split in 15 MB parts (cat reasoner.tar.part-* | tar x), evaluated with zipage-eval on the GPU on its
# hardest level and checked for parity with zipage-logits and transformers, in whatever time is left.
#   BIN=.carry-bin OUT=out DEADLINE_S=580 \
#   CONFIG_0="--minutes 7.0 --levels L1,L2 --result-weight 4" CONFIG_1="--minutes 7.0 --result-weight 4 --result-ramp 0.3" \
#   bench/run_train3.sh
# EVAL_ARGS replaces the GPU eval's problem count, samples, policies and budgets; PARALLEL_CMD runs beside the
# training (see below).
set -u
. "$(dirname "$0")/lib.sh"
gpus=$(nvidia-smi --list-gpus | wc -l)
configs=("${CONFIG_0:---minutes 7.0 --levels L1,L2 --result-weight 4}" "${CONFIG_1:---minutes 7.0 --result-weight 4 --result-ramp 0.3}")
n=$(( gpus < ${#configs[@]} ? gpus : ${#configs[@]} ))
for ((k = 0; k < n; ++k)); do
  rm -rf /tmp/reasoner-$k /tmp/train-$k.done
  echo "config $k on GPU $k: ${configs[$k]}" >> "$S"
  CUDA_VISIBLE_DEVICES=$k setsid nohup bash -c "python3 scripts/train_reasoner.py --out /tmp/reasoner-$k --log /tmp/train-$k.log ${configs[$k]} > /tmp/train-$k.out 2>&1; echo \$? > /tmp/train-$k.done" \
    > /dev/null 2>&1 < /dev/null &
done
# PARALLEL_CMD: a command run beside the training (e.g. GPU tests that take a minute), output in $OUT/parallel.log.
if [ -n "${PARALLEL_CMD:-}" ]; then
  ( bash -c "$PARALLEL_CMD" > "$OUT/parallel.log" 2>&1; echo "parallel rc=$? [$(($(date +%s) - t0)) s]" >> "$S" ) &
  parallel_pid=$!
fi
all_done() { for ((k = 0; k < n; ++k)); do [ -f /tmp/train-$k.done ] || return 1; done; }
while ! all_done && [ "$(left)" -gt 20 ]; do sleep 3; done
best=-1 best_exact=-1 best_level=L1
for ((k = 0; k < n; ++k)); do
  echo "[$(($(date +%s) - t0)) s] config $k rc=$(cat /tmp/train-$k.done 2>/dev/null || echo running)" >> "$S"
  cp /tmp/train-$k.log "$OUT/train-$k.log" 2>/dev/null
  f=/tmp/reasoner-$k/training_summary.json
  [ -f "$f" ] || continue
  read -r level exact < <(python3 -c "import json,sys; s=json.load(open('$f')); lv=sorted(s['teacher_forced'])[-1]; print(lv, s['teacher_forced'][lv]['exact'])")
  echo "config $k: hardest level $level, teacher-forced exact $exact" >> "$S"
  if python3 -c "import sys; sys.exit(0 if float('$exact') > float('$best_exact') else 1)"; then best=$k best_exact=$exact best_level=$level; fi
done
if [ "$best" -ge 0 ]; then
  M=/tmp/reasoner-$best
  echo "exported: config $best ($best_level exact $best_exact)" >> "$S"
  cp -r "$M" /tmp/reasoner && tar cf /tmp/reasoner.tar -C /tmp reasoner && split -b 15000000 /tmp/reasoner.tar "$OUT/reasoner.tar.part-"
  [ "$(left)" -gt 25 ] && timeout $(( $(left) - 15 )) "$BIN/zipage-eval" accuracy --device cuda --model "$M" \
    --data data/reasoning/$best_level.jsonl ${EVAL_ARGS:---limit 64 -n 2 --policies full_kv,streaming_llm,snapkv,zipage --budget-fractions 0.25} \
    --json-out "$OUT/acc.jsonl" -q > "$OUT/acc_$best_level.txt" 2>&1
  echo "eval $best_level rc=$? [$(($(date +%s) - t0)) s]" >> "$S"; grep -E "^\| " "$OUT/acc_$best_level.txt" >> "$S" 2>/dev/null
  [ "$(left)" -gt 40 ] && timeout $(( $(left) - 10 )) python3 scripts/reasoner_parity.py --zipage-logits "$BIN/zipage-logits" \
    --model "$M" --transformers > "$OUT/parity.txt" 2>&1 && echo "parity ok" >> "$S"
fi
[ -n "${parallel_pid:-}" ] && wait "$parallel_pid"
for ((k = 0; k < n; ++k)); do grep -E "held-out|warm-up|greedy|cap|compile" "$OUT/train-$k.log" 2>/dev/null | tail -8 | sed "s/^/[$k] /" >> "$S"; done
cat "$S"
