// zipage::prebuilt: basic_llm<zipage::streaming_llm>'s loader and engine on the CPU backend, compiled once.
#include "instantiate.hpp"

ZIPAGE_PREBUILT_LLM_DEFINITION(streaming_llm)
