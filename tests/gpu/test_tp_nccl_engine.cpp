// Tensor parallelism through NCCL on one GPU (issue 15's one-GPU test): engine<tensor_parallel_llama<
// cuda_backend>> with N = 1 over an NCCL communicator gives the plain GPU engine's greedy tokens in fp32,
// with full KV and with zipage compression. Prints SKIPPED and exits 77 where there is no CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

#include "gpu_doctest_main.hpp"
#include "greedy.hpp"
#include "stories_model.hpp"
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/models/llama_tp.hpp"
#include "zipage/parallel/nccl_collectives.hpp"
#include "zipage/parallel/nccl_communicator.hpp"
#include "zipage/policy/policies.hpp"

using namespace zipage;
using zipage::testing::greedy_ignoring_eos;
using zipage::testing::stories;

namespace {

std::vector<std::vector<token_id>> prompts() {
  return zipage::testing::encode_stories(
      {"Once upon a time", "Once upon a time, a little girl went to the park.", "Tom had a ball."});
}

std::size_t common_prefix(const std::vector<token_id>& a, const std::vector<token_id>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The plain GPU engine and the N = 1 NCCL tensor-parallel engine on the same backend options; returns the
// number of requests whose tokens agree, all of them required when `exact`.
template <class Policy>
void compare(cuda_dtype dtype, const engine_config& cfg, bool exact) {
  cuda_backend_options o;
  o.dtype = dtype;
  o.batch_invariant = dtype == cuda_dtype::f32;
  const cuda_backend b(o);
  engine<llama_model<cuda_backend>, Policy, zipage_scheduler, cuda_backend> plain(
      load_llama_gguf<cuda_backend>(stories().file, b), cfg, Policy{}, b);
  const auto ps = prompts();
  const auto expected = plain.generate(ps, greedy_ignoring_eos(64));

  const std::vector<int> devices{0};
  auto group = parallel::nccl_group(devices);
  const auto host = load_llama_gguf<cpu_backend>(stories().file);
  tensor_parallel_backend<cuda_backend> tpb(group, host.config(), {b});
  engine<tensor_parallel_llama<cuda_backend>, Policy, zipage_scheduler, tensor_parallel_backend<cuda_backend>> tp(
      tensor_parallel_llama<cuda_backend>(host, tpb), cfg, Policy{}, tpb);
  const auto out = tp.generate(ps, greedy_ignoring_eos(64));
  CHECK(tp.stats().compressions == plain.stats().compressions);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    MESSAGE(std::string(Policy{}.name()), std::string(dtype == cuda_dtype::f32 ? " fp32" : " bf16"), " request ", i, ": ",
            common_prefix(out[i].output, expected[i].output), " of ", expected[i].output.size(), " tokens agree");
    if (exact) CHECK(out[i].output == expected[i].output);
  }
}

}  // namespace

TEST_CASE("N = 1 through NCCL: fp32 greedy tokens equal the plain GPU engine's (full KV, zipage)") {
  compare<full_kv>(cuda_dtype::f32, {.block_size = 8, .num_blocks = 96}, true);
  compare<zipage_policy>(cuda_dtype::f32, {.block_size = 8, .num_blocks = 96, .budget_tokens = 32, .window = 4}, true);
}

TEST_CASE("N = 1 through NCCL in bf16 (reported; the plain engine decodes through CUDA graphs, TP eagerly)") {
  compare<full_kv>(cuda_dtype::bf16, {.block_size = 16, .num_blocks = 96}, false);
  compare<zipage_policy>(cuda_dtype::bf16, {.block_size = 16, .num_blocks = 96, .budget_tokens = 32, .window = 8}, false);
}

int main(int argc, char** argv) {
  return zipage::testing::gpu_doctest_main(argc, argv, [] { return "; NCCL " + parallel::nccl_version(); });
}
