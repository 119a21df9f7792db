#pragma once
// What each source of zipage::prebuilt instantiates: basic_llm's loader (zipage/llm.hpp, detail::load_llm)
// for one built-in policy on the CPU backend. One policy per source, so the library builds in parallel.
#include "zipage/llm.hpp"

#if !ZIPAGE_PREBUILT
#error "zipage::prebuilt is compiled with ZIPAGE_PREBUILT=1 (its users see the matching extern templates)"
#endif

#define ZIPAGE_PREBUILT_LLM_DEFINITION(Policy)                                                                      \
  namespace zipage {                                                                                               \
  template detail::llm_parts detail::load_llm<Policy, cpu_backend>(const std::filesystem::path&, const engine_config&, \
                                                                   Policy, cpu_backend, const char*);              \
  }
