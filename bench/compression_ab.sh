#!/usr/bin/env bash
# Before/after of the compression kernels in one device call: two commits built side by side on the device,
# the new one's tests (full grid, then the quick subset under compute-sanitizer memcheck and racecheck), then
# bench_compression of both, alternating, and ncu of every compression kernel of both (FP8, batch 16).
#   here:       bench/compression_ab.sh pack OLD [NEW]   # NEW defaults to HEAD: .carry-src (NEW, + nccl.h),
#                                                         # .carry-old (OLD), both `git archive`, no data
#   device:     run with carry [".carry-src"] (.carry-old travels as an untracked folder):
#               (setsid nohup bench/compression_ab.sh run > /tmp/cab.out 2>&1 &); then poll /tmp/cab/progress
#               and tar /tmp/cab into $OUT (a detached run survives between calls while the machine is held)
# Steps are appended to /tmp/cab/progress as they end; the last line is "done". REPS (default 2) bench
# repetitions; FILTER the benchmark filter (default: zipage, zipage_similar, zipage_fp8 at batches 1 and 16; the
# names end in /iterations:5/manual_time, so a filter must not end in `$`).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
case "${1:-}" in
  pack)
    old=${2:?pack OLD [NEW]} new=${3:-HEAD}
    rm -rf "$root/.carry-src" "$root/.carry-old"
    mkdir -p "$root/.carry-src/.nccl" "$root/.carry-old"
    git -C "$root" archive "$new" -- . ':!models' ':!data' ':!tests/data' ':!docs' | tar -x -C "$root/.carry-src"
    git -C "$root" archive "$old" -- . ':!models' ':!data' ':!tests/data' ':!docs' | tar -x -C "$root/.carry-old"
    mkdir -p "$root/.carry-old/.nccl"
    cp /usr/local/cuda/include/nccl.h "$root/.carry-src/.nccl/"
    cp /usr/local/cuda/include/nccl.h "$root/.carry-old/.nccl/"
    echo "new $(git -C "$root" rev-parse --short "$new") in .carry-src, old $(git -C "$root" rev-parse --short "$old") in .carry-old"
    ;;
  run)
    L=${L:-/tmp/cab}
    mkdir -p "$L"
    progress() { echo "$* ($(date +%T))" >> "$L/progress"; }
    echo "start $(date +%T)" > "$L/progress"
    nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$L/gpu.txt" 2>&1
    build() {  # name source-dir: bench/device_build.sh's configure and build, logs in $L/<name>/
      mkdir -p "$L/$1"
      SRC=$2 BD=/tmp/cab-$1 OUT=$L/$1 TARGETS="test_cuda_compression bench_compression" JOBS=8 \
        "$root/bench/device_build.sh" build > /dev/null
      progress "$1 build rc=$?"
    }
    build old "$root/.carry-old" &
    build new "$root/.carry-src" &
    wait
    T=/tmp/cab-new/tests/test_cuda_compression
    "$T" > "$L/test-new.log" 2>&1
    progress "new test_cuda_compression rc=$? $(tail -1 "$L/test-new.log")"
    FILTER=${FILTER:-'compress/zipage(_similar|_fp8)?/(total|score|select|compact)/batch(1|16)/'}
    for rep in $(seq 1 "${REPS:-2}"); do
      for v in old new; do
        "/tmp/cab-$v/bench/bench_compression" --benchmark_filter="$FILTER" > "$L/bench-$v-$rep.txt" 2>&1
        progress "$v bench $rep rc=$?"
      done
    done
    if command -v ncu > /dev/null; then
      for v in old new; do
        timeout 120 ncu --clock-control none --csv -k regex:'window|merge_stats|block_similarity|finalize|select_kernel|compact' \
          --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum \
          --launch-count 7 "/tmp/cab-$v/bench/bench_compression" --benchmark_filter='compress/zipage_fp8/total/batch16/' \
          > "$L/ncu-$v.csv" 2>&1
        progress "$v ncu rc=$?"
      done
    fi
    export ZIPAGE_CUDA_TEST_QUICK=1
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool "$tool" "$T" > "$L/$tool.log" 2>&1
      progress "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/$tool.log" | tail -1)"
    done
    # Side by side: benchmark, old ms, new ms (first repetition of each).
    join <(awk '/^compress/ { print $1, $2 }' "$L/bench-old-1.txt" | sort) \
         <(awk '/^compress/ { print $1, $2 }' "$L/bench-new-1.txt" | sort) > "$L/bench-ab.txt" 2>/dev/null
    progress "done"
    ;;
  *) echo "usage: $0 pack OLD [NEW] | run" >&2; exit 2 ;;
esac
