#pragma once
// The umbrella header: everything a program built on zipage usually needs, with one include.
//
//   #include <zipage/zipage.hpp>
//   zipage::llm llm("model.gguf");                          // text in, text out (zipage/llm.hpp)
//   zipage::engine<my_model, zipage::zipage_policy> eng(...);  // the engine over your own model type
//
// The CUDA backend (zipage/backend/cuda/cuda_backend.hpp) is included when the program links
// zipage::cuda, which defines ZIPAGE_WITH_CUDA. Single headers stay includable on their own.
#include "zipage/concepts.hpp"
#include "zipage/core/error.hpp"
#include "zipage/core/types.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/llm.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/model/model_config.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/models/load_model.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/policy/score_recipe.hpp"
#include "zipage/sampling/sampling_params.hpp"
#include "zipage/scheduler/scheduler.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"

#if ZIPAGE_WITH_CUDA
#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/cuda/device.hpp"
#endif
