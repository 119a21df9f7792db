#!/usr/bin/env bash
# One cell of issue 14's steady-state grid, {bf16, fp8} KV x {full, compressed} x {bf16, fp8} weights, on the
# Qwen3-8B long workload (1,024 requests x 16,384 new tokens), in a box long enough for the 16k regime. A cell
# outlives one device call (10 minutes at most), so it runs detached and a later call, issued at once so that
# the machine stays held, collects it:
#   call 1: KV=fp8 WEIGHTS=fp8 MODE=compressed BOX=900 bench/run_grid_cell.sh start   # build if needed, start, return
#   call 2: bench/run_grid_cell.sh wait    # up to WAIT_S (560) s; copies the log and JSON line to $OUT when done
#   call 3: bench/run_grid_cell.sh wait    # ... if the box is not over yet
# FLAGS adds zipage-bench flags, e.g. FLAGS="--prompt-len 2048": every request starts at its budget, so a compressed
# box's second half is the steady state from its first step (with 128-token prompts a request needs ~1,920 decode
# steps to reach it).
# The binary: $ZB, else /tmp/bd's zipage-bench, built from .carry-src (bench/device_build.sh) when missing.
set -u
cd "$(dirname "$0")/.."
DIR=${GRID_DIR:-/tmp/grid}
OUT=${OUT:-out}
mkdir -p "$DIR" "$OUT"
case "${1:-}" in
  start)
    KV=${KV:-fp8} WEIGHTS=${WEIGHTS:-fp8} MODE=${MODE:-compressed} BOX=${BOX:-900}
    ZB=${ZB:-$(find /tmp/bd -name zipage-bench -type f 2>/dev/null | head -1)}
    if [ -z "$ZB" ]; then
      TARGETS=zipage-bench JOBS=${JOBS:-16} bench/device_build.sh build > "$OUT/grid_build.txt" 2>&1 || { tail -20 "$OUT/grid_build.txt"; exit 1; }
      ZB=$(find /tmp/bd -name zipage-bench -type f | head -1)
    fi
    quant=$([ "$WEIGHTS" = fp8 ] && echo fp8 || echo none)
    kvd=$([ "$KV" = fp8 ] && echo fp8 || echo auto)
    name="8b-$MODE-kv$KV-w$WEIGHTS-${BOX}s${TAG:+-$TAG}"  # TAG: a suffix that tells runs with FLAGS apart
    echo "$name" > "$DIR/current"
    rm -f "$DIR/$name.done"
    setsid nohup bash -c "\"$ZB\" --shape qwen3-8b --workload long --mode $MODE --num-requests 1024 --output-len 16384 \
      --max-num-seqs 1024 --seconds $BOX --kv-cache-dtype $kvd --quantization $quant ${FLAGS:-} --json \"$DIR/$name.jsonl\" \
      > \"$DIR/$name.txt\" 2>&1; echo \$? > \"$DIR/$name.done\"" > /dev/null 2>&1 < /dev/null &
    echo "started $name (box $BOX s) at $(date -u +%H:%M:%S); collect with: bench/run_grid_cell.sh wait" ;;
  wait)
    name=$(cat "$DIR/current" 2>/dev/null) || { echo "no cell started in $DIR"; exit 1; }
    t0=$(date +%s)
    while [ ! -f "$DIR/$name.done" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-560}" ]; do sleep 5; done
    cp "$DIR/$name.txt" "$OUT/" 2>/dev/null
    if [ -f "$DIR/$name.done" ]; then
      cp "$DIR/$name.jsonl" "$OUT/" 2>/dev/null
      echo "$name finished (rc $(cat "$DIR/$name.done")):"
      grep -E '^\| long' "$DIR/$name.txt"
    else
      echo "$name still running after ${WAIT_S:-560} s: call wait again (at once)"
      grep "progress:" "$DIR/$name.txt" | tail -1  # zipage-bench's per-minute line, already in $OUT's copy of the log
    fi ;;
  *) echo "usage: KV=bf16|fp8 WEIGHTS=bf16|fp8 MODE=full|compressed BOX=seconds $0 start | $0 wait" >&2; exit 2 ;;
esac
