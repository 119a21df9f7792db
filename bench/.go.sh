#!/usr/bin/env bash
# $1: output dir (the call's $OUT)
C=${1:-/tmp/chain-out}; mkdir -p $C
st() { echo "[$(date -u +%H:%M:%S)] $*" >> $C/status.txt; }
st "$(B=/tmp/dev-bin bench/device_build.sh unpack 2>&1 | tail -1)"
export LD_LIBRARY_PATH=/tmp/dev-bin/lib
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >> $C/status.txt
BIN=/tmp/dev-bin OUT=$C DEADLINE_S=280 PER_TEST_S=250 CONCURRENT="test_cuda_wgmma test_cuda_kernels test_cuda_compression test_cuda_config_sweep test_cuda_sampling test_cuda_fp8_kv test_cuda_fp8_gemm" bench/run_gpu_tests.sh > $C/tests.out 2>&1
st "tests done"
timeout 60 /tmp/dev-bin/bench_elementwise > $C/elementwise.txt 2>&1; st "elementwise rc=$?"
box() { # name flags
  local n=$1; shift
  st "box $n start"
  timeout 200 /tmp/dev-bin/zipage-bench --shape qwen3-8b --workload long --mode compressed --num-requests 1024 --output-len 16384 --max-num-seqs 1024 --seconds 70 --kv-cache-dtype fp8 --quantization fp8 --prompt-len 2048 "$@" --json $C/$n.json > $C/$n.log 2>&1
  st "box $n rc=$? $(grep -iE 'steady' $C/$n.log | head -3 | tr '\n' ' ')"
}
box A1
box B1 --fused-append
st "all done"
