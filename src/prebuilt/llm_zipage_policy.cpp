// zipage::prebuilt: basic_llm<zipage::zipage_policy>'s loader and engine on the CPU backend, compiled once.
#include "instantiate.hpp"

ZIPAGE_PREBUILT_LLM_DEFINITION(zipage_policy)
