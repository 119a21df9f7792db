// The GPU's intermittent greedy mismatch, simulated on the CPU (docs/benchmarks.md, "Device session of 2026-12-03
// 18:40-19:25"): stories260K's greedy outputs for test_cuda_engine's 16 story prompts when the prefill's first
// `limit` RoPE applications do not rotate (an all-zero table of inverse frequencies: what a RoPE kernel reading the
// table before its copy landed in fresh memory does), printed as sequence@first-departing-token against the same
// engine with the right table. With `1` (layer 0's queries only) it gives the departures of the GPU's alternative.
// From the repository root:
//   g++ -std=c++20 -O2 -Iinclude -Itests/support -I/usr/include/eigen3 -DZIPAGE_TEST_MODEL=\"$PWD/models/stories260K.gguf\" bench/diag/rope_table_race_cpu.cpp -o /tmp/rope_race
//   /tmp/rope_race 1
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "greedy.hpp"
#include "stories_model.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"

using namespace zipage;

static bool g_skipping = false;  // this run leaves the prefill's first g_limit RoPE applications out
static int g_calls = 0, g_limit = 1;

// cpu_backend without the rotation in the prefill's (more than 16 rows: decode steps have 16) first g_limit RoPE
// calls. qkv_epilogue is restated so that the fused projection's epilogue calls this rope, not cpu_backend's.
struct odd_backend : cpu_backend {
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
            const rope_scaling_config& scaling) const {
    if (g_skipping && x.rows() > 16 && g_calls++ < g_limit) return;
    cpu_backend::rope(x, pos, head_dim, theta, style, scaling);
  }
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style) const {
    rope(x, pos, head_dim, theta, style, rope_scaling_config{});
  }
  void qkv_epilogue(const tensor& qkv, const zipage::qkv_epilogue<tensor>& e, tensor& q, tensor& k, tensor& v) const {
    separate_qkv_epilogue(*this, qkv, e, q, k, v);
  }
};

std::vector<std::vector<token_id>> run(bool skipping) {
  g_skipping = skipping;
  engine<llama_model<odd_backend>, full_kv, zipage_scheduler, odd_backend> eng(
      load_llama_gguf<odd_backend>(zipage::testing::stories().file, odd_backend{}),
      engine_config{.block_size = 16, .num_blocks = 512});
  std::vector<request_id> ids;
  for (const auto& p : zipage::testing::story_prompts(16))
    ids.push_back(eng.add_request(p, zipage::testing::greedy_ignoring_eos(100)));
  eng.run_to_completion();
  std::vector<std::vector<token_id>> out;
  for (const request_id id : ids) out.push_back(eng.take_output(id).output);
  return out;
}

int main(int argc, char** argv) {
  g_limit = argc > 1 ? std::atoi(argv[1]) : 1;
  const auto ref = run(false);
  const auto alt = run(true);
  std::printf("no rotation in the prefill's first %d RoPE calls: departures:", g_limit);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const auto n = std::mismatch(ref[i].begin(), ref[i].end(), alt[i].begin(), alt[i].end()).first - ref[i].begin();
    if (n < static_cast<std::ptrdiff_t>(ref[i].size())) std::printf(" %zu@%td", i, n);
  }
  std::printf("\n");
}
