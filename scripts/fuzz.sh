#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang and runs each one on its seed corpus.
#   scripts/fuzz.sh                    # every harness, 30 s each (.ci/run smokes 15 s each)
#   scripts/fuzz.sh 600 fuzz_gguf      # one harness for 10 minutes
# clang is installed from Debian's packages when missing (as scripts/setup.sh does).
# Environment: FUZZ_BUILD_DIR (build-fuzz), FUZZ_JOBS (build parallelism, 2), FUZZ_WORK (where new inputs
# and crash files go: build-fuzz/fuzz-work; the committed corpus is only read), FUZZ_FLAGS (more libFuzzer
# flags, e.g. -runs=10000000 to stop after that many executions instead of after the time).
# Exit status non-zero when a harness finds a crash (its input is saved as FUZZ_WORK/<harness>/crash-*),
# a leak, a sanitizer report, an allocation over 2 GiB, or an input that runs more than 10 s (fuzz_guided: 60 s).
set -euo pipefail
seconds="${1:-30}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
work="${FUZZ_WORK:-$build/fuzz-work}"
all=(fuzz_gguf fuzz_safetensors fuzz_hf_config fuzz_tokenizer_json fuzz_chat_template fuzz_encoders fuzz_answer
  fuzz_guided)
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=("${all[@]}")

if ! command -v clang++ >/dev/null; then  # Debian's clang carries libFuzzer; installed as scripts/setup.sh installs
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "fuzz.sh: installing clang (libFuzzer)"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang
fi
# -O1, libFuzzer's own advice (the harnesses add -g); it compiles ~10% faster than RelWithDebInfo's -O2.
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" -DZIPAGE_BUILD_FUZZERS=ON -DZIPAGE_BUILD_TESTS=OFF \
  -DZIPAGE_BUILD_EXAMPLES=OFF -DZIPAGE_BUILD_BENCH=OFF -DZIPAGE_ENABLE_CUDA=OFF -DZIPAGE_INSTALL=OFF >/dev/null
# All of them through zipage_fuzzers: CMake's top-level Makefile builds the targets named on one command line one
# after the other (.NOTPARALLEL), a target that depends on them all two at a time.
targets=("${harnesses[@]}")
[ $# -eq 0 ] && targets=(zipage_fuzzers)
cmake --build "$build" -j "${FUZZ_JOBS:-2}" --target "${targets[@]}"

status=0
for h in "${harnesses[@]}"; do
  mkdir -p "$work/$h"
  dict=()  # the harnesses whose input is (or holds) JSON get its syntax and zipage's member names to mutate with
  # (tests/fuzz/json.dict), the grader's the LaTeX commands and words that answer.hpp reads (answer.dict)
  case "$h" in
    fuzz_hf_config|fuzz_tokenizer_json|fuzz_safetensors) dict=(-dict="$root/tests/fuzz/json.dict") ;;
    fuzz_guided) dict=(-dict="$root/tests/fuzz/guided.dict") ;;
    fuzz_answer) dict=(-dict="$root/tests/fuzz/answer.dict") ;;
  esac
  echo "== $h: ${seconds} s on tests/fuzz/corpus/$h${dict:+ with ${dict[0]#-dict=$root/}}"
  # New inputs go to $work/$h (first directory); the committed corpus is read only.
  # fuzz_guided compiles automata, whose bounded worst case (~1.4 s at -O2) runs ~50x slower under ASan: 60 s.
  timeout=10; [ "$h" = fuzz_guided ] && timeout=60
  if ! (cd "$work/$h" && "$build/tests/fuzz/$h" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=4096 \
        -malloc_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$h/" "${dict[@]}" ${FUZZ_FLAGS:-} \
        "$work/$h" "$root/tests/fuzz/corpus/$h" 2>&1 | tee "$work/$h.log" | grep -E "^(#[0-9]+ +DONE|Done|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)|crash-|leak-|timeout-|oom-"); then
    :
  fi
  if grep -qE "==[0-9]+==ERROR|crash-|leak-|timeout-|oom-|deadly signal" "$work/$h.log"; then
    echo "fuzz.sh: $h FAILED (see $work/$h.log)" >&2
    status=1
  fi
done
exit $status
