// zipage::prebuilt: basic_llm<zipage::h2o>'s loader and engine on the CPU backend, compiled once.
#include "instantiate.hpp"

ZIPAGE_PREBUILT_LLM_DEFINITION(h2o)
