#pragma once
// llama_model<B> keeping a copy of every logits row it returns, for teacher-forced comparisons of two KV
// caches or two weight formats (one request per engine). With `force`, step i's logits are raised at
// force[i] in their last row, so greedy sampling emits the given tokens (teacher forcing through the
// engine's own decode and compression path) while the recorded rows are the model's own. The logits go
// through the host every step, so on the GPU it runs with CUDA graphs off.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "zipage/core/types.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/models/llama.hpp"

namespace zipage::testing {

template <class B>
struct logging_llama {
  using backend_type = B;
  using tensor = typename B::tensor;
  llama_model<B> inner;
  B backend;
  std::vector<std::vector<float>>* rows = nullptr;
  const std::vector<token_id>* force = nullptr;
  tensor forced;

  [[nodiscard]] const model_config& config() const { return inner.config(); }
  const tensor& forward(forward_context<B>& ctx) {
    const tensor& logits = inner.forward(ctx);
    if (logits.rows() == 0) return logits;
    const auto host = backend.to_host(logits);
    const auto cols = static_cast<std::size_t>(logits.cols());
    for (std::size_t r = 0; r < static_cast<std::size_t>(logits.rows()); ++r)
      rows->emplace_back(host.begin() + static_cast<std::ptrdiff_t>(r * cols), host.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
    if (force == nullptr) return logits;
    const std::size_t step = rows->size() - 1;
    auto raised = host;
    if (step < force->size()) {
      const float mx = *std::max_element(host.end() - static_cast<std::ptrdiff_t>(cols), host.end());
      raised[(static_cast<std::size_t>(logits.rows()) - 1) * cols + static_cast<std::size_t>((*force)[step])] = mx + 1000.0f;
    }
    forced = backend.from_host(raised, static_cast<int>(logits.rows()), static_cast<int>(logits.cols()));
    return forced;
  }
};

}  // namespace zipage::testing
