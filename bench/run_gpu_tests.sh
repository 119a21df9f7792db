#!/usr/bin/env bash
# Every GPU test binary found in $BIN, each under a time limit: first those of TESTS one after another (they
# size their KV pool from the free memory: test_cuda_engine takes 90% of the GPU), then those of CONCURRENT
# all at once (small pools); one combined log ($OUT/gpu_tests.log: each test's doctest
# summary and every failure) and one line per test in the summary. Used alone or as PARALLEL_CMD beside a
# training run (DELAY_S waits for the trainer's memory to settle first).
#   BIN=.carry-bin OUT=out bench/run_gpu_tests.sh
set -u
DEFAULT_DEADLINE=${DEFAULT_DEADLINE:-560}
SUMMARY_NAME=${SUMMARY_NAME:-gpu_tests_summary.txt}
. "$(dirname "$0")/lib.sh"
TESTS=${TESTS-test_gpu_device test_cuda_engine}  # set and empty: none
CONCURRENT=${CONCURRENT-test_cuda_wgmma test_cuda_kernels test_cuda_compression test_cuda_config_sweep test_cuda_sampling test_cuda_fp8_kv test_nccl_communicator test_tp_nccl_engine}
PER_TEST_S=${PER_TEST_S:-240}
LOG="$OUT/gpu_tests.log"
: > "$LOG"
sleep "${DELAY_S:-0}"
run_one() {  # run_one TEST: its summary lines to $LOG, one timed line to the summary
  local t=$1 limit start rc
  if [ ! -x "$BIN/$t" ]; then stamp "$t: not found in $BIN"; return; fi
  limit=$(( $(left) - 5 < PER_TEST_S ? $(left) - 5 : PER_TEST_S ))
  if [ "$limit" -lt 10 ]; then stamp "$t: no time left"; return; fi
  start=$(date +%s)
  timeout "$limit" "$BIN/$t" > "/tmp/$t.log" 2>&1
  rc=$?
  { echo "===== $t rc=$rc ($(( $(date +%s) - start )) s)"
    # A failure with its context (the test case, the values, the MESSAGEs around it), not the ERROR line alone.
    if [ "$rc" -ne 0 ]; then grep -B4 -A10 -E "ERROR|FAILED" "/tmp/$t.log" | head -200
    else grep -E "SKIP|skipped" "/tmp/$t.log" | head -40; fi
    tail -4 "/tmp/$t.log"; } >> "$LOG"
  stamp "$t rc=$rc ($(( $(date +%s) - start )) s): $(grep -E '^\[doctest\] (test cases|assertions)' "/tmp/$t.log" | tr '\n' ' ')"
}
for t in $TESTS; do run_one "$t"; done
for t in $CONCURRENT; do run_one "$t" & done
wait
cat "$S"
