#pragma once
// zipage-serve's HTTP side: the OpenAI-compatible routes over an engine_service (examples/serve/server.cpp,
// compiled once whatever the policy).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "../common/engine_cli.hpp"
#include "engine_service.hpp"

namespace zipage_serve {

struct server_options {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (printed at start)
  std::string api_key;
  std::string served_model_name;  // default: the model path's last component
  int max_queue = 1024;           // choices waiting beyond max_num_seqs running; more get 429
  double shutdown_timeout = 30.0;  // seconds to finish in-flight requests after SIGINT/SIGTERM
  std::size_t max_body_bytes = 8u << 20;
  int http_threads = 0;             // 0: max_num_seqs + max_queue + 16, at most 4096
  int default_max_tokens = 0;          // 0: the API's default (completions 16, chat up to the context)
  // --max-model-len: the context a request may use; 0 = the model's (none with --allow-beyond-context)
  int max_model_len = 0;
  // --seed: the seeds of choices that set none are drawn from a generator seeded with it, so a fresh server
  // answers the same requests in the same order alike (as vLLM's --seed). Without it: from random_device.
  std::optional<std::uint64_t> seed;
  // --reasoning-parser (vLLM's): qwen3 or deepseek_r1 splits a chat answer's <think> block into
  // `reasoning_content`; empty: the answer is all `content`.
  std::string reasoning_parser;
  // --enable-auto-tool-choice with --tool-call-parser hermes, llama3_json (llama4_json), mistral or pythonic
  // (vLLM's; zipage/tokenizer/tool_call_parser.hpp): chat requests with tools and tool_choice "auto" get the
  // answer's calls back as the message's tool_calls.
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
};

// What serve() needs to know about the loaded engine.
struct served_model {
  const zipage_cli::model_text* text = nullptr;
  // prompt + output a request may use (400 beyond it); 0 = no limit (the model's is unknown, or the server runs
  // with --allow-beyond-context and no --max-model-len)
  int max_context = 0;
  int model_context = 0;  // the model's trained context, reported as max_model_len; 0 = unknown
  int vocab_size = 0;     // the model's vocabulary (logit_bias / allowed_token_ids ids must be below it); 0 = unknown
  int max_num_seqs = 0;
  // Each token's bytes, for structured outputs (the engine's engine_config::guide_vocab: the server compiles a
  // request's guide for it, and the engine takes that guide as it is); null: guided requests get 400.
  std::shared_ptr<const zipage::guide_vocabulary> guide_vocab;
  std::string memory_line;  // the memory plan and policy, printed at start
};

// Listens until SIGINT/SIGTERM (which the caller has blocked in every thread before starting any), then
// drains: new requests get 503, in-flight ones finish or are cancelled after shutdown_timeout. Returns the
// exit code.
int serve(const server_options& so, const zipage_cli::engine_options& eo, const served_model& model,
          engine_driver& driver);

}  // namespace zipage_serve
