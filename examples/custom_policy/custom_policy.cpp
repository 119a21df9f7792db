// Writing your own eviction policy, two ways:
//  1. Compose it from the scoring pieces as data: derive from zipage::recipe_policy<YourPolicy> and define
//     `score_recipe recipe() const`. Both backends execute the recipe, so on the GPU it is scored by the
//     device kernels with no host round trip (snapkv_with_sinks below).
//  2. Write any score(): derive from zipage::policy_base and define score() (attention_plus_small_keys
//     below). It runs on the host on every backend (the engine gathers the keys for it).
//
// policy_base supplies "when" (at block boundaries once a request holds budget + 1 blocks) and "how
// many" (budget · block_size); the engine forces the newest W tokens to stay, keeps the top tokens per
// KV head in their original order and compacts the paged cache. score() only says what matters.
//
// This policy mixes window attention (what the recent queries look at) with a key-norm prior (keys
// with small norms tend to draw attention), built from the same scoring pieces the built-ins use.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string_view>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/policy/scoring.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

namespace {

struct attention_plus_small_keys : zipage::policy_base {
  float prior_weight = 0.05f;

  std::string_view name() const { return "attention_plus_small_keys"; }

  // keep: [kv_heads][kv_len], higher = keep. cache_out is unused (uses_score_cache is false).
  void score(const zipage::score_context& ctx, std::span<float> keep, std::span<float> /*cache_out*/) const {
    zipage::scoring::window_attention(ctx, keep);
    for (int h = 0; h < ctx.num_kv_heads; ++h)
      for (int j = 0; j < ctx.kv_len; ++j) {
        const float* k = ctx.key(h, j);
        float norm = 0.0f;
        for (int d = 0; d < ctx.head_dim; ++d) norm += k[d] * k[d];
        keep[static_cast<std::size_t>(h) * ctx.kv_len + j] -= prior_weight * std::sqrt(norm) / ctx.head_dim;
      }
  }
};
static_assert(zipage::eviction_policy<attention_plus_small_keys>);
static_assert(!zipage::recipe_scored<attention_plus_small_keys>);  // its own score(): host path

// SnapKV's pooled window attention, plus StreamingLLM's attention sinks and a little of R-KV's block-local
// redundancy: a new policy with no new code, scored on the device as well.
struct snapkv_with_sinks : zipage::recipe_policy<snapkv_with_sinks> {
  std::string_view name() const { return "snapkv_with_sinks"; }
  zipage::score_recipe recipe() const {
    zipage::score_recipe r;
    r.pooling = zipage::score_recipe::pool_when::always;
    r.pool_kernel = 5;
    r.redundancy = zipage::score_recipe::redundancy_kind::block_local;
    r.lambda = 0.8f;  // mostly importance
    r.sinks = 4;
    return r;
  }
};
static_assert(zipage::recipe_scored<snapkv_with_sinks>);

// Tokens of `ours` equal to `reference` at the same position (either may end sooner, at EOS).
std::size_t same_tokens(const std::vector<zipage::token_id>& ours, const std::vector<zipage::token_id>& reference) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < std::min(ours.size(), reference.size()); ++i) same += ours[i] == reference[i];
  return same;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc > 2 || (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h"))) {
    std::fprintf(argc > 2 ? stderr : stdout, "usage: zipage-example-custom-policy [MODEL.gguf]  (a Llama-family GGUF "
                 "file with a SentencePiece vocabulary; default: the bundled stories260K)\n");
    return argc > 2 ? 2 : 0;
  }
  const auto file = zipage::gguf::file::open(argc > 1 ? argv[1] : ZIPAGE_DEFAULT_MODEL);
  const auto tokenizer = zipage::spm_tokenizer::from_gguf(file);
  const zipage::engine_config cfg{.block_size = 16, .num_blocks = 256, .budget_tokens = 64, .window = 8};

  zipage::engine<zipage::llama_model<>, attention_plus_small_keys> engine(zipage::load_llama_gguf(file), cfg);
  zipage::engine<zipage::llama_model<>> full(zipage::load_llama_gguf(file), cfg);

  zipage::sampling_params greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 200;
  // BOS first when the file asks for it (tokenizer.ggml.add_bos_token), as llama.cpp does.
  const auto prompt = tokenizer.encode("Once upon a time, there was a little dog named Max.", tokenizer.add_bos());
  const auto ours = engine.generate({prompt}, greedy)[0];
  const auto reference = full.generate({prompt}, greedy)[0];

  const std::size_t same = same_tokens(ours.output, reference.output);
  std::printf("%s\n", tokenizer.decode(ours.output).c_str());
  std::printf("policy %s: %d compressions, cache bounded at %d tokens; %zu of %zu tokens equal to full KV\n",
              std::string(engine.policy().name()).c_str(), ours.num_compressions, cfg.budget_tokens,
              same, ours.output.size());
  zipage::engine<zipage::llama_model<>, snapkv_with_sinks> composed(zipage::load_llama_gguf(file), cfg);
  const auto mine = composed.generate({prompt}, greedy)[0];
  const std::size_t same_composed = same_tokens(mine.output, reference.output);
  std::printf("policy %s: %d compressions; %zu of %zu tokens equal to full KV\n",
              std::string(composed.policy().name()).c_str(), mine.num_compressions, same_composed, mine.output.size());
  const bool ok = ours.num_compressions > 0 && ours.output.size() == reference.output.size() &&
                  mine.num_compressions > 0 && mine.output.size() == reference.output.size();
  std::printf("custom policy: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "zipage-example-custom-policy: %s\n", e.what());
  return 1;
}
