#!/usr/bin/env bash
# zipage-generate over random flag combinations (seeded, so a failure reproduces): every policy, block sizes 1-256,
# budgets of 1-64 blocks, windows, sampling flags, seeds, tiny KV pools and step limits, tensor parallelism, priority
# scheduling, prefix caching off, synchronous compression, query slots, stop strings, empty / long / non-ASCII prompts.
# Each run must either generate (exit 0, its summary counting every prompt) or refuse with a named error (exit 1, a line
# "zipage-generate: error: ..."); a crash, an abort, a hang (60 s) or a silent failure fails the sweep.
# A quarter of the runs (when CHECKPOINT, a Hugging Face checkpoint directory, is given) load it instead of the
# bundled stories260K, some with --chat. DEVICE=cuda runs on the GPU and draws its flags too (--dtype, FP8 KV cache,
# FP8 weights, memory utilisation); the default is the CPU.
#   [DEVICE=cuda] tests/cli/flag_sweep.sh ZIPAGE_GENERATE [RUNS=40] [SEED=1] [CHECKPOINT]
set -u
gen=$1 runs=${2:-40} RANDOM=${3:-1} checkpoint=${4:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
words=(once upon a time there was little girl named lily she loved to play outside park dog cat sun big happy)
for ((i = 0; i < 12; ++i)); do  # one prompt per line: 1-200 words, some with tabs and non-ASCII text
  line=""
  for ((w = 0; w < 1 + RANDOM % (i % 3 == 0 ? 200 : 12); ++w)); do line+="${words[RANDOM % ${#words[@]}]} "; done
  ((i % 4 == 0)) && line=$'\xc3\xbcn\xc3\xafc\xc3\xb6d\xc3\xa9 \xf0\x9f\x98\x80 \t'"$line"
  echo "$line"
done > "$dir/prompts.txt"
long=$(printf 'x%.0s' $(seq 3000))  # 3,000 tokens: past stories260K's context of 2,048

pick() { local a=("$@"); echo "${a[RANDOM % $#]}"; }
maybe() { ((RANDOM % 100 < $1)); }
failed=0
for ((r = 1; r <= runs; ++r)); do
  policy=$(pick full_kv streaming_llm h2o snapkv rkv gkv zipage zipage)
  bs=$(pick 1 2 4 8 16 16 32 64 256)
  args=(--device "${DEVICE:-cpu}" --policy "$policy" --block-size "$bs")
  if [ "${DEVICE:-cpu}" = cuda ]; then
    maybe 30 && args+=(--dtype "$(pick bf16 fp32)")
    maybe 30 && args+=(--kv-cache-dtype fp8)
    maybe 20 && args+=(--quantization fp8)
    maybe 20 && args+=(--gpu-memory-utilization "$(pick 0.05 0.3 0.9)")
  fi
  if [ -n "$checkpoint" ] && maybe 25; then
    args+=(--model "$checkpoint")
    maybe 50 && args+=(--chat)
  fi
  [ "$policy" != full_kv ] && args+=(--budget $((bs * $(pick 1 2 3 4 8 16 64))) --window "$(pick 1 4 16 32 100)")
  maybe 30 && args+=(--temperature "$(pick 0 0.7 1.5)")
  maybe 30 && args+=(--top-k "$(pick 1 5 40)")
  maybe 20 && args+=(--top-p "$(pick 0.1 0.9)")
  maybe 20 && args+=(--repetition-penalty 1.3)
  maybe 20 && args+=(--presence-penalty 1.0 --frequency-penalty -0.5)
  maybe 30 && args+=(--seed $((RANDOM * 32768 + RANDOM)))
  maybe 30 && args+=(--max-num-seqs "$(pick 1 2 3 7 64)")
  maybe 30 && args+=(--max-batched-tokens "$(pick 1 7 64 512)")
  maybe 30 && args+=(--kv-cache-mib "$(pick 0.05 0.5 4 64)")
  maybe 20 && args+=(--no-prefix-caching)
  maybe 20 && args+=(--sync-compression)
  maybe 15 && args+=(--tp "$(pick 2 4)")
  maybe 20 && args+=(--scheduling-policy priority)
  maybe 20 && args+=(--ignore-eos)
  maybe 20 && args+=(--allow-beyond-context)
  maybe 20 && args+=(--stop the)
  maybe 20 && args+=(--no-hybrid)
  maybe 20 && args+=(--query-slots "$(pick 0 1 3)")
  requests=1
  if maybe 50; then args+=(--prompts "$dir/prompts.txt") requests=12; else args+=(--prompt "$(pick "Once upon a time" "" x Lily "$long")"); fi
  args+=(-n "$(pick 1 8 64 300)")
  timeout 60 "$gen" "${args[@]}" > "$dir/out" 2> "$dir/err"
  rc=$?
  shown="${args[*]}"
  shown=${shown//$long/<3000 x>}
  shown=${shown//$dir/TMP}
  if [ $rc -eq 0 ] && grep -q "^requests: $requests " "$dir/err"; then  # the run's summary, on stderr
    echo "run $r: ok: $shown"
  elif [ $rc -eq 1 ] && grep -q "^zipage-generate: error: " "$dir/err"; then
    echo "run $r: refused ($(grep -m1 "^zipage-generate: error: " "$dir/err" | cut -c25-140)): $shown"
  else
    echo "run $r: FAILED (exit $rc): $shown"
    tail -n 5 "$dir/err"
    failed=$((failed + 1))
  fi
done
echo "$failed of $runs runs failed"
[ $failed -eq 0 ]
