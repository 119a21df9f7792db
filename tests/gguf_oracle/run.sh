#!/usr/bin/env bash
# Regenerates tests/data/gguf/ with llama.cpp as the reference (README.md here). Needs network access to
# npm's registry (node-llama-cpp publishes llama.cpp's prebuilt CPU libraries and its source as a git
# bundle), g++ and git, and a zipage build (BUILD, default build/) for the Qwen fixtures. Not part of the build
# or of CI: the tests read only the files this writes.
#   BUILD=build tests/gguf_oracle/run.sh [WORK_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/zipage-gguf-oracle}
version=3.22.1  # node-llama-cpp; its llama.cpp release is in llama/llama.cpp.info.json
out=$root/tests/data/gguf
mkdir -p "$work" "$out"
cd "$work"
if [ ! -d bins ]; then
  npm pack --silent "@node-llama-cpp/linux-x64@$version" "node-llama-cpp@$version" >/dev/null
  tar xzf "node-llama-cpp-linux-x64-$version.tgz" && mv package/bins/linux-x64 bins && rm -rf package
  tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  git clone -q package/llama/gitRelease.bundle llama.cpp
  cp package/llama/llama.cpp.info.json . && rm -rf package
fi
echo "llama.cpp: $(cat llama.cpp.info.json | tr -d '\n ')"
flags=(-std=c++20 -O1 -I llama.cpp/ggml/include -I llama.cpp/include -I "$root/include" -L bins
       -Wl,-rpath,"$work/bins")
g++ "${flags[@]}" "$root/tests/gguf_oracle/quant_fixture.cpp" -l:libggml-base.so -o quant_fixture
g++ "${flags[@]}" "$root/tests/gguf_oracle/llama_golden.cpp" -l:libllama.v0.5.0.so -l:libggml-base.so \
    -l:libggml.v0.5.0.so -o llama_golden

./quant_fixture "$out/quants.gguf"
# llama.cpp's most used recipe; stories260K's 64-wide rows are too short for K-quant blocks, so llama.cpp
# stores them as Q5_0 / Q8_0 / F16, as it would the odd tensors of a large model.
./llama_golden quantize "$root/models/stories260K.gguf" "$out/stories260K-Q4_K_M.gguf" 15
export GGML_BACKEND_DIR=$work/bins
prompts=("Once upon a time" "The little dog was sad because" "Tom said: \"I can't find my ball!\" - cafe 42")
./llama_golden golden "$root/models/stories260K.gguf" "$out/llama_cpp_stories260K.gguf" 24 "${prompts[@]}"
# The quantised model's reference: llama.cpp in fp32 on ggml's dequantisation of its weights.
./llama_golden dequantize "$out/stories260K-Q4_K_M.gguf" stories260K-Q4_K_M-as-f32.gguf
./llama_golden golden stories260K-Q4_K_M-as-f32.gguf "$out/llama_cpp_stories260K-Q4_K_M.gguf" 24 "${prompts[@]}"
# llama.cpp's tokenizer on 400 random texts (tests/gguf_oracle/token_lines.py): {"text", "ids"} per line.
python3 "$root/tests/gguf_oracle/token_lines.py" 1 400 > token_lines.txt
./llama_golden tokenize "$root/models/stories260K.gguf" < token_lines.txt > token_ids.txt
python3 "$root/tests/gguf_oracle/token_jsonl.py" token_lines.txt ids=token_ids.txt > "$out/llama_cpp_stories260K_tokens.jsonl"

# Qwen3, Qwen2 and Llama 3-style GGUF files (byte-level BPE vocabularies; the last with Llama 3's pre-tokenizer,
# a BOS, permuted Q/K and rope_freqs), written from the random checkpoints of the tests by make_gguf_fixture as
# llama.cpp's converter writes them: llama.cpp's logits (top 32 and log-sum-exp per position)
# and greedy tokens on three prompts (control tokens parsed: one is chat-formatted), and its token ids for 400
# random texts, without and with control tokens parsed.
build=${BUILD:-$root/build}
for arch in qwen3 qwen2 llama3; do
  "$build/tests/make_eval_fixture" "$work/${arch}_random" "$root/tests/data/qwen3" $([ $arch != qwen3 ] && echo $arch)
  "$build/tests/make_gguf_fixture" "$work/${arch}_random" "$work/${arch}_random.gguf"
  ./llama_golden golden_top "$work/${arch}_random.gguf" "$out/llama_cpp_${arch}_random.gguf" 8 32 "Hello world" \
    $'<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n' $'def f(x):\n    return x**2  # \u4f60\u597d \U0001F642'
done
python3 "$root/tests/gguf_oracle/token_lines.py" 1 400 qwen > qwen_lines.txt
./llama_golden tokenize "$work/qwen3_random.gguf" < qwen_lines.txt > qwen_ids.txt
./llama_golden tokenize "$work/qwen3_random.gguf" special < qwen_lines.txt > qwen_ids_special.txt
./llama_golden tokenize "$work/llama3_random.gguf" special < qwen_lines.txt > llama3_ids_special.txt
python3 "$root/tests/gguf_oracle/token_jsonl.py" qwen_lines.txt ids=qwen_ids.txt ids_special=qwen_ids_special.txt \
  ids_llama3=llama3_ids_special.txt > "$out/llama_cpp_qwen3_tokens.jsonl"
ls -l "$out"
