// zipage-serve: an OpenAI-compatible HTTP server (completions and chat completions, streaming or not,
// /v1/models, /health, /metrics) on the Compressed PagedAttention engine. The engine runs on a thread of
// its own; see examples/serve/server.cpp for the routes and README.md ("zipage-serve") for the API.
//   zipage-serve                                      # the bundled stories260K on 127.0.0.1:8000
//   zipage-serve --model Qwen3-8B/ --port 8000 --api-key secret --served-model-name qwen3-8b
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../common/engine_cli.hpp"
#include "server.hpp"
#include "zipage/tokenizer/tool_call_parser.hpp"

namespace {

struct options : zipage_cli::engine_options {
  zipage_serve::server_options server;
};

void add_flags(CLI::App& app, options& o) {
  zipage_cli::add_engine_flags(app, o);
  // The shared flag's text is zipage-generate's (request i uses seed + i); the server seeds a generator instead.
  app.get_option("--seed")->description(
      "requests that set no seed draw theirs from a generator seeded with it, so a fresh server answers the same "
      "requests, sent in the same order, alike (vLLM's --seed; default: random_device)");
  auto& s = o.server;
  app.add_option("-n,--max-tokens", s.default_max_tokens,
                 "tokens a request generates when it sets no max_tokens (0: as OpenAI and vLLM, 16 for a completion, "
                 "up to the model's context for a chat)")
      ->check(zipage_cli::count());
  app.add_option("--max-model-len", s.max_model_len,
                 "the context a request may use, prompt + output (vLLM's; default: the model's, or no limit with "
                 "--allow-beyond-context): longer ones get 400, and /v1/models reports it")
      ->check(zipage_cli::positive_count());
  app.add_option("--host", s.host, "address to listen on")->capture_default_str();
  app.add_option("--port", s.port, "port to listen on (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on every route but /health and /metrics");
  app.add_option("--served-model-name", s.served_model_name, "the model's name in the API (default: the model file or directory name)");
  app.add_option("--max-queue", s.max_queue,
                 "requests (choices) that may wait beyond --max-num-seqs running ones; more get 429")
      ->check(zipage_cli::count())
      ->capture_default_str();
  app.add_option("--shutdown-timeout", s.shutdown_timeout,
                 "seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled")
      ->check(zipage_cli::number_check("in [0, 86400] (a day)", [](double v) { return v >= 0 && v <= 86400; }))
      ->capture_default_str();
  app.add_option("--max-body-bytes", s.max_body_bytes, "largest request body accepted (413 beyond)")
      ->check(zipage_cli::number_check("in [1, 2^40]", [](double v) { return v >= 1 && v <= 1099511627776.0; }))
      ->capture_default_str();
  app.add_option("--reasoning-parser", s.reasoning_parser,
                 "vLLM's: qwen3 | deepseek_r1 = a chat answer's <think>...</think> block (opened by the model or by "
                 "the prompt, as DeepSeek-R1's and QwQ's templates open it) goes to the message's reasoning_content, "
                 "the rest to content (default: none, all content)")
      ->check(CLI::IsMember({"", "qwen3", "deepseek_r1"}));
  auto* parser = app.add_option("--tool-call-parser", s.tool_call_parser,
                                "vLLM's: how a chat answer's tool calls are read into the message's tool_calls. "
                                "hermes = <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> blocks (Qwen2.5, "
                                "Qwen3, QwQ, Hermes); llama3_json (or llama4_json) = an answer of [<|python_tag|>] "
                                "{\"name\": ..., \"parameters\": {...}} objects separated by ';' (Llama 3.x, 4); mistral = "
                                "[TOOL_CALLS] then a JSON array of {\"name\", \"arguments\"}, or [TOOL_CALLS]name{...} per "
                                "call; pythonic = an answer that is a Python list of calls, [f(a=1, b=\"x\")] (Llama 3.2, 4)")
                     ->check(CLI::Validator(
                         [](std::string& name) -> std::string {
                           if (zipage::tool_call_format_named(name)) return {};
                           return "unknown tool-call parser '" + name + "'; supported: " + zipage::tool_call_format_names();
                         },
                         "PARSER"));
  app.add_flag("--enable-auto-tool-choice", s.enable_auto_tool_choice,
               "vLLM's: chat requests with tools may leave tool_choice \"auto\" (the model decides; its calls are parsed "
               "with --tool-call-parser); without it only tool_choice \"none\" is accepted with tools")
      ->needs(parser);
  app.add_option("--http-threads", s.http_threads,
                 "HTTP worker threads at most (0: max-num-seqs + max-queue + 16, at most 4096)")
      ->check(zipage_cli::number_check("in [0, 65536]", [](double v) { return v >= 0 && v <= 65536; }));
}

// Where the output length of a request without max_tokens comes from, for the startup line: -n for every route,
// else the checkpoint's max_new_tokens for chats (as vLLM; its completions route keeps OpenAI's 16), else the API's.
std::string default_max_tokens_note(const options& o) {
  if (o.server.default_max_tokens > 0)
    return "; default max-tokens " + std::to_string(o.server.default_max_tokens) + " (flag)";
  const std::string chat = o.checkpoint_max_tokens
                               ? std::to_string(*o.checkpoint_max_tokens) + " (checkpoint max_new_tokens)"
                               : std::string("up to the context (default)");
  return "; default max-tokens: chat " + chat + ", completion 16 (default)";
}

int run(options& o) {
  return zipage_cli::with_engine(o, [&](auto& eng, const zipage_cli::model_text& text) {
    o.sampling_line += default_max_tokens_note(o);
    if (o.server.served_model_name.empty()) {
      std::filesystem::path p(o.model);
      if (!p.has_filename()) p = p.parent_path();
      o.server.served_model_name = p.stem().string();
      if (std::filesystem::is_directory(o.model)) o.server.served_model_name = p.filename().string();
    }
    zipage_serve::served_model m;
    m.text = &text;
    m.model_context = eng.config().max_context;
    m.vocab_size = eng.config().vocab_size;
    // --allow-beyond-context lifts the engine's limit, so the server's too: without --max-model-len a request
    // may run past the model's context (compressed long generation); with it, that length is the limit, even
    // above the model's (as vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN).
    const bool beyond = o.engine.allow_beyond_context;
    m.max_context = beyond ? 0 : m.model_context;
    if (o.server.max_model_len > 0) {  // as vLLM: at most what the model was trained for
      zipage::check(beyond || m.model_context == 0 || o.server.max_model_len <= m.model_context, "--max-model-len ",
                    o.server.max_model_len, " is larger than the model's context of ", m.model_context,
                    " tokens (add --allow-beyond-context to serve past it)");
      m.max_context = o.server.max_model_len;
    }
    m.max_num_seqs = eng.settings().max_num_seqs;
    m.guide_vocab = eng.settings().guide_vocab;
    m.memory_line = eng.memory().describe() + "; policy " + std::string(eng.policy().name());
    // vLLM refuses to start when one sequence of the model's length does not fit the KV cache; zipage serves
    // what fits and says so: a longer prompt (with full KV, prompt + output) is refused per request with a 400.
    const long long pool_tokens = static_cast<long long>(eng.memory().num_blocks) * eng.settings().block_size;
    if (m.max_context > 0 && pool_tokens < m.max_context)
      m.memory_line += "\nzipage-serve: note: the KV pool holds " + std::to_string(pool_tokens) +
                       " tokens, fewer than the model's context of " + std::to_string(m.max_context) +
                       ": longer prompts get 400; give the pool more (--kv-cache-mib or --num-blocks; on the GPU "
                       "--gpu-memory-utilization), or serve a shorter context (--max-model-len)";
    zipage_serve::driver_for<std::remove_reference_t<decltype(eng)>> driver(eng);
    return zipage_serve::serve(o.server, o, m, driver);
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zipage-serve: an OpenAI-compatible server on the Compressed PagedAttention engine"};
  options o;
  add_flags(app, o);
  if (const int rc = zipage_cli::parse_cli(app, argc, argv, "zipage-serve"); rc >= 0) return rc;
  if (app.get_option("--seed")->count() > 0) o.server.seed = o.sampling.seed;
  // SIGINT/SIGTERM go to the server's signal thread only (blocked here, before any thread starts, so every
  // thread inherits the mask); a client gone mid-write must not kill the process.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return zipage_cli::run_reporting_errors("zipage-serve", [&] { return run(o); });
}
