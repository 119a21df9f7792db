#!/usr/bin/env bash
# One device session, detached (it outlives a 10-minute call; `bench/run_fused_ab.sh wait` collects it):
#  1. build the GPU targets of .carry-src (bench/device_build.sh) and run every GPU test;
#  2. `zipage-bench --linear-bench` (the fused q|k|v and gate|up GEMMs beside the separate ones; LINEAR_BENCH=0: not);
#  3. with OP_TIMING_BOX=60: `zipage-bench --op-timing` (FP8 KV and weights, compressed), the decode step's GPU
#     time op by op (OP_TIMING_FLAGS: more zipage-bench flags, e.g. "--prompt-len 2048");
#     (with OP_TIMING_AB=1 a second time with AB_FLAG);
#  4. the Qwen3-8B long workload, compressed, without and with AB_FLAG (default --unfused-projections; e.g.
#     --no-fused-quantize or --fp8-decode-kernel=split_kv: one word), in boxes of AB_BOX s (0: skip): FP8 KV + FP8 weights, then bf16 + bf16 when AB_BF16=1;
#     AB_FLAG=none: the first run only; AB_FLAGS: more zipage-bench flags for both (e.g. "--prompt-len 2048": the compressed steady state at once);
#  5. cells of the 16k steady-state grid through bench/run_grid_cell.sh, one after another while BUDGET_S leaves
#     room: GRID_CELLS="MODE:KV:WEIGHTS:BOX ..." (e.g. "full:fp8:fp8:900 compressed:fp8:fp8:300": the ratio
#     compressed / full KV measured in one session), else the one cell GRID_MODE compressed|full, GRID_KV
#     fp8|bf16, GRID_WEIGHTS fp8|bf16, GRID_BOX s (900). GRID_BOX=0 or GRID_CELLS=none: no grid.
# PREBUILT=.carry-bin: run binaries built here instead of building on the device (bench/device_build.sh prebuilt).
# AB_OLD=.carry-old-bin (with PREBUILT): step 4 compares two builds instead of a flag: the zipage-bench of an older
# commit (`DEST=.carry-old-bin BUILD=... COMMIT=... bench/device_build.sh prebuilt`) against PREBUILT's, FP8 KV and
# weights, AB_REPS pairs alternated (old new, new old, ...), each box AB_BOX s with AB_FLAGS.
# With ELEMENTWISE_BENCH=1, after the tests: bench_elementwise (the decode step's small kernels against the copy
# bandwidth) into elementwise.txt.
# SERIAL_TESTS / CONCURRENT_TESTS: the GPU tests to build and run (default: all; e.g. SERIAL_TESTS="" and
# CONCURRENT_TESTS="test_cuda_wgmma test_cuda_kernels" for a short build when only the kernels changed).
# With FP8_GEMM_CONFIGS=1, after the tests: bench_fp8_gemm_configs (every cuBLASLt configuration of the block-scaled
# FP8 GEMM at 512-1,024 rows against the heuristic's) into fp8_gemm_configs.txt.
# With PREFILL_BENCH=1, after the tests: bench_decode_attention's prefill cases (mma.sync and wgmma kernels
# against a bf16 GEMM measured in the same run) into prefill_bench.txt, or the cases ATTN_BENCH_FILTER names (e.g.
# 'prefill|steady': also decode at the compressed engine's steady-state shape, against the copy bandwidth; ATTN_BENCH_TIMEOUT s, 240 by default); OP_TIMING_BOX=0 and AB_BOX=0 skip
# steps 3-4. With PREFILL_ENGINE_BOX=60: prefill end to end, zipage-bench on PREFILL_ENGINE_SHAPES ("REQUESTS:PROMPT
# ...", default "128:8192": 128 prompts of 8,192 tokens; bf16 KV and weights, full KV, 16 output tokens) once per
# kernel of PREFILL_ENGINE_KERNELS (default "mma_sync automatic"): prefill tok/s = the "prompt tokens" over the
# "wall" seconds of prefill_engine_PROMPT_KERNEL.txt.
# Every zipage-bench run of steps 3-4 and the attention bench also sample the GPU's SM clock, power and clock-event
# reasons (nvidia-smi every 200 ms; CLOCKS=0: not) into NAME_clocks.csv, with a summary line in status.txt.
#   call 1: bench/run_fused_ab.sh start; bench/run_fused_ab.sh wait
#   call 2: bench/run_fused_ab.sh wait     (issued at once; repeat until it says done)
# "At once" matters: the device machine is released after ~30 s idle between calls, and the driver and its
# results go with it. A call returns at most 8 files, so each `wait` packs everything so far into one
# $OUT/drive.tgz beside status.txt and gpu_tests_summary.txt: once a call returns, its results are here
# (2026-12-02 08:33: call 3's op-timing tables were left out by the file limit, then lost with the machine).
set -u
cd "$(dirname "$0")/.."
D=${DRIVE_DIR:-/tmp/drive}
OUT=${OUT:-out}
mkdir -p "$D" "$OUT"
case "${1:-}" in
  start)
    rm -rf "$D" && mkdir -p "$D"
    setsid nohup bash "$0" run > "$D/driver.log" 2>&1 < /dev/null &
    echo "started at $(date -u +%H:%M:%S)" ;;
  run)
    T0=$(date +%s)
    st() { echo "[$(( $(date +%s) - T0 )) s] $*" >> "$D/status.txt"; }
    # SM clock, power and clock-event reasons every 200 ms while a run goes (CLOCKS=0: not), into NAME_clocks.csv,
    # summarised in status.txt: whether a run's kernels ran at lower clocks than the same kernels alone.
    clock_fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
    nvidia-smi --query-gpu=$clock_fields --format=csv,noheader > /dev/null 2>&1 ||
      clock_fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
    clocks_start() {
      [ "${CLOCKS:-1}" = 1 ] || return 0
      nvidia-smi --query-gpu=$clock_fields --format=csv,noheader,nounits -lms 200 > "$D/$1_clocks.csv" 2>&1 &
      CLOCKS_PID=$!
    }
    clocks_stop() {
      [ "${CLOCKS:-1}" = 1 ] || return 0
      kill "$CLOCKS_PID" 2> /dev/null; wait "$CLOCKS_PID" 2> /dev/null
      st "$1 clocks: $(awk -F', *' 'NF >= 6 && $2 + 0 > 0 { n++; sm += $2; p += $4; if (min == "" || $2 < min) min = $2;
        if ($2 > max) max = $2; r[$6]++ } END { if (n) { printf "%d samples, SM MHz mean %.0f (min %d, max %d), power mean %.0f W, reasons", n, sm / n, min, max, p / n;
        for (k in r) printf " %s x%d", k, r[k] } else printf "none" }' "$D/$1_clocks.csv")"
    }
    ALL_SERIAL="test_gpu_device test_cuda_engine test_cuda_fp8_gemm"
    ALL_CONCURRENT="test_cuda_wgmma test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_fp8_kv test_nccl_communicator test_tp_nccl_engine"
    SERIAL=${SERIAL_TESTS-$ALL_SERIAL}
    CONC=${CONCURRENT_TESTS-$ALL_CONCURRENT}
    # The binaries' links live under /tmp: each `run` call copies the working tree anew, which would remove an
    # untracked folder in it while this driver still runs.
    B=/tmp/dev-bin
    mkdir -p "$B"
    if [ -n "${PREBUILT:-}" ]; then
      # Binaries built on the development machine (bench/device_build.sh prebuilt), their library beside them.
      st "$(B="$B" PREBUILT="$PREBUILT" bench/device_build.sh unpack)"
      export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      [ -z "${AB_OLD:-}" ] || st "$(B=/tmp/dev-old PREBUILT="$AB_OLD" bench/device_build.sh unpack)"
    else
      TARGETS="$SERIAL $CONC zipage-bench bench_decode_attention bench_fp8_gemm_configs" \
        JOBS=16 OUT="$D" bench/device_build.sh build > "$D/build_status.txt" 2>&1
      st "build rc=$?"
      find /tmp/bd -maxdepth 3 -type f -perm -u+x \( -name 'test_*' -o -name zipage-bench -o -name 'bench_*' \) -exec ln -sfn {} "$B"/ \;
    fi
    # TESTS_DEADLINE_S: all the tests together (2026-12-07: 260 s cut test_cuda_fp8_kv, which ran concurrently
    # after a serial test_cuda_fp8_gemm of 148 s).
    OUT="$D" DEADLINE_S="${TESTS_DEADLINE_S:-360}" BIN="$B" TESTS="$SERIAL" CONCURRENT="$CONC" bench/run_gpu_tests.sh > /dev/null 2>&1
    cp /tmp/test_cuda_engine.log /tmp/test_cuda_fp8_gemm.log /tmp/test_cuda_kernels.log /tmp/test_cuda_wgmma.log /tmp/test_cuda_fp8_kv.log "$D/" 2>/dev/null
    st "tests done: test_cuda_kernels $(tail -1 "$D/test_cuda_kernels.log" 2>/dev/null); $(grep -c '^\[FAIL\]' "$D/test_cuda_kernels.log" 2>/dev/null) [FAIL] lines"
    st "test_cuda_wgmma: $(grep -E 'test cases:|SKIPPED' "$D/test_cuda_wgmma.log" 2>/dev/null | tr -s ' ' | tr '\n' ' ')"
    if [ "${PREFILL_BENCH:-0}" = 1 ]; then
      clocks_start prefill_bench
      timeout "${ATTN_BENCH_TIMEOUT:-240}" "$B"/bench_decode_attention --benchmark_filter="${ATTN_BENCH_FILTER:-prefill}" > "$D/prefill_bench.txt" 2>&1
      st "prefill bench rc=$?"
      clocks_stop prefill_bench
    fi
    if [ "${ELEMENTWISE_BENCH:-0}" = 1 ]; then
      timeout 150 "$B"/bench_elementwise > "$D/elementwise.txt" 2>&1
      st "elementwise bench rc=$?"
    fi
    if [ "${FP8_GEMM_CONFIGS:-0}" = 1 ]; then
      timeout 150 "$B"/bench_fp8_gemm_configs > "$D/fp8_gemm_configs.txt" 2>&1
      st "fp8 gemm configs rc=$?: $(grep -cE '^\| (o|q|gate|down)' "$D/fp8_gemm_configs.txt") rows"
    fi
    if [ "${PREFILL_ENGINE_BOX:-0}" -gt 0 ]; then
      for shape in ${PREFILL_ENGINE_SHAPES:-128:8192}; do
        n=${shape%%:*} len=${shape##*:}
        for k in ${PREFILL_ENGINE_KERNELS:-mma_sync automatic}; do
          f="$D/prefill_engine_${len}_$k.txt"
          timeout $(( PREFILL_ENGINE_BOX + 150 )) "$B"/zipage-bench --shape qwen3-8b --workload long --mode full \
            --num-requests "$n" --prompt-len "$len" --output-len 16 --max-num-seqs "$n" --seconds "$PREFILL_ENGINE_BOX" \
            --kv-cache-dtype auto --quantization none --prefill-kernel "$k" > "$f" 2>&1
          st "prefill engine $n x $len $k rc=$?: $(grep -oE 'prompt tokens [0-9]+|[0-9.]+ s wall|prefill attention [a-z_]+' "$f" | tr '\n' ' ')"
        done
      done
    fi
    if [ "${LINEAR_BENCH:-1}" = 1 ]; then
      timeout 150 "$B"/zipage-bench --shape qwen3-8b --linear-bench > "$D/linear.txt" 2>&1
      st "linear bench rc=$?"
    fi
    long_run() {  # long_run NAME BOX KV QUANT [FLAGS]: the 8B long workload, compressed, into $D/NAME.txt
      local name=$1 box=$2 kv=$3 quant=$4 rc
      shift 4
      clocks_start "$name"
      timeout $(( box + 150 )) "${ZB:-$B/zipage-bench}" --shape qwen3-8b --workload long --mode compressed --num-requests 1024 \
        --output-len 16384 --max-num-seqs 1024 --seconds "$box" --kv-cache-dtype "$kv" --quantization "$quant" "$@" \
        > "$D/$name.txt" 2>&1
      rc=$?
      st "$name rc=$rc: $(grep -E '^\| long' "$D/$name.txt" | head -1) $(grep -oE 'energy, steady half: .*' "$D/$name.txt" | head -1)"
      clocks_stop "$name"
    }
    # Where a decode step's GPU time goes, op by op (eager, synchronised).
    flag=${AB_FLAG:---unfused-projections}
    tag=${flag#--}
    if [ "${OP_TIMING_BOX:-0}" -gt 0 ]; then
      # OP_TIMING_FLAGS="--prompt-len 2048": every request starts at its budget, so after the prompts' prefill the
      # box times the compressed steady state's steps (batch ~663, ~2.2k cached tokens) instead of short requests.
      # shellcheck disable=SC2086
      long_run op_timing "$OP_TIMING_BOX" fp8 fp8 --op-timing ${OP_TIMING_FLAGS:-}
      # shellcheck disable=SC2086
      if [ "${OP_TIMING_AB:-0}" = 1 ]; then long_run "op_timing_$tag" "$OP_TIMING_BOX" fp8 fp8 --op-timing ${OP_TIMING_FLAGS:-} "$flag"; fi
    fi
    # shellcheck disable=SC2086
    ab() { long_run "ab_kv$1_w$2${3:+_$tag}" "${AB_BOX:-100}" "$1" "$2" --json "$D/ab.jsonl" ${AB_FLAGS:-} ${3:+"$3"}; }
    if [ "${AB_BOX:-100}" -gt 0 ] && [ -n "${AB_OLD:-}" ]; then
      # Pairs in alternating order, so that a drift of the machine's clocks or temperature falls on both builds.
      for rep in $(seq 1 "${AB_REPS:-2}"); do
        order="old new"; [ $(( rep % 2 )) = 0 ] && order="new old"
        for v in $order; do
          zb=$B/zipage-bench; [ "$v" = old ] && zb=/tmp/dev-old/zipage-bench
          # shellcheck disable=SC2086
          ZB=$zb long_run "ab_${v}_$rep" "${AB_BOX:-100}" fp8 fp8 --json "$D/ab.jsonl" ${AB_FLAGS:-}
        done
      done
    elif [ "${AB_BOX:-100}" -gt 0 ]; then
      ab fp8 fp8 ""
      [ "$flag" = none ] || ab fp8 fp8 "$flag"
      if [ "${AB_BF16:-0}" = 1 ]; then ab auto none ""; [ "$flag" = none ] || ab auto none "$flag"; fi
    fi
    cells=${GRID_CELLS:-${GRID_MODE:-compressed}:${GRID_KV:-fp8}:${GRID_WEIGHTS:-fp8}:${GRID_BOX:-900}}
    [ "${GRID_BOX:-900}" = 0 ] && cells=none
    for cell in $cells; do
      [ "$cell" = none ] && break
      IFS=: read -r mode kv weights box <<< "$cell"
      left=$(( ${BUDGET_S:-1700} - ($(date +%s) - T0) ))
      if [ "$left" -le $(( box + 90 )) ]; then st "grid cell $cell skipped: $left s of budget left"; continue; fi
      st "grid cell $cell: box $box s ($left s of budget left)"
      # bench/run_grid_cell.sh's own command, waited for here (this driver is already detached).
      KV=$kv WEIGHTS=$weights MODE=$mode BOX=$box ZB="$B/zipage-bench" OUT="$D" bench/run_grid_cell.sh start > /dev/null
      WAIT_S=$(( box + 150 )) OUT="$D" bench/run_grid_cell.sh wait > "$D/grid_status.txt" 2>&1
      st "grid cell $cell: $(tr '\n' ' ' < "$D/grid_status.txt")"
    done
    touch "$D/done" ;;
  wait)
    t=$(date +%s)
    while [ ! -f "$D/done" ] && [ $(( $(date +%s) - t )) -lt "${WAIT_S:-560}" ]; do sleep 5; done
    # A grid cell's log as it stands (zipage-bench flushes a progress line a minute): if the machine is taken back
    # before the box ends, its per-minute rates are here (2026-12-04 19:57: a 900 s box lost at ~560 s, no reading).
    mkdir -p "$D/grid_partial" && cp "${GRID_DIR:-/tmp/grid}"/*.txt "$D/grid_partial/" 2>/dev/null
    grep -h "progress:" "$D"/grid_partial/*.txt 2>/dev/null | tail -2
    tar czf "$OUT/drive.tgz" -C "$D" . 2>/dev/null
    cp "$D/status.txt" "$D/gpu_tests_summary.txt" "$OUT/" 2>/dev/null
    cat "$D/status.txt" 2>/dev/null
    [ -f "$D/done" ] && echo "done" || echo "still running: call wait again (at once)" ;;
  *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
