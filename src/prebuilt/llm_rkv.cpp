// zipage::prebuilt: basic_llm<zipage::rkv>'s loader and engine on the CPU backend, compiled once.
#include "instantiate.hpp"

ZIPAGE_PREBUILT_LLM_DEFINITION(rkv)
