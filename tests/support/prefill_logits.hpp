#pragma once
// The logits of every position of one prefill on the CPU backend, [T][vocab] (zipage::cpu_prefill_logits).
#include <cstdint>
#include <numeric>
#include <vector>

#include "zipage/backend/cpu/prefill_logits.hpp"

namespace zipage::testing {

template <class Model>
std::vector<float> prefill_logits(Model& m, const std::vector<token_id>& tokens) {
  std::vector<std::int32_t> rows(tokens.size());
  std::iota(rows.begin(), rows.end(), 0);
  return cpu_prefill_logits(m, tokens, rows);
}

}  // namespace zipage::testing
