#!/usr/bin/env bash
# On a CUDA machine, from the repository root: the compression step's test (full grid, then the quick
# subset under compute-sanitizer memcheck and racecheck) and its benchmark. Uses prebuilt binaries from
# $BIN when they load there (test_cuda_compression, bench_compression, and any .so they need), else
# builds them: with CMake, or, if the project does not configure there, with nvcc directly (only the
# three CUDA sources they need). Logs go to $OUT (default: out/); prints a short report at the end.
#   [BIN=dir] bench/run_compression.sh [benchmark args...]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-compression}
{ date -u; nvidia-smi; nvcc --version; } > "$OUT/env.txt" 2>&1

TEST="" BENCH=""
if [ -n "${BIN:-}" ] && [ -x "$BIN/test_cuda_compression" ] && [ -x "$BIN/bench_compression" ]; then
  export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
  if ! ldd "$BIN/test_cuda_compression" "$BIN/bench_compression" | grep -q "not found"; then
    TEST=$BIN/test_cuda_compression BENCH=$BIN/bench_compression
    echo "using prebuilt binaries from $BIN"
  fi
fi
if [ -z "$TEST" ]; then
  t0=$(date +%s)
  if { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZIPAGE_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90a &&
       cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_compression bench_compression; } > "$OUT/build.log" 2>&1; then
    TEST=$BUILD/tests/test_cuda_compression BENCH=$BUILD/bench/bench_compression
  else
    echo "cmake build failed (see build.log); building with nvcc directly"
    mkdir -p "$BUILD"
    NV="nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -Iinclude -I/usr/include/eigen3 -Xcompiler -pthread"
    SRC="src/cuda/device.cu src/cuda/decode_attention.cu src/cuda/compression.cu"
    $NV $SRC tests/gpu/test_cuda_compression.cpp -o "$BUILD/test_cuda_compression" >> "$OUT/build.log" 2>&1 &
    $NV $SRC bench/bench_compression.cu -lbenchmark -o "$BUILD/bench_compression" >> "$OUT/build.log" 2>&1 &
    wait
    TEST=$BUILD/test_cuda_compression BENCH=$BUILD/bench_compression
  fi
  echo "build: $(($(date +%s) - t0)) s"
fi

t0=$(date +%s)
timeout 150 "$TEST" > "$OUT/test.txt" 2>&1
echo "test: rc=$? ($(($(date +%s) - t0)) s)" | tee "$OUT/status.txt"
grep -v '^\[PASS\]' "$OUT/test.txt" | tee -a "$OUT/status.txt"

if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    ZIPAGE_CUDA_TEST_QUICK=1 timeout 60 compute-sanitizer --tool "$tool" "$TEST" > "$OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool: rc=$? ($(($(date +%s) - t0)) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checks passed' "$OUT/sanitizer_$tool.txt" | tr '\n' ' ')" | tee -a "$OUT/status.txt"
  done
fi

t0=$(date +%s)
timeout 180 "$BENCH" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json "$@" > "$OUT/bench.txt" 2>&1
echo "bench: rc=$? ($(($(date +%s) - t0)) s)"
grep -E '^device|^pool' "$OUT/bench.txt"
sed -n '/^## Compression step/,$p' "$OUT/bench.txt"
cat "$OUT/status.txt"
