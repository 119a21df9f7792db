#pragma once
// zipage-eval accuracy / math: what the two subcommands share — a problem set, the (policy, budget) grid
// run through the engine, and the report (Markdown table on stdout, JSONL with --json-out).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zipage/core/cache_geometry.hpp"

namespace zipage_eval {

struct problem {
  std::string id;
  std::string level;   // accuracy: the row's level; math: the data file's name
  std::string prompt;  // raw text (accuracy) or the user message (math, chat template)
  std::string answer;  // the reference answer
  std::string source;  // "file:line" of its row, for errors
};

struct grid_options {
  std::string command;  // "accuracy" or "math"
  std::string model, data, json_out;
  int limit = 0;  // 0 = every problem
  std::vector<std::string> levels;
  std::vector<std::string> policies;  // empty = every built-in policy
  std::vector<int> budgets;           // tokens
  std::vector<double> budget_fractions;
  int block_size = zipage::default_block_size;
  int window = zipage::default_window;
  int samples = 8;
  int max_tokens = 10240;
  std::uint64_t seed = 0;
  // Sampling: < 0 = the checkpoint's generation_config.json, else default_temperature / off. top_k: not_given
  // (-1 is vLLM's "off", which the flag accepts as it does).
  float temperature = -1.0f, top_p = -1.0f, min_p = -1.0f;
  static constexpr int top_k_not_given = -2;
  int top_k = top_k_not_given;
  float default_temperature = 0.6f;
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "bf16";    // cuda: bf16 | fp32
  std::string kv_cache_dtype = "auto";  // cuda: auto (= dtype) | fp8 | fp8_e4m3
  std::string quantization = "auto";    // cuda linear weights: auto (the checkpoint's) | none | fp8 | fp8_e4m3
  double gpu_memory_utilization = 0.9;
  double kv_cache_mib = 256.0;  // CPU pool
  int num_blocks = 0;
  int max_num_seqs = 256;
  int max_batched_tokens = 8192;
  bool chat = false;      // math: Qwen3-style chat template around the prompt
  bool thinking = true;   // math: with the chat template, Qwen3 thinking on
  bool quiet = false;
  // Set by add_grid_flags: whether a GPU-only flag was given, so that a CPU run refuses it.
  CLI::Option* dtype_flag = nullptr;
  CLI::Option* gpu_memory_utilization_flag = nullptr;
};

// How a task turns a model's output into a verdict.
struct task {
  std::function<std::optional<std::string>(const std::string& output)> extract;
  std::function<bool(const std::string& extracted, const problem&)> correct;
  std::string extraction;  // described in the report
};

// The flags both subcommands take.
void add_grid_flags(CLI::App& app, grid_options& o);

// Runs the grid; prints the table (and writes the JSONL). Returns the exit code: non-zero when any
// request failed.
int run_grid(grid_options& o, const std::vector<problem>& problems, const task& t);

// The subcommands.
std::vector<problem> read_accuracy_set(const std::string& path, const std::vector<std::string>& levels, int limit);
std::vector<problem> read_math_set(const std::string& path, int limit);
task accuracy_task();
task math_task();

}  // namespace zipage_eval
