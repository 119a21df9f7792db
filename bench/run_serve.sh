#!/usr/bin/env bash
# Serving benchmark in one command: the same workload through the engine offline (zipage-generate, every
# request queued at once, one continuous batch) and through zipage-serve driven by bench/serve_load.py (N
# concurrent streaming /v1/completions requests), both on the same model with the same engine flags, so
# the result is a ratio server / offline of output tokens per second, with the server's TTFT, ITL, TPOT
# and end-to-end latency percentiles. Every request: one prompt of PROMPT_WORDS random words (no shared
# prefix), OUTPUT_LEN tokens (EOS ignored), greedy; RATES sweeps Poisson arrival rates (default inf: all at once).
# WORKLOAD=nano instead: nano-vllm's shape, each prompt 100-1024 words and each request its own output length
# of 100-1024 tokens (uniform, seeded; the same lengths offline, through --max-tokens-file, and served).
#
# The model: MODEL (a GGUF file or checkpoint directory), else a random-weight Qwen3 checkpoint of
# zipage-bench's SHAPE written by zipage-random-checkpoint into $WORK (qwen3-8b: 16 GB, about a minute).
# With ZIPAGE_BENCH=1 and a SHAPE, zipage-bench's long workload of the same shape runs too (its random
# weights built on the device), as a reference for the engine without the checkpoint loader.
# Prebuilt binaries from $BIN (zipage-serve, zipage-generate, zipage-random-checkpoint, zipage-bench);
# logs, JSON and summary.txt in $OUT.
#
#   SHAPE=qwen3-8b N=256 OUTPUT_LEN=1024 POLICIES=full_kv BIN=.carry-bin OUT=out bench/run_serve.sh
#   # CPU check at small scale (the bundled stories260K):
#   MODEL=models/stories260K.gguf DEVICE=cpu N=16 PROMPT_WORDS=24 OUTPUT_LEN=48 BIN=build/bin OUT=/tmp/serve \
#     FLAGS="--block-size 16" bench/run_serve.sh
set -u
OUT=${OUT:-out}
BIN=${BIN:-.carry-bin}
SHAPE=${SHAPE:-qwen3-8b}
MODEL=${MODEL:-}
WORK=${WORK:-/tmp/zipage-serve-bench}
N=${N:-256}
PROMPT_WORDS=${PROMPT_WORDS:-96}
OUTPUT_LEN=${OUTPUT_LEN:-1024}
DEVICE=${DEVICE:-auto}
POLICIES=${POLICIES:-full_kv zipage}
FLAGS=${FLAGS:---block-size 256 --max-batched-tokens 16384}
PROCS=${PROCS:-8}
WORKLOAD=${WORKLOAD:-fixed}  # fixed (PROMPT_WORDS, OUTPUT_LEN) or nano (100-1024 words, 100-1024 tokens)
RATES=${RATES:-inf}  # request rates to sweep (Poisson arrivals per second; inf: all at once)
STEP_TIMEOUT=${STEP_TIMEOUT:-480}  # seconds per step (a device call lasts at most 600)
mkdir -p "$OUT" "$WORK"
rm -f "$OUT/table.md" "$OUT/bench.jsonl"
export LD_LIBRARY_PATH="$PWD/$BIN:${LD_LIBRARY_PATH:-}"
HERE=$(cd "$(dirname "$0")" && pwd)
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } > "$OUT/summary.txt"

if [ -z "$MODEL" ]; then
  MODEL="$WORK/$SHAPE-random"
  if [ ! -f "$MODEL/model.safetensors" ]; then
    "$BIN/zipage-random-checkpoint" --shape "$SHAPE" --tokenizer "$HERE/../tests/data/qwen3" --out "$MODEL" \
      >> "$OUT/summary.txt" 2>&1 || { echo "zipage-random-checkpoint failed" | tee -a "$OUT/summary.txt"; exit 1; }
  fi
fi
if [ "$WORKLOAD" = nano ]; then
  python3 "$HERE/serve_load.py" prompts --out "$OUT/prompts.txt" --num "$N" --words 100 --words-max 1024 --seed 0 \
    --tokens 100 1024 --tokens-out "$OUT/lengths.txt" > /dev/null
  OFFLINE_LEN=(--max-tokens-file "$OUT/lengths.txt")
  LOAD_LEN=(--max-tokens-file "$OUT/lengths.txt")
  shape="100-1024 words, 100-1024 output tokens"
else
  python3 "$HERE/serve_load.py" prompts --out "$OUT/prompts.txt" --num "$N" --words "$PROMPT_WORDS" --seed 0 > /dev/null
  OFFLINE_LEN=(-n "$OUTPUT_LEN")
  LOAD_LEN=(--max-tokens "$OUTPUT_LEN")
  shape="$PROMPT_WORDS words, $OUTPUT_LEN output tokens"
fi
echo "model $MODEL; $N requests of $shape each (EOS ignored, greedy); device $DEVICE; flags $FLAGS" \
  | tee -a "$OUT/summary.txt"
# shellcheck disable=SC2206
COMMON=(--model "$MODEL" --device "$DEVICE" --max-num-seqs "$N" $FLAGS)

for pol in $POLICIES; do
  # Offline: every request queued at once, run to completion (zipage-generate's summary: throughput).
  timeout "$STEP_TIMEOUT" "$BIN/zipage-generate" "${COMMON[@]}" --policy "$pol" --prompts "$OUT/prompts.txt" \
    "${OFFLINE_LEN[@]}" --ignore-eos --temperature 0 > /dev/null 2> "$OUT/offline-$pol.log"
  rc=$?
  offline=$(tr '\r' '\n' < "$OUT/offline-$pol.log" | sed -n 's/.*throughput: \([0-9.]*\) tok\/s.*/\1/p' | tail -n 1)
  echo "offline $pol rc=$rc: ${offline:-?} tok/s ($(tr '\r' '\n' < "$OUT/offline-$pol.log" | grep -E '^requests:|^peak KV' | tr '\n' ' '))" \
    | tee -a "$OUT/summary.txt"

  # Server: the same flags; the load generator sends the same prompts at each rate of RATES (inf: all at once).
  "$BIN/zipage-serve" "${COMMON[@]}" --policy "$pol" --host 127.0.0.1 --port 0 --served-model-name bench \
    --max-queue "$N" --shutdown-timeout 5 > "$OUT/serve-$pol.out" 2> "$OUT/serve-$pol.log" &
  pid=$!
  url=""
  for _ in $(seq 1 "$STEP_TIMEOUT"); do
    url=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\)\/v1.*/\1/p' "$OUT/serve-$pol.log" | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if [ -z "$url" ]; then
    echo "serve $pol: the server did not start ($(tail -n 3 "$OUT/serve-$pol.log" | tr '\n' ' '))" | tee -a "$OUT/summary.txt"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    continue
  fi
  for rate in $RATES; do
    timeout "$STEP_TIMEOUT" python3 "$HERE/serve_load.py" run --base "$url" --model bench --prompts "$OUT/prompts.txt" \
      "${LOAD_LEN[@]}" --concurrency "$N" --procs "$PROCS" --request-rate "$rate" \
      --json "$OUT/load-$pol-$rate.json" > "$OUT/load-$pol-$rate.log" 2>&1
    echo "serve $pol rate $rate rc=$?: $(grep '^serve_load:' "$OUT/load-$pol-$rate.log" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
    python3 - "$OUT/load-$pol-$rate.json" "${offline:-0}" "$pol" "$rate" <<'EOF' >> "$OUT/table.md"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"| {sys.argv[3]} | {sys.argv[4]} | no load result ({e}) |"); sys.exit(0)
off = float(sys.argv[2])
ratio = r["output_tok_s"] / off if off > 0 else float("nan")
print(f"| {sys.argv[3]} | {sys.argv[4]} | {r['completed']}/{r['requests']} | {off:.0f} | {r['output_tok_s']:.0f} | {100 * ratio:.1f}% | "
      f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.1f} / {r['itl_ms_p99']:.1f} | "
      f"{r['tpot_ms_p50']:.1f} | {r['e2e_s_p50']:.1f} / {r['e2e_s_p99']:.1f} |")
EOF
  done
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1] + '/metrics').read().decode())" \
    "$url" > "$OUT/metrics-$pol.txt" 2>&1
  kill -TERM "$pid"
  wait "$pid"
  echo "serve $pol: server exit $?" >> "$OUT/summary.txt"
done

if [ "${ZIPAGE_BENCH:-0}" = 1 ] && [ -x "$BIN/zipage-bench" ]; then
  for pol in $POLICIES; do
    if [ "$pol" = full_kv ]; then mode=(--mode full); else mode=(--mode compressed --policy "$pol"); fi
    timeout "$STEP_TIMEOUT" "$BIN/zipage-bench" --shape "$SHAPE" --workload long "${mode[@]}" --num-requests "$N" \
      --prompt-len "$((PROMPT_WORDS + 4))" --output-len "$OUTPUT_LEN" --max-num-seqs "$N" --seconds 100000 \
      --json "$OUT/bench.jsonl" >> "$OUT/bench.txt" 2>&1
    echo "zipage-bench $SHAPE $pol rc=$?" >> "$OUT/summary.txt"
  done
  grep -E "^\| long" "$OUT/bench.txt" >> "$OUT/summary.txt"
fi
{
  echo "| policy | request rate | completed | offline tok/s | server tok/s | server / offline | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | e2e p50 / p99 s |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  cat "$OUT/table.md" 2>/dev/null
} >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
