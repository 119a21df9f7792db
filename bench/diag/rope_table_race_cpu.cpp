// The GPU's intermittent greedy mismatch, simulated on the CPU (docs/benchmarks.md, "Device session of 2026-12-03
// 18:40-19:25"): stories260K's greedy outputs for test_cuda_engine's 16 story prompts when the first `limit` RoPE
// applications of the prefill use a table of `fill` for every inverse frequency (0: no rotation, what a RoPE kernel
// reading the table before its copy landed in fresh memory would do), printed as sequence@first-departing-token
// against the same engine with the right table. With `0 1` it gives the departures of the GPU's alternative output.
//   g++ -std=c++20 -O2 -DNDEBUG -Iinclude -Itests/support -I/usr/include/eigen3 \
//       -DZIPAGE_TEST_MODEL=\"$PWD/models/stories260K.gguf\" bench/diag/rope_table_race_cpu.cpp -o /tmp/rope_race
//   /tmp/rope_race 0 1
#include <cstdio>
#include <cstdlib>
#include "zipage/engine/engine.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "greedy.hpp"
#include "stories_model.hpp"
using namespace zipage;
static double g_fill = 0.0;
static int g_mode = 0;  // 0 normal, 1 prefill table replaced
static int g_calls = 0, g_limit = 1000;
// cpu_backend whose RoPE, in the prefill (more than 16 rows), uses `g_fill` for the first `g_limit` calls.
struct odd_backend : cpu_backend {
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style,
            const rope_scaling_config& scaling) const {
    if (g_mode == 1 && x.rows() > 16 && g_calls++ < g_limit) {  // the prefill (decode steps have 16 rows)
      const int half = head_dim / 2;
      const auto heads = x.cols() / head_dim;
      for (Eigen::Index r = 0; r < x.rows(); ++r)
        for (Eigen::Index h = 0; h < heads; ++h) {
          float* v = x.row(r).data() + h * head_dim;
          for (int i = 0; i < half; ++i) {
            const double angle = pos[static_cast<std::size_t>(r)] * g_fill;
            const auto c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
            const int a = style == rope_style::interleaved ? 2 * i : i, b = style == rope_style::interleaved ? 2 * i + 1 : i + half;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
          }
        }
      return;
    }
    cpu_backend::rope(x, pos, head_dim, theta, style, scaling);
  }
  void rope(tensor& x, std::span<const std::int32_t> pos, int head_dim, float theta, rope_style style) const {
    rope(x, pos, head_dim, theta, style, rope_scaling_config{});
  }
  void qkv_epilogue(const tensor& qkv, const zipage::qkv_epilogue<tensor>& e, tensor& q, tensor& k, tensor& v) const {
    separate_qkv_epilogue(*this, qkv, e, q, k, v);
  }
};
using eng_t = engine<llama_model<odd_backend>, full_kv, zipage_scheduler, odd_backend>;
std::vector<std::vector<token_id>> run(int mode) {
  g_mode = mode;
  engine_config cfg{.block_size = 16, .num_blocks = 512};
  eng_t eng(load_llama_gguf<odd_backend>(zipage::testing::stories().file, odd_backend{}), cfg);
  const auto prompts = zipage::testing::story_prompts(16);
  std::vector<request_id> ids;
  for (auto& p : prompts) {
    sampling_params sp = zipage::testing::greedy(100);
    sp.ignore_eos = true;
    ids.push_back(eng.add_request(p, sp));
  }
  eng.run_to_completion();
  std::vector<std::vector<token_id>> out;
  for (auto id : ids) out.push_back(eng.take_output(id).output);
  return out;
}
int main(int argc, char** argv) {
  g_fill = argc > 1 ? std::atof(argv[1]) : 0.0;
  g_limit = argc > 2 ? std::atoi(argv[2]) : 1000;
  const auto ref = run(0);
  const auto alt = run(1);
  std::printf("fill %g, first %d prefill rope calls: departures:", g_fill, g_limit);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    std::size_t n = 0;
    while (n < ref[i].size() && n < alt[i].size() && ref[i][n] == alt[i][n]) ++n;
    if (n < ref[i].size()) std::printf(" %zu@%zu", i, n);
  }
  std::printf("\n");
}
