#!/usr/bin/env bash
# On a CUDA machine, from the repository root: the engine on the GPU (zipage::cuda_backend).
#  1. test_cuda_engine (engine vs CPU engine: fp32 parity, bf16 agreement, compression, swapping) and
#     compute-sanitizer memcheck on its swap and compression cases;
#  2. zipage-bench throughput runs (random-weight Qwen3 shapes), each time-boxed.
# Binaries: $PREBUILT/{test_cuda_engine,zipage-bench} when they load here, else built in $BUILD.
# Logs and results go to $OUT (default: out/); a short report is printed last.
# Usage: PREBUILT=build-carry-bin OUT=out bench/run_cuda_engine.sh [quick|full|final|custom ARGS...]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-dev}
PREBUILT=${PREBUILT:-}
PLAN=${1:-full}
shift || true
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export ZIPAGE_TEST_MODEL="$PWD/models/stories260K.gguf"
{ date -u; nvidia-smi; nvcc --version; cmake --version | head -1; head -2 /etc/os-release; ldd --version | head -1;
  ls /usr/local/cuda/lib64 | grep -i cublasLt; nproc; free -g; } > "$OUT/env.txt" 2>&1

TEST="" BENCH=""
if [ -n "$PREBUILT" ] && [ -x "$PREBUILT/test_cuda_engine" ] && [ -x "$PREBUILT/zipage-bench" ] &&
   ! ldd "$PREBUILT/test_cuda_engine" "$PREBUILT/zipage-bench" 2>&1 | grep -q "not found" &&
   "$PREBUILT/zipage-bench" --help > /dev/null 2>&1; then
  TEST="$PREBUILT/test_cuda_engine" BENCH="$PREBUILT/zipage-bench"
  echo "binaries: prebuilt ($PREBUILT)"
else
  t0=$(date +%s)
  if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZIPAGE_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a &&
         cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_engine zipage-bench; } > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    exit 1
  fi
  TEST="$BUILD/tests/test_cuda_engine" BENCH="$BUILD/examples/zipage-bench"
  echo "binaries: built here in $(($(date +%s) - t0)) s"
fi

t0=$(date +%s)
timeout 180 "$TEST" > "$OUT/test.txt" 2>&1
echo "test_cuda_engine: rc=$? ($(($(date +%s) - t0)) s)" | tee "$OUT/status.txt"
grep -E "MESSAGE|: ERROR|: FATAL|test cases|assertions|SKIPPED|device 0|^  (fp32|bf16|compress|swaps|preempt|step)" \
  "$OUT/test.txt" | grep -v "^===" | head -60 >> "$OUT/status.txt"

if command -v compute-sanitizer > /dev/null; then
  timeout 60 compute-sanitizer --tool memcheck "$TEST" -tc="*swapped*,*compressed run*,*round trip*" > "$OUT/memcheck.txt" 2>&1
  echo "compute-sanitizer memcheck (swap, compressed, round-trip cases): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt" | tr '\n' ' ')" \
    | tee -a "$OUT/status.txt"
fi

bench() {  # name timeout args...
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  timeout "$limit" "$BENCH" --json "$OUT/bench.jsonl" "$@" > "$OUT/bench_$name.txt" 2>&1
  echo "bench $name: rc=$? ($(($(date +%s) - t)) s): $*" | tee -a "$OUT/bench_summary.txt"
  grep -E "^\||^device|^shape|KV pool|error" "$OUT/bench_$name.txt" | grep -v "^|---" >> "$OUT/bench_summary.txt"
}
case "$PLAN" in
  quick)
    bench tiny 60 --shape tiny --workload nano --mode full
    ;;
  full)
    bench tiny 60 --shape tiny --workload nano --mode full
    bench q06_nano 60 --shape qwen3-0.6b --workload nano --mode full --seconds 30
    bench q8_nano 60 --shape qwen3-8b --workload nano --mode full --seconds 30
    bench q06_long 90 --shape qwen3-0.6b --workload long --mode both --num-requests 32 --seconds 25
    ;;
  final)
    bench q8_nano 130 --shape qwen3-8b --workload nano --mode full --seconds 110
    bench q06_long 130 --shape qwen3-0.6b --workload long --mode both --num-requests 8 --seconds 50
    ;;
  custom)
    bench custom "${LIMIT:-300}" "$@"
    ;;
esac
cat "$OUT/bench_summary.txt" 2>/dev/null
echo "----"
cat "$OUT/status.txt"
