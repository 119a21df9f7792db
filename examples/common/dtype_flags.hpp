#pragma once
// --kv-cache-dtype and --quantization (vLLM's flags) for every tool that has them (zipage-generate / serve / eval
// through engine_cli.hpp, zipage-eval's grid, zipage-bench): the spellings come from core/kv_cache_dtype.hpp and
// core/weight_dtype.hpp, the description is written once; a tool says what `auto` means for it.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/kv_cache_dtype.hpp"
#include "zipage/core/weight_dtype.hpp"

namespace zipage_cli {

template <class Names>
std::vector<std::string> flag_values(const Names& names) {
  return {names.begin(), names.end()};
}

// prefix: "GPU: " where the flag only matters on the GPU. auto_means: e.g. "the model's dtype".
inline CLI::Option* add_kv_cache_dtype_flag(CLI::App& app, std::string& value, const std::string& prefix,
                                            const std::string& auto_means) {
  return app
      .add_option("--kv-cache-dtype", value,
                  prefix + "KV cache storage: auto (" + auto_means +
                      ") or fp8 / fp8_e4m3 (E4M3 codes with per token-head bf16 scales; docs/fp8.md)")
      ->check(CLI::IsMember(flag_values(zipage::kv_cache_dtype_names)));
}

// auto_means: e.g. "the checkpoint's: FP8 for an FP8 checkpoint, else --dtype".
inline CLI::Option* add_quantization_flag(CLI::App& app, std::string& value, const std::string& prefix,
                                          const std::string& auto_means) {
  return app
      .add_option("--quantization", value,
                  prefix + "linear weights, as vLLM's flag: auto (" + auto_means +
                      "), fp8 / fp8_e4m3 (E4M3 with 128x128 block scales, FP8 GEMMs) or none (the compute dtype; an "
                      "FP8 checkpoint is dequantised)")
      ->check(CLI::IsMember(flag_values(zipage::weight_quantization_names)));
}

// --dtype and --gpu-memory-utilization choose the GPU's compute type and pool: a run that lands on the CPU refuses
// them (when given on the command line) rather than ignoring them. default_pool_mib: the tool's --kv-cache-mib
// default, for the message.
inline void refuse_gpu_pool_flags_on_cpu(bool dtype_given, const std::string& dtype, bool gpu_memory_utilization_given,
                                         int default_pool_mib) {
  zipage::check(!dtype_given || dtype == "fp32", "--dtype ", dtype,
                ": the CPU backend computes in fp32 (--dtype chooses the GPU's); drop the flag or add --device cuda");
  zipage::check(!gpu_memory_utilization_given, "--gpu-memory-utilization sizes the GPU's pool; the CPU backend's pool "
                "is --kv-cache-mib (default ", default_pool_mib, ") or --num-blocks");
}

// On the GPU, FP8 weights need --dtype bf16 (the FP8 GEMM writes bf16): an error naming the flags otherwise.
inline void check_quantization_dtype(zipage::weight_dtype weights, const std::string& quantization,
                                     const std::string& dtype) {
  zipage::check(weights != zipage::weight_dtype::fp8_e4m3 || dtype != "fp32", "--quantization ", quantization,
                ": FP8 weights run with --dtype bf16 (the FP8 GEMM writes bf16), not ", dtype);
}

}  // namespace zipage_cli
