#pragma once
// A policy's score as data: which scoring pieces (scoring.hpp) it is composed of, in the fixed order
// the method applies them, and their parameters. Every built-in policy is one recipe; the CPU reference
// runs it with scoring::run_recipe, and a backend with device compression (cuda_backend) runs the same
// recipe in its kernels, so a composed policy — a user's included — is scored on the GPU with no host
// round trip.
//
//   importance  recency: s_j = j (newest first), or window attention A_j (mean over the window of the
//               max over the GQA group of each recorded query's softmax)
//   history     none, decayed max S_j = max(A_j, gamma · S_prev_j) (G-KV), or accumulated S_j = A_j + S_prev_j
//               (H2O); S is what the score cache remembers
//   pooling     1-D max-pool of S with an odd kernel: never, at a request's first compression, or always
//   redundancy  R-KV redundancy with cosine similarity inside each block or over the whole sequence,
//               one softmax over all cached tokens; F = lambda · S' - (1 - lambda) · R
//   sinks       the first `sinks` tokens always stay
// The engine then forces the newest W tokens and keeps the top keep_tokens() per (layer, KV head).
#include <cstdint>

#include "zipage/core/error.hpp"

namespace zipage {

struct score_recipe {
  enum class importance_kind : std::uint8_t { recency, window_attention };
  enum class history_kind : std::uint8_t { none, decayed_max, accumulate };
  enum class pool_when : std::uint8_t { never, first_compression, always };
  enum class redundancy_kind : std::uint8_t { none, block_local, full_sequence };

  importance_kind importance = importance_kind::window_attention;
  history_kind history = history_kind::none;
  float gamma = 0.8f;  // decayed_max only
  pool_when pooling = pool_when::never;
  int pool_kernel = 5;
  redundancy_kind redundancy = redundancy_kind::none;
  float lambda = 0.2f;  // weight of importance against redundancy
  float tau = 0.4f;     // redundancy softmax temperature
  int sinks = 0;

  [[nodiscard]] bool uses_score_cache() const { return history != history_kind::none; }
  [[nodiscard]] bool needs_queries() const { return importance == importance_kind::window_attention; }
  [[nodiscard]] bool pools(bool first_compression) const {
    return pool_kernel > 1 &&
           (pooling == pool_when::always || (pooling == pool_when::first_compression && first_compression));
  }

  // Early, named errors for a recipe no backend can run.
  void validate() const {
    check(importance != importance_kind::recency || history == history_kind::none,
          "score_recipe: recency importance has no attention to merge with a history");
    check(pooling == pool_when::never || (pool_kernel >= 1 && pool_kernel % 2 == 1),
          "score_recipe: pool_kernel must be odd and >= 1, got ", pool_kernel);
    check(redundancy == redundancy_kind::none || tau > 0.0f, "score_recipe: tau must be positive, got ", tau);
    check(redundancy == redundancy_kind::none || (lambda >= 0.0f && lambda <= 1.0f),
          "score_recipe: lambda must be in [0, 1], got ", lambda);
    check(history != history_kind::decayed_max || (gamma >= 0.0f && gamma <= 1.0f),
          "score_recipe: gamma must be in [0, 1], got ", gamma);
    check(sinks >= 0, "score_recipe: sinks must be >= 0, got ", sinks);
  }
};

}  // namespace zipage
