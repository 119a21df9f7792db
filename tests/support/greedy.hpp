#pragma once
// Greedy sampling parameters for the engine tests.
#include "zipage/sampling/sampling_params.hpp"

namespace zipage::testing {

// Greedy decoding of at most max_tokens tokens; EOS ends the request.
inline sampling_params greedy(int max_tokens) {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

// Greedy decoding of exactly max_tokens tokens (EOS ignored), for runs compared token by token.
inline sampling_params greedy_ignoring_eos(int max_tokens) {
  sampling_params p = greedy(max_tokens);
  p.ignore_eos = true;
  return p;
}

}  // namespace zipage::testing
