#!/usr/bin/env bash
# On a CUDA machine, from the repository root: the GPU tests and the engine benchmarks after wiring device
# sampling (cuda_backend::sample) and device compression (cuda_backend::compress_on_device) into the engine.
#  1. test_cuda_kernels, test_cuda_compression (full grid, incl. the >24,576-token request),
#     test_cuda_sampling and test_cuda_engine, concurrently (correctness only; each under a time limit);
#  2. zipage-bench on Qwen3-0.6B shapes: long workload (256 requests, 128-token prompts) full KV vs
#     compressed (budget 2048, block 256), time-boxed; the nano-vllm workload to completion; the long
#     workload with 256-token outputs to completion (the shape the transformers peer runs);
#  3. scripts/hf_peer_bench.py: transformers' continuous batching (generate_batch, paged SDPA) on the same
#     shape, random-initialised Qwen3-0.6B config, bf16.
# Binaries come from $BIN (built elsewhere: test_cuda_* and zipage-bench). Logs go to $OUT (at most 8 files).
# Usage: BIN=build-carry-bin OUT=out bench/run_cuda_hooks.sh
set -u
OUT=${OUT:-out}
BIN=${BIN:-build-carry-bin}
LONG_S=${LONG_S:-48}
mkdir -p "$OUT"
L=$(mktemp -d)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export ZIPAGE_TEST_MODEL="$PWD/models/stories260K.gguf"
export PYTHONUNBUFFERED=1
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; nproc; free -g | head -2;
  head -2 /etc/os-release; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } > "$OUT/env.txt" 2>&1

t0=$(date +%s)
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling test_cuda_engine; do
  args=""
  [ "$t" = test_cuda_engine ] && args="-d"
  ( s=$(date +%s); timeout "${TEST_LIMIT:-100}" "$BIN/$t" $args > "$L/$t.log" 2>&1; echo "$t: rc=$? ($(($(date +%s) - s)) s)" > "$L/$t.rc" ) &
done
wait
cat "$L"/*.rc | tee -a "$S"
for t in test_cuda_kernels test_cuda_compression test_cuda_sampling; do
  { echo "==== $t"; cat "$L/$t.log"; } >> "$OUT/tests_kernels.txt"
  { echo "---- $t (FAIL lines and last lines)"; grep -E "FAIL|error" "$L/$t.log" | head -20; tail -4 "$L/$t.log"; } >> "$S"
done
cp "$L/test_cuda_engine.log" "$OUT/test_engine.txt"
{ echo "---- test_cuda_engine"; grep -E "MESSAGE|: ERROR|: FATAL|test cases|assertions|SKIPPED|^  (fp32|bf16|device|compress)|^[0-9.]+ s:|^=+ *$" "$L/test_cuda_engine.log" | grep -v "^===" | head -80; } >> "$S"
echo "tests: $(($(date +%s) - t0)) s" | tee -a "$S"

bench() {  # name limit args...
  local name=$1 limit=$2
  shift 2
  local s=$(date +%s)
  echo "==== $name: $*" >> "$OUT/bench.txt"
  timeout "$limit" "$BIN/zipage-bench" --json "$OUT/bench.jsonl" "$@" >> "$OUT/bench.txt" 2>&1
  echo "bench $name: rc=$? ($(($(date +%s) - s)) s): $*" | tee -a "$S"
}
bench long 140 --shape qwen3-0.6b --workload long --mode both --num-requests 256 --seconds "$LONG_S"
bench nano 70 --shape qwen3-0.6b --workload nano --mode full --seconds 60
bench peer_shape 40 --shape qwen3-0.6b --workload long --mode full --num-requests 256 --output-len 256 --seconds 35
grep -E "^\||^device|^shape|KV pool|error" "$OUT/bench.txt" | grep -v "^|---" >> "$S"

s=$(date +%s)
timeout "${HF_LIMIT:-80}" python3 scripts/hf_peer_bench.py --num-requests 256 --prompt-len 128 --output-len 256 \
  --json "$OUT/bench.jsonl" > "$OUT/hf.txt" 2>&1
echo "hf peer: rc=$? ($(($(date +%s) - s)) s)" | tee -a "$S"
grep -E "^\{|failed|Error" "$OUT/hf.txt" | tail -8 >> "$S"
echo "total: $(($(date +%s) - t0)) s" | tee -a "$S"
cat "$S"
