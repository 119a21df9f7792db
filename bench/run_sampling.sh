#!/usr/bin/env bash
# On a CUDA machine, from the repository root: builds the GPU sampling test and benchmark, runs the test,
# the benchmark, then compute-sanitizer (memcheck, racecheck) on the test's quick subset, within a time
# budget (BUDGET seconds, default 200; later steps are skipped when it runs out). Logs go to $OUT
# (default: out/). If the CMake build fails (another library source broken), falls back to compiling just
# the sampling sources with nvcc. Usage: bench/run_sampling.sh [benchmark args...]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-sampling}
BUDGET=${BUDGET:-200}
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }
{ date -u; nvidia-smi; nvcc --version; cmake --version | head -1; ldd --version | head -1; lscpu | grep -E 'Model name|^Flags'; } > "$OUT/env.txt" 2>&1

t0=$(date +%s)
TEST="$BUILD/tests/test_cuda_sampling"
BENCH="$BUILD/bench/bench_sampling"
if ! { timeout 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZIPAGE_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90a &&
       timeout 100 cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_sampling bench_sampling; } > "$OUT/build.log" 2>&1; then
  echo "cmake build failed ($(($(date +%s) - t0)) s); fallback: nvcc on the sampling sources only"
  tail -15 "$OUT/build.log"
  B="$BUILD/direct"
  mkdir -p "$B"
  CUINC="$(dirname "$(command -v nvcc)")/../include"
  NV="nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -Iinclude"
  { $NV -c src/cuda/sampling.cu -o "$B/sampling.o" &
    $NV -c src/cuda/device.cu -o "$B/device.o" &
    $NV -c bench/bench_sampling.cu -o "$B/bench.o" &
    g++ -std=c++20 -O3 -Iinclude -I"$CUINC" -c tests/gpu/test_cuda_sampling.cpp -o "$B/test.o" &
    wait
    $NV "$B/test.o" "$B/sampling.o" "$B/device.o" -o "$B/test_cuda_sampling" &&
    $NV "$B/bench.o" "$B/sampling.o" "$B/device.o" -lbenchmark -lpthread -o "$B/bench_sampling"; } > "$OUT/build_direct.log" 2>&1 ||
    { tail -30 "$OUT/build_direct.log"; exit 1; }
  TEST="$B/test_cuda_sampling"
  BENCH="$B/bench_sampling"
fi
echo "build: $(($(date +%s) - t0)) s"
grep -E 'sampling.*(error|warning)' "$OUT/build.log" | head -5

t0=$(date +%s)
timeout 90 "$TEST" > "$OUT/test.txt" 2>&1
echo "test: rc=$? ($(($(date +%s) - t0)) s)" | tee "$OUT/status.txt"
grep -v -E '^\[(PASS|INFO)\]' "$OUT/test.txt" | head -40 | tee -a "$OUT/status.txt"
grep -E 'total:' "$OUT/test.txt" | tee -a "$OUT/status.txt"

t0=$(date +%s)
lim=$(left)
if [ "$lim" -gt 15 ]; then
  timeout $((lim > 70 ? 70 : lim)) "$BENCH" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json "$@" > "$OUT/bench.txt" 2>&1
  echo "bench: rc=$? ($(($(date +%s) - t0)) s)"
  grep -E '^device' "$OUT/bench.txt"
  sed -n '/^## sampling/,$p' "$OUT/bench.txt"
else
  echo "bench: skipped (time budget)"
fi

if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    lim=$(left)
    if [ "$lim" -lt 10 ]; then echo "compute-sanitizer $tool: skipped (time budget)" | tee -a "$OUT/status.txt"; continue; fi
    ZIPAGE_CUDA_TEST_QUICK=1 timeout $((lim > 40 ? 40 : lim)) compute-sanitizer --tool "$tool" "$TEST" > "$OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checks passed|checks,' "$OUT/sanitizer_$tool.txt" | tr '\n' ' ')" | tee -a "$OUT/status.txt"
  done
fi
cat "$OUT/status.txt"
