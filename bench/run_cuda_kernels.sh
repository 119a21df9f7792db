#!/usr/bin/env bash
# On a CUDA machine, from the repository root: builds the CUDA kernel test and the attention benchmark,
# runs the test (and compute-sanitizer memcheck/racecheck on its quick subset), summarises the SASS of
# the kernels, and runs the benchmark. Logs and results go to $OUT (default: out/). Prints a short
# report at the end. Usage: bench/run_cuda_kernels.sh [benchmark args...]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-dev}
{ date -u; nvidia-smi; nvcc --version; cmake --version | head -1; } > "$OUT/env.txt" 2>&1

t0=$(date +%s)
if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZIPAGE_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90a &&
       cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_kernels bench_decode_attention; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
echo "build: $(($(date +%s) - t0)) s"

# SASS summary per kernel: tensor-core MMAs, async copies, ldmatrix, local memory (spills).
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BUILD/src/libzipage_cuda.a" 2> /dev/null | awk '
    /Function :/ { name = $3 }
    / HMMA/ { hmma[name]++ } / LDGSTS/ { ldgsts[name]++ } / LDSM/ { ldsm[name]++ }
    / LDL/ || / STL/ { local_[name]++ } / LDG/ { ldg[name]++ } / STG/ { stg[name]++ }
    END { for (n in hmma) printf "%s HMMA=%d LDGSTS=%d LDSM=%d LDG=%d STG=%d LDL/STL=%d\n", n, hmma[n], ldgsts[n], ldsm[n], ldg[n], stg[n], local_[n] }
  ' > "$OUT/sass_summary.txt"
fi

t0=$(date +%s)
"$BUILD/tests/test_cuda_kernels" > "$OUT/test.txt" 2>&1
echo "test: rc=$? ($(($(date +%s) - t0)) s)" | tee "$OUT/status.txt"
grep -v '^\[PASS\]' "$OUT/test.txt" | tee -a "$OUT/status.txt"

if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    ZIPAGE_CUDA_TEST_QUICK=1 timeout 60 compute-sanitizer --tool "$tool" "$BUILD/tests/test_cuda_kernels" \
      > "$OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checks passed' "$OUT/sanitizer_$tool.txt" | tr '\n' ' ')" | tee -a "$OUT/status.txt"
  done
fi

t0=$(date +%s)
timeout 420 "$BUILD/bench/bench_decode_attention" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json "$@" \
  > "$OUT/bench.txt" 2>&1
echo "bench: rc=$? ($(($(date +%s) - t0)) s)"
grep -E '^device|copy:' "$OUT/bench.txt"
# Large decode cases, the sweep and prefill (the full table is in bench.txt).
sed -n '/^## decode (/,/^## decode pipeline/p' "$OUT/bench.txt" | grep -v '^## decode pipeline' | awk -F'|' '
  /^## / { print; next }
  /^\| batch|^\|---/ { print; next }
  NF > 8 && ($2+0 >= 256 || $3 ~ /ragged/) && $3+0 >= 8192 { print; next }
  NF > 8 && $3 ~ /ragged/ { print; next }
  NF > 8 && $2+0 == 1 && $3+0 == 32768 { print }'
sed -n '/^## decode pipeline/,$p' "$OUT/bench.txt"
# The whole decode table, compactly, for the small batches (batch 1 and 16).
sed -n '/^## decode (/,/^## decode pipeline/p' "$OUT/bench.txt" | awk -F'|' 'NF > 8 && ($2+0 == 1 || $2+0 == 16) && $5+0 == 16 { printf "%s/%s/%s:%s ", $2+0, $3+0, $4, $9 } END { print "" }' 
# Test status again, last, so that it stays in view.
cat "$OUT/status.txt"
