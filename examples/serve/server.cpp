// zipage-serve's HTTP side (cpp-httplib + nlohmann-json): the OpenAI-compatible routes, request
// validation, Server-Sent Events, the queue bound, client disconnects and the graceful shutdown.
#include "server.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <variant>

#include "hangup_watch.hpp"
#include "zipage/core/json.hpp"
#include "zipage/engine/prepared_request.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/tokenizer/jinja_value.hpp"
#include "zipage/tokenizer/reasoning_parser.hpp"
#include "zipage/tokenizer/tool_call_parser.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage_serve {
namespace {

// Objects keep their members in insertion order: OpenAI's field order, and top_logprobs most likely first.
using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------------------------
// Errors: OpenAI's error object {"error": {"message", "type", "param", "code"}}.
// ---------------------------------------------------------------------------------------------

struct api_error : std::runtime_error {
  int status;
  std::string type, param, code;
  api_error(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error",
            std::string code = {})
      : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
};

json error_json(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

// A response body. Messages may quote the request's bytes (a JSON parse error quotes the byte it stopped at, a
// value is cut at 40 bytes, maybe inside a character): bytes that are not UTF-8 go out as U+FFFD, where a strict
// dump would throw and turn a client's 400 into a 500.
std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status;
  res.set_content(dump_json(error_json(e.what(), e.type, e.param, e.code)), "application/json");
}

[[noreturn]] void bad_param(const std::string& param, const std::string& message) {
  throw api_error(400, message, param);
}

// ---------------------------------------------------------------------------------------------
// Typed request fields. A field that is absent or null takes its default; a present one of the wrong type
// or out of range is a 400 naming it.
// ---------------------------------------------------------------------------------------------

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string got(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 40) + "...";
  return std::string(v.type_name()) + " " + s;
}

std::optional<double> number(const json& body, const char* key, double lo, double hi, bool lo_open = false) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_param(key, std::string("'") + key + "' must be a number, got " + got(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
    std::ostringstream os;
    os << "'" << key << "' must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << "], got " << v->dump();
    bad_param(key, os.str());
  }
  return d;
}

std::optional<long long> integer(const json& body, const char* key, long long lo, long long hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
    bad_param(key, std::string("'") + key + "' must be an integer, got " + got(*v));
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad_param(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got " + v->dump());
  return v->is_number_unsigned() ? static_cast<long long>(v->get<unsigned long long>()) : v->get<long long>();
}

std::optional<bool> boolean(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_param(key, std::string("'") + key + "' must be a boolean, got " + got(*v));
  return v->get<bool>();
}

// ---------------------------------------------------------------------------------------------
// A generation request, parsed and checked.
// ---------------------------------------------------------------------------------------------

struct gen_request {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // stream_options.continuous_usage_stats: usage in every chunk (vLLM's)
  bool logprobs = false;
  bool tokens_as_ids = false;     // return_tokens_as_token_ids: logprobs name tokens "token_id:N" (vLLM's)
  int top_logprobs = 0;  // alternatives per token: chat top_logprobs, completions logprobs
  const zipage_cli::model_text* text = nullptr;  // to spell the alternatives
  int n = 1;
  std::vector<std::vector<zipage::token_id>> prompts;
  std::vector<job> jobs;  // prompts.size() * n choices; choice index = prompt * n + j
  std::size_t max_stop_len = 0;
  bool split_reasoning = false;   // --reasoning-parser, chat requests
  bool include_reasoning = true;  // vLLM's include_reasoning: false drops reasoning_content from the answer
  bool reasoning_opened = false;  // the prompt ends inside a <think> block
  bool parse_tool_calls = false;  // --enable-auto-tool-choice: tools with tool_choice "auto"
  zipage::tool_call_format tool_format = zipage::tool_call_format::hermes;  // --tool-call-parser
};

// What rendering a chat prompt found out for the answer's parsers.
struct chat_prompt_info {
  bool opens_reasoning = false;   // the prompt ends inside a <think> block
  bool closes_reasoning = false;  // the prompt ends with a closed <think> block (thinking turned off)
  bool auto_tools = false;        // tools the model may call (tool_choice "auto"): parse its tool calls
};

class api {
 public:
  api(const server_options& so, const zipage_cli::engine_options& eo, const served_model& m, engine_service& service,
      server_metrics& metrics)
      : so_(so), eo_(eo), model_(m), service_(service), metrics_(metrics), created_(std::time(nullptr)),
        rng_(so.seed ? *so.seed : std::random_device{}()), tool_format_(tool_format_of(so.tool_call_parser)),
        think_tags_(think_tags_of(*m.text)) {}

  const std::string& name() const { return so_.served_model_name; }
  std::atomic<bool> draining{false};
  std::atomic<int> in_flight{0};

  void check_auth(const httplib::Request& req) const {
    if (so_.api_key.empty()) return;
    const std::string h = req.get_header_value("Authorization");
    if (h != "Bearer " + so_.api_key)
      throw api_error(401, h.empty() ? "Missing API key: send 'Authorization: Bearer YOUR_KEY'"
                                     : "Incorrect API key provided",
                      {}, "invalid_request_error", "invalid_api_key");
  }

  // max_model_len as /v1/models and /tokenize report it: the limit served, else (none) the model's context.
  [[nodiscard]] int served_context() const {
    return model_.max_context > 0 ? model_.max_context : model_.model_context;
  }

  json models() const {
    return {{"object", "list"},
            {"data",
             json::array({{{"id", name()},
                           {"object", "model"},
                           {"created", created_},
                           {"owned_by", "zipage"},
                           {"max_model_len", served_context()}}})}};
  }

  // vLLM's POST /tokenize: a completion's "prompt" (a string; add_special_tokens, default true, adds the model's
  // BOS) or a chat's "messages" (rendered as /v1/chat/completions renders them, with the same options). Answers
  // the ids as the generation routes would feed them, their count, max_model_len, and with return_token_strs the
  // vocabulary's string of each id.
  json tokenize(const std::string& body_text) const {
    const json body = request_body(body_text);
    std::vector<zipage::token_id> ids;
    const json* prompt = field(body, "prompt");
    const json* messages = field(body, "messages");
    if ((prompt != nullptr) == (messages != nullptr)) bad_param("prompt", "give exactly one of 'prompt' and 'messages'");
    if (messages) {
      ids = chat_prompt(body);
    } else {
      if (!prompt->is_string()) bad_param("prompt", "'prompt' must be a string, got " + got(*prompt));
      const std::string& text = prompt->get_ref<const std::string&>();
      ids = boolean(body, "add_special_tokens").value_or(true) ? model_.text->encode(text)
                                                                : model_.text->encode_templated(text);
    }
    json out = {{"count", ids.size()}, {"max_model_len", served_context()}, {"tokens", ids}, {"token_strs", nullptr}};
    if (boolean(body, "return_token_strs").value_or(false)) {
      json strs = json::array();
      for (zipage::token_id id : ids) strs.push_back(model_.text->token_str(id));
      out["token_strs"] = std::move(strs);
    }
    return out;
  }

  // vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": their text, special tokens included}.
  json detokenize(const std::string& body_text) const {
    const json body = request_body(body_text);
    const json* tokens = field(body, "tokens");
    if (!tokens || !tokens->is_array()) bad_param("tokens", "'tokens' must be a list of token ids");
    std::vector<zipage::token_id> ids;
    for (const auto& t : *tokens) ids.push_back(token_of(t, "tokens"));
    // The model's vocabulary, which may be larger than the tokenizer's (Qwen3 pads 151,669 tokens to 151,936):
    // the completions route takes such ids in a prompt, and the model can generate them.
    const int vocab = std::max(model_.vocab_size, model_.text->vocab_size());
    for (zipage::token_id id : ids)
      if (id >= vocab)
        bad_param("tokens", "'tokens' holds id " + std::to_string(id) + "; the vocabulary has " +
                                std::to_string(vocab) + " tokens");
    // An id the tokenizer does not define decodes to nothing, as when it is generated.
    std::erase_if(ids, [&](zipage::token_id id) { return id >= model_.text->vocab_size(); });
    return {{"prompt", model_.text->decode(ids)}};
  }

  gen_request parse(const std::string& body_text, bool chat) {
    const json body = request_body(body_text);
    gen_request r;
    r.chat = chat;
    r.stream = boolean(body, "stream").value_or(false);
    if (const json* so = field(body, "stream_options")) {
      if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object, got " + got(*so));
      if (!r.stream) bad_param("stream_options", "'stream_options' is only allowed with 'stream': true");
      r.include_usage = boolean(*so, "include_usage").value_or(false);
      r.continuous_usage = boolean(*so, "continuous_usage_stats").value_or(false);
      if (r.continuous_usage && !r.include_usage)
        bad_param("stream_options", "'continuous_usage_stats' needs 'include_usage': true");
    }
    r.n = static_cast<int>(integer(body, "n", 1, 128).value_or(1));

    zipage::sampling_params p = eo_.sampling;  // the server's defaults (flags, then the checkpoint's)
    p.stop_token_ids = eo_.sampling.stop_token_ids;
    if (auto v = number(body, "temperature", 0.0, 1e6)) p.temperature = static_cast<float>(*v);
    if (auto v = number(body, "top_p", 0.0, 1.0, true)) p.top_p = static_cast<float>(*v);
    if (auto v = integer(body, "top_k", -1, 1 << 30)) p.top_k = *v < 0 ? 0 : static_cast<int>(*v);
    if (auto v = number(body, "min_p", 0.0, 1.0)) p.min_p = static_cast<float>(*v);
    if (auto v = number(body, "repetition_penalty", 0.0, 1e6, true)) p.repetition_penalty = static_cast<float>(*v);
    if (auto v = number(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = static_cast<float>(*v);
    if (auto v = number(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = static_cast<float>(*v);
    if (auto v = boolean(body, "ignore_eos")) p.ignore_eos = *v;
    if (auto v = integer(body, "priority", -(1LL << 31), (1LL << 31) - 1)) {
      // As vLLM: a priority only means something under --scheduling-policy priority; elsewhere a 400, not ignored.
      if (*v != 0 && eo_.scheduling != "priority")
        bad_param("priority", "'priority' " + std::to_string(*v) +
                                  " needs the server started with --scheduling-policy priority (it runs fcfs)");
      p.priority = static_cast<int>(*v);
    }
    if (const json* stop = field(body, "stop")) {
      p.stop.clear();
      auto add = [&](const json& s) {
        if (!s.is_string()) bad_param("stop", "'stop' must be a string or a list of strings, got " + got(s));
        if (s.get<std::string>().empty()) bad_param("stop", "'stop' strings must not be empty");
        p.stop.push_back(s.get<std::string>());
      };
      if (stop->is_array()) for (const auto& s : *stop) add(s);
      else add(*stop);
    }
    // vLLM's extension: token ids that end a choice (besides the model's EOS), e.g. a chat format's end-of-turn.
    if (const json* ids = field(body, "stop_token_ids")) {
      if (!ids->is_array()) bad_param("stop_token_ids", "'stop_token_ids' must be a list of token ids, got " + got(*ids));
      for (const auto& t : *ids) p.stop_token_ids.push_back(token_of(t, "stop_token_ids"));
    }
    // vLLM's: the text keeps the stop string, or the stop_token_ids token's text, that ended a choice.
    if (auto v = boolean(body, "include_stop_str_in_output")) p.include_stop_str_in_output = *v;
    zipage_cli::add_end_of_turn(p, eo_);  // the tokenizer's end of turn, unless the request ignores EOS
    reject_unsupported(body, chat);
    if (chat) r.include_reasoning = boolean(body, "include_reasoning").value_or(true);
    zipage::prepared_request prepared;  // what the checks below work out, for the engine to take as it is
    prepared.bad_words = logits_processors(body, p);
    prepared.guided = guided(body, p);

    // logprobs: each sampled token's log-probability, and the top_logprobs most likely tokens of its step.
    r.text = model_.text;
    if (chat) {
      r.logprobs = boolean(body, "logprobs").value_or(false);
      if (auto top = integer(body, "top_logprobs", 0, 20)) {
        if (*top > 0 && !r.logprobs) bad_param("top_logprobs", "'logprobs' must be true when 'top_logprobs' is used");
        r.top_logprobs = static_cast<int>(*top);
      }
    } else {
      if (auto lp = integer(body, "logprobs", 0, 20)) {  // vLLM's max_logprobs (OpenAI's legacy API: 5)
        r.logprobs = true;
        r.top_logprobs = static_cast<int>(*lp);
      }
      if (boolean(body, "echo").value_or(false)) bad_param("echo", "'echo' is not supported by zipage-serve");
      if (auto best_of = integer(body, "best_of", 1, 128); best_of && *best_of != r.n)
        bad_param("best_of", "'best_of' other than n is not supported by zipage-serve");
    }
    p.logprobs = r.logprobs;
    p.top_logprobs = r.top_logprobs;
    r.tokens_as_ids = boolean(body, "return_tokens_as_token_ids").value_or(false);

    constexpr long long kMaxTokens = std::numeric_limits<int>::max();
    std::optional<long long> max_tokens = integer(body, "max_tokens", 1, kMaxTokens);
    if (auto v = integer(body, "max_completion_tokens", 1, kMaxTokens)) max_tokens = v;
    const auto seed = integer(body, "seed", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max());

    chat_prompt_info info;
    r.prompts = chat ? std::vector<std::vector<zipage::token_id>>{chat_prompt(body, &info)} : completion_prompts(body);
    // With a reasoning parser a guided chat answer may think first, and the guide constrains its content (vLLM's
    // structured outputs with --reasoning-parser): the guide starts after </think>, or at once where the prompt
    // closed the block (thinking turned off). Where the tokenizer has no single-token tags the guided output is the
    // content as a whole, from the first generated token, and the reasoning parser is not applied to it.
    const bool reasoning = chat && !so_.reasoning_parser.empty();
    bool guided_reasoning = false;
    if (reasoning && p.guided.active() && !info.closes_reasoning) {
      if (auto tags = think_tags_) {
        tags->opened = info.opens_reasoning;
        p.guided_after_reasoning = tags;
        guided_reasoning = true;
      }
    }
    r.split_reasoning = reasoning && (!p.guided.active() || guided_reasoning || info.closes_reasoning);
    r.reasoning_opened = info.opens_reasoning;
    r.parse_tool_calls = info.auto_tools;
    r.tool_format = tool_format_;

    const int ctx = model_.max_context;
    for (std::size_t i = 0; i < r.prompts.size(); ++i) {
      const auto& prompt = r.prompts[i];
      const int len = static_cast<int>(prompt.size());
      if (ctx > 0 && len >= ctx)
        bad_param(chat ? "messages" : "prompt", "This model's maximum context length is " + std::to_string(ctx) +
                                                    " tokens; the prompt has " + std::to_string(len) + " tokens");
      int mt = 0;
      const auto min_too_large = [&](long long limit, const std::string& what) {
        if (p.min_tokens > limit)
          bad_param("min_tokens", "'min_tokens' (" + std::to_string(p.min_tokens) + ") must not exceed " + what + " (" +
                                      std::to_string(limit) + ")");
      };
      if (max_tokens) {
        min_too_large(*max_tokens, body.contains("max_completion_tokens") ? "'max_completion_tokens'" : "'max_tokens'");
        if (ctx > 0 && len + *max_tokens > ctx)
          bad_param(body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                    "This model's maximum context length is " + std::to_string(ctx) + " tokens. However, you requested " +
                        std::to_string(len + *max_tokens) + " tokens (" + std::to_string(len) + " in the prompt, " +
                        std::to_string(*max_tokens) + " for the completion)");
        mt = static_cast<int>(*max_tokens);
      } else {
        // Without a limit (--allow-beyond-context) a chat gets as many new tokens as the model's context holds.
        const int room = ctx > 0 ? ctx - len : (model_.model_context > 0 ? model_.model_context : 1 << 20);
        // Without -n: OpenAI's and vLLM's defaults, 16 tokens for a completion, up to the context for a chat, where
        // the checkpoint's max_new_tokens comes first (vLLM's completions route defaults to 16 itself, never to it).
        const int context_default = ctx > 0 || model_.model_context > 0 ? room : 256;
        const auto& checkpoint = eo_.checkpoint_max_tokens;
        const int chat_default = checkpoint ? std::min(*checkpoint, room) : context_default;
        const int api_default = chat ? chat_default : std::min(16, room);
        mt = so_.default_max_tokens > 0 ? std::min(so_.default_max_tokens, room) : api_default;
        min_too_large(mt, "the default max_tokens");
      }
      for (int j = 0; j < r.n; ++j) {
        job jb;
        jb.prompt = prompt;
        jb.params = p;
        jb.prepared = prepared;
        jb.params.max_tokens = mt;
        jb.params.seed = seed ? static_cast<std::uint64_t>(*seed) + static_cast<std::uint64_t>(j) : random_seed();
        jb.choice = static_cast<int>(i) * r.n + j;
        try {
          jb.params.validate();
        } catch (const std::exception& e) {
          throw api_error(400, e.what());
        }
        r.jobs.push_back(std::move(jb));
      }
    }
    return r;
  }

  std::uint64_t random_seed() {
    std::lock_guard lock(rng_mutex_);
    return rng_();
  }

 private:
  // The request's JSON object, its "model" checked against the served one (a 404 for another, as vLLM).
  json request_body(const std::string& body_text) const {
    json body;
    try {
      body = zipage::json::parse_as<json>(body_text, "request body");  // keys in the client's order (tools' schemas)
    } catch (const std::exception& e) {
      throw api_error(400, e.what());
    }
    if (!body.is_object()) throw api_error(400, "request body: expected a JSON object, got " + got(body));
    if (const json* m = field(body, "model")) {
      if (!m->is_string()) bad_param("model", "'model' must be a string, got " + got(*m));
      if (m->get<std::string>() != name())
        throw api_error(404, "The model '" + zipage::json::printable(m->get<std::string>()) +
                                 "' does not exist; this server serves '" + name() + "'",
                        "model", "invalid_request_error", "model_not_found");
    }
    return body;
  }

  // One token id: an integer that fits a token_id (whether the vocabulary has it is the engine's check, which
  // names the vocabulary's size).
  static zipage::token_id token_of(const json& t, const char* param) {
    if (!t.is_number_integer()) bad_param(param, std::string("'") + param + "' must hold integer token ids, got " + got(t));
    constexpr auto max_id = std::numeric_limits<zipage::token_id>::max();
    const bool fits = t.is_number_unsigned() ? t.get<unsigned long long>() <= max_id
                                             : t.get<long long>() >= 0 && t.get<long long>() <= max_id;
    if (!fits)
      bad_param(param, std::string("'") + param + "' holds token id " + t.dump() + ", which no vocabulary has");
    return t.get<zipage::token_id>();
  }

  // Fields of OpenAI's or vLLM's API that would change what is generated and that zipage-serve does not implement:
  // a 400 naming the field, rather than an answer that silently differs from what was asked for. (Fields that do
  // not change the output, such as 'user', are ignored.)
  static void reject_unsupported(const json& body, bool chat) {
    auto unsupported = [](const char* key, const std::string& what) {
      bad_param(key, std::string("'") + key + "' " + what + " is not supported by zipage-serve");
    };
    auto non_empty = [&](const char* key) {
      const json* v = field(body, key);
      if (v == nullptr) return false;
      if (v->is_string()) return !v->get<std::string>().empty();  // (json::empty() is false for any string)
      return !((v->is_object() || v->is_array()) && v->empty());
    };
    if (non_empty("functions")) unsupported("functions", "(non-empty)");
    if (!chat && non_empty("tools")) unsupported("tools", "(non-empty) in a completion request");
    // guided_choice, guided_regex, guided_json, guided_grammar, response_format json_schema / json_object /
    // structural_tag and structured_outputs' choice / regex / json / json_object / grammar / structural_tag are
    // served (guided() below).
    for (const char* key : {"prompt_logprobs", "truncate_prompt_tokens"})
      if (field(body, key) != nullptr) unsupported(key, "");
    // A template sent with the request: vLLM refuses it unless started with --trust-request-chat-template; here the
    // server's template is the one (--chat-template FILE).
    if (chat && field(body, "chat_template") != nullptr)
      unsupported("chat_template", "(a template in the request; start the server with --chat-template FILE)");
    if (boolean(body, "use_beam_search").value_or(false)) unsupported("use_beam_search", "true");
    if (!boolean(body, "skip_special_tokens").value_or(true)) unsupported("skip_special_tokens", "false");
    if (const json* rf = field(body, "response_format")) {
      const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
      if (type == nullptr || !type->is_string() ||
          (*type != "text" && *type != "json_schema" && *type != "json_object" && *type != "structural_tag"))
        unsupported("response_format", "other than {\"type\": \"text\" | \"json_schema\" | \"json_object\" | "
                    "\"structural_tag\"}");
    }
    if (!chat && non_empty("suffix")) unsupported("suffix", "(non-empty)");
    if (chat && boolean(body, "echo").value_or(false)) unsupported("echo", "true");
    // "none" or "auto" (chat_tools: with tools, "auto" needs --enable-auto-tool-choice); "required" and a named
    // function would need decoding constrained to a call, which zipage-serve does not do.
    if (const json* choice = field(body, "tool_choice");
        choice && !(choice->is_string() && (*choice == "none" || *choice == "auto")))
      unsupported("tool_choice", "other than \"none\" or \"auto\"");
  }

  // vLLM's logits processors (sampling_params): logit_bias (OpenAI's {"token id": bias}, each bias clamped to
  // [-100, 100] as vLLM does), allowed_token_ids, bad_words and min_tokens; an id outside the model's vocabulary or
  // a bad word that encodes to nothing is a 400 naming the field (the engine would refuse them too, but only once
  // the streaming headers are out). Returns the bad words encoded, for the engine to use as they are.
  std::shared_ptr<const zipage::encoded_bad_words> logits_processors(const json& body,
                                                                    zipage::sampling_params& p) const {
    std::shared_ptr<const zipage::encoded_bad_words> encoded;
    const auto in_vocab = [&](zipage::token_id id, const char* param) {
      if (model_.vocab_size > 0 && id >= model_.vocab_size)
        bad_param(param, std::string("'") + param + "' holds token id " + std::to_string(id) +
                             ", outside the vocabulary of " + std::to_string(model_.vocab_size) + " tokens");
      return id;
    };
    if (const json* bias = field(body, "logit_bias")) {
      if (!bias->is_object())
        bad_param("logit_bias", "'logit_bias' must be an object mapping token ids to biases, got " + got(*bias));
      for (const auto& [key, value] : bias->items()) {
        json id;
        try {
          std::size_t used = 0;
          const long long n = std::stoll(key, &used);
          if (used == key.size()) id = n;
        } catch (const std::exception&) {
        }
        if (id.is_null())
          bad_param("logit_bias", "'logit_bias' keys must be token ids (integers as strings), got \"" +
                                      zipage::json::printable(key) + "\"");
        if (!value.is_number() || !std::isfinite(value.get<double>()))
          bad_param("logit_bias", "'logit_bias' values must be numbers, got " + got(value) + " for token " + key);
        const zipage::token_id t = in_vocab(token_of(id, "logit_bias"), "logit_bias");
        p.logit_bias[t] = static_cast<float>(std::clamp(value.get<double>(), -100.0, 100.0));
      }
    }
    if (const json* ids = field(body, "allowed_token_ids")) {
      if (!ids->is_array())
        bad_param("allowed_token_ids", "'allowed_token_ids' must be a list of token ids, got " + got(*ids));
      if (ids->empty())
        bad_param("allowed_token_ids", "'allowed_token_ids' must not be empty (no token could be sampled)");
      std::vector<zipage::token_id> allowed;
      for (const auto& t : *ids) allowed.push_back(in_vocab(token_of(t, "allowed_token_ids"), "allowed_token_ids"));
      p.allowed_token_ids = std::move(allowed);
    }
    if (const json* words = field(body, "bad_words")) {
      if (!words->is_array()) bad_param("bad_words", "'bad_words' must be a list of strings, got " + got(*words));
      for (const auto& w : *words) {
        if (!w.is_string()) bad_param("bad_words", "'bad_words' must be a list of strings, got " + got(w));
        if (w.get_ref<const std::string&>().find_first_not_of(" \t\n\r\f\v") == std::string::npos)
          bad_param("bad_words", "'bad_words' entries must hold more than whitespace, got " + got(w));
        p.bad_words.push_back(w.get<std::string>());
      }
      // Without a known vocabulary (never in zipage-serve itself) the engine encodes and checks them at add_request.
      if (!p.bad_words.empty() && model_.vocab_size > 0) {
        const auto encode = [&](const std::string& text) { return model_.text->encode_templated(text); };
        try {
          encoded = std::make_shared<const zipage::encoded_bad_words>(
              zipage::encode_checked_bad_words(p.bad_words, encode, model_.vocab_size));
        } catch (const zipage::error& e) {
          bad_param("bad_words", e.what());
        }
      }
    }
    if (auto v = integer(body, "min_tokens", 0, std::numeric_limits<int>::max())) p.min_tokens = static_cast<int>(*v);
    return encoded;
  }

  // Structured outputs: vLLM's guided_choice / guided_regex / guided_json / guided_grammar (GBNF), structured_outputs
  // {"choice": [...]} / {"regex": "..."} / {"json": schema} / {"json_object": true} / {"grammar": "..."} /
  // {"structural_tag": "..."} (vLLM's newer spelling), or OpenAI's response_format json_schema / json_object /
  // structural_tag (the response_format object is the structural tag, as vLLM passes it on: legacy
  // {"structures", "triggers"} or {"format"}). A JSON schema or a structural tag may be given as an object or as a
  // string holding its JSON text; json_object is the schema {"type": "object"}. The constraint is compiled here so
  // that a bad one is a 400 naming its field before any streaming header is out, and the engine takes the compiled
  // guide as it is (it would otherwise compile it again on its own thread, between steps); requests repeating a
  // constraint share one compilation (guides_). What a structural tag holds that zipage-serve does not implement
  // (token-level formats, ...; zipage/sampling/structural_tag.hpp) is a 400 naming the field and the format.
  // Returns the compiled guide, or null without a constraint.
  std::shared_ptr<const zipage::compiled_guide> guided(const json& body, zipage::sampling_params& p) {
    const char* source = nullptr;  // the field the constraint came from
    auto one = [&](const char* name) {
      if (source != nullptr)
        bad_param(name, std::string("'") + name + "' and '" + source + "' are both set: give one constraint");
      source = name;
    };
    auto take_choice = [&](const json& v, const char* name) {
      one(name);
      if (!v.is_array() || v.empty())
        bad_param(name, std::string("'") + name + "' must be a non-empty list of strings, got " + got(v));
      for (const auto& c : v) {
        if (!c.is_string() || c.get_ref<const std::string&>().empty())
          bad_param(name, std::string("'") + name + "' must hold non-empty strings, got " + got(c));
        p.guided.choice.push_back(c.get<std::string>());
      }
    };
    auto take_regex = [&](const json& v, const char* name) {
      one(name);
      if (!v.is_string()) bad_param(name, std::string("'") + name + "' must be a string, got " + got(v));
      p.guided.regex = v.get<std::string>();
    };
    auto take_grammar = [&](const json& v, const char* name) {
      one(name);
      if (!v.is_string()) bad_param(name, std::string("'") + name + "' must be a GBNF grammar string, got " + got(v));
      p.guided.grammar = v.get<std::string>();
    };
    // The schema's JSON text, as given (a string) or written from the object (ordered_json keeps the properties'
    // order, which the output follows).
    auto take_json = [&](const json& v, const char* name) {
      one(name);
      if (!v.is_object() && !v.is_boolean() && !v.is_string())
        bad_param(name, std::string("'") + name + "' must be a JSON schema (an object, or a string holding one), got " +
                            got(v));
      p.guided.json_schema = v.is_string() ? v.get<std::string>() : v.dump();
    };
    // The structural tag's JSON text, as given or written from the object (in its order: a schema's properties).
    auto take_structural_tag = [&](const json& v, const char* name) {
      one(name);
      if (!v.is_object() && !v.is_string())
        bad_param(name, std::string("'") + name + "' must be a structural tag (an object, or a string holding one), "
                  "got " + got(v));
      p.guided.structural_tag = v.is_string() ? v.get<std::string>() : v.dump();
    };
    const json any_object = {{"type", "object"}};
    std::optional<std::string> whitespace;
    if (const json* v = field(body, "guided_choice")) take_choice(*v, "guided_choice");
    if (const json* v = field(body, "guided_regex")) take_regex(*v, "guided_regex");
    if (const json* v = field(body, "guided_json")) take_json(*v, "guided_json");
    if (const json* v = field(body, "guided_grammar")) take_grammar(*v, "guided_grammar");
    if (const json* v = field(body, "guided_whitespace_pattern")) {
      if (!v->is_string()) bad_param("guided_whitespace_pattern", "'guided_whitespace_pattern' must be a string");
      whitespace = v->get<std::string>();
    }
    if (const json* rf = field(body, "response_format"); rf && rf->is_object()) {
      // (reject_unsupported checked the type: text, json_schema, json_object or structural_tag)
      const json* type = field(*rf, "type");
      if (type && *type == "json_object") take_json(any_object, "response_format");
      if (type && *type == "structural_tag") take_structural_tag(*rf, "response_format");
      if (type && *type == "json_schema") {
        const json* spec = field(*rf, "json_schema");
        const json* schema = spec && spec->is_object() ? field(*spec, "schema") : nullptr;
        if (schema == nullptr)
          bad_param("response_format", "'response_format' of type json_schema needs json_schema.schema");
        take_json(*schema, "response_format");
      }
    }
    if (const json* so = field(body, "structured_outputs")) {
      if (!so->is_object()) bad_param("structured_outputs", "'structured_outputs' must be an object, got " + got(*so));
      for (const auto& [key, value] : so->items()) {
        if (value.is_null()) continue;
        if (key == "choice") {
          take_choice(value, "structured_outputs.choice");
        } else if (key == "regex") {
          take_regex(value, "structured_outputs.regex");
        } else if (key == "json") {
          take_json(value, "structured_outputs.json");
        } else if (key == "json_object") {
          if (!value.is_boolean())
            bad_param("structured_outputs.json_object", "'structured_outputs.json_object' must be a boolean");
          if (value.get<bool>()) take_json(any_object, "structured_outputs.json_object");
        } else if (key == "grammar") {
          take_grammar(value, "structured_outputs.grammar");
        } else if (key == "structural_tag") {
          take_structural_tag(value, "structured_outputs.structural_tag");
        } else if (key == "whitespace_pattern") {
          if (!value.is_string())
            bad_param("structured_outputs.whitespace_pattern", "'structured_outputs.whitespace_pattern' must be a "
                      "string");
          whitespace = value.get<std::string>();
        } else if (key == "disable_any_whitespace") {
          if (value.is_boolean() && value.get<bool>() && !whitespace) whitespace = "";
        } else if (key == "disable_fallback" || key == "disable_additional_properties") {
          continue;  // options of vLLM's backends: no keys but the listed properties are generated anyway
        } else {
          const std::string name = "structured_outputs." + key;
          bad_param(name.c_str(), "'" + name + "' is not a structured_outputs field");
        }
      }
    }
    if (source == nullptr) return nullptr;
    if (p.guided.json_schema) p.guided.whitespace_pattern = whitespace;  // (only JSON has whitespace to choose)
    if (p.allowed_token_ids)
      bad_param(source, std::string("'") + source + "' cannot be combined with allowed_token_ids");
    if (p.min_tokens > 0) bad_param(source, std::string("'") + source + "' cannot be combined with min_tokens > 0");
    try {
      return guides_.get(p.guided, model_.guide_vocab);
    } catch (const zipage::error& e) {
      bad_param(source, std::string("'") + source + "': " + e.what());
    }
  }

  std::vector<zipage::token_id> check_tokens(const json& list, const char* param) const {
    std::vector<zipage::token_id> out;
    for (const auto& t : list) out.push_back(token_of(t, param));
    if (out.empty()) bad_param(param, std::string("'") + param + "' holds an empty token list");
    return out;
  }

  // add_special: the model's BOS first where its tokenizer adds one (vLLM's add_special_tokens).
  std::vector<zipage::token_id> encode(const std::string& text, bool add_special = true) const {
    auto ids = add_special ? model_.text->encode(text) : model_.text->encode_templated(text);
    if (ids.empty()) bad_param("prompt", "the prompt encodes to no tokens");
    return ids;
  }

  // prompt: a string, a list of strings, a list of token ids, or a list of token-id lists; strings encoded with
  // the special tokens unless add_special_tokens is false (vLLM's completion field, default true).
  std::vector<std::vector<zipage::token_id>> completion_prompts(const json& body) const {
    const json* p = field(body, "prompt");
    if (!p) bad_param("prompt", "'prompt' is required");
    const bool special = boolean(body, "add_special_tokens").value_or(true);
    const auto encode = [&](const std::string& text) { return this->encode(text, special); };
    std::vector<std::vector<zipage::token_id>> out;
    if (p->is_string()) {
      out.push_back(encode(p->get<std::string>()));
    } else if (p->is_array()) {
      if (p->empty()) bad_param("prompt", "'prompt' must not be an empty list");
      if ((*p)[0].is_number_integer()) {
        out.push_back(check_tokens(*p, "prompt"));
      } else {
        for (const auto& e : *p) {
          if (e.is_string()) out.push_back(encode(e.get<std::string>()));
          else if (e.is_array()) out.push_back(check_tokens(e, "prompt"));
          else bad_param("prompt", "'prompt' list items must be strings or token lists, got " + got(e));
        }
      }
    } else {
      bad_param("prompt", "'prompt' must be a string or a list, got " + got(*p));
    }
    if (out.size() > 128) bad_param("prompt", "at most 128 prompts per request");
    return out;
  }

  // A chat request's messages as the template reads them (OpenAI's message objects): roles checked
  // ("developer" is OpenAI's newer "system"), text content parts joined by newlines, a null or missing content
  // made "" (an assistant turn with tool calls comes back from OpenAI's clients with "content": null, and
  // templates test or split it as a string), assistant tool calls' JSON "arguments" strings parsed into objects
  // (as vLLM hands them all to templates); other fields pass through.
  static json chat_messages(const json& body) {
    const json* msgs = field(body, "messages");
    if (!msgs) bad_param("messages", "'messages' is required");
    if (!msgs->is_array() || msgs->empty()) bad_param("messages", "'messages' must be a non-empty list");
    json out = json::array();
    for (const auto& m : *msgs) {
      if (!m.is_object()) bad_param("messages", "each message must be an object, got " + got(m));
      const json* role = field(m, "role");
      if (!role || !role->is_string()) bad_param("messages", "each message needs a string 'role'");
      json msg = m;
      if (*role == "developer") msg["role"] = "system";
      if (const json* c = field(m, "content"); !c) {  // missing or null
        msg["content"] = "";
      } else if (c->is_array()) {
        std::string content;
        for (const auto& part : *c) {
          const json* type = part.is_object() ? field(part, "type") : nullptr;
          const json* text = part.is_object() ? field(part, "text") : nullptr;
          if (!type || *type != "text" || !text || !text->is_string())
            bad_param("messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
          const auto& piece = text->get_ref<const std::string&>();
          if (piece.empty()) continue;  // vLLM drops empty parts, then joins the rest with "\n"
          content += (content.empty() ? "" : "\n") + piece;
        }
        msg["content"] = std::move(content);
      } else if (!c->is_string()) {
        bad_param("messages", "a message's 'content' must be a string, null or a list of text parts, got " + got(*c));
      }
      if (const json* calls = field(m, "tool_calls"); calls && !calls->is_null()) {
        if (!calls->is_array()) bad_param("messages", "'tool_calls' must be a list");
        for (auto& call : msg["tool_calls"]) {
          json* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
          if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
            bad_param("messages", "each tool call needs a 'function' object with a string 'name'");
          if (fn->contains("arguments") && (*fn)["arguments"].is_string()) {
            try {
              json args = zipage::json::parse_as<json>((*fn)["arguments"].get<std::string>(), "tool call arguments");
              if (args.is_object()) (*fn)["arguments"] = std::move(args);
            } catch (const zipage::error&) {  // not JSON: the template gets the string
            }
          }
        }
      }
      out.push_back(std::move(msg));
    }
    return out;
  }

  // OpenAI's tools: a list of {"type": "function", "function": {"name", "description", "parameters"}}.
  // They are rendered into the prompt. With tool_choice "none" the answer is text; with "auto" (OpenAI's
  // default when tools are given) its tool calls are parsed (--enable-auto-tool-choice --tool-call-parser),
  // and without those flags "auto" is refused by name, as vLLM refuses it.
  json chat_tools(const json& body, bool* auto_tools) const {
    const json* tools = field(body, "tools");
    if (!tools || tools->is_null()) return nullptr;
    if (!tools->is_array()) bad_param("tools", "'tools' must be a list, got " + got(*tools));
    for (const auto& t : *tools) {
      const json* fn = t.is_object() ? field(t, "function") : nullptr;
      if (!t.is_object() || field(t, "type") == nullptr || *field(t, "type") != "function" || !fn || !fn->is_object() ||
          !field(*fn, "name") || !field(*fn, "name")->is_string())
        bad_param("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
    }
    const json* choice = field(body, "tool_choice");
    const bool none = choice && choice->is_string() && *choice == "none";
    if (!tools->empty() && !none && !so_.enable_auto_tool_choice)
      bad_param("tool_choice", "\"auto\" tool choice needs zipage-serve started with --enable-auto-tool-choice "
                               "--tool-call-parser NAME (" + zipage::tool_call_format_names() + "); or pass \"tool_choice\": \"none\" to render the tools into the "
                               "prompt and receive the model's text");
    if (auto_tools) *auto_tools = !tools->empty() && !none;
    return *tools;
  }

  // The prompt's ids; `info` (when given) learns what the answer's parsers need to know.
  std::vector<zipage::token_id> chat_prompt(const json& body, chat_prompt_info* info = nullptr) const {
    const json messages = chat_messages(body);
    // add_generation_prompt / continue_final_message (vLLM's, as transformers' apply_chat_template): end with
    // the assistant's header (the default), with nothing, or inside the last (assistant) message, so the
    // model continues its text.
    const auto add_generation_prompt = boolean(body, "add_generation_prompt");
    const bool continue_final = boolean(body, "continue_final_message").value_or(false);
    if (continue_final && add_generation_prompt.value_or(false))
      bad_param("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    const json& last = messages.back();
    const std::string last_content = last.contains("content") && last["content"].is_string() ? last["content"].get<std::string>() : "";
    if (continue_final && (last["role"] != "assistant" || last_content.empty()))
      bad_param("continue_final_message",
                "'continue_final_message' needs the last message to be an assistant message with content");
    const auto& text = *model_.text;
    zipage::chat_options opts;
    opts.tools = chat_tools(body, info ? &info->auto_tools : nullptr);  // checked before anything is rendered
    if (eo_.chat_template == "plain") {  // no turn markup: nothing to add or to leave open
      if (!opts.tools.is_null() && !opts.tools.empty())
        bad_param("tools", "tools need a chat template to be rendered; this server runs with --chat-template plain");
      std::string joined;
      for (const auto& m : messages)
        joined += (joined.empty() ? "" : "\n") + (m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "");
      return encode(joined, boolean(body, "add_special_tokens").value_or(true));  // no template: as a completion
    }
    if (!text.has_chat_template())
      throw api_error(400, "model '" + name() + "' has no chat template; use /v1/completions, or start zipage-serve "
                           "with --chat-template plain to send the messages' contents as plain text, or "
                           "--chat-template FILE to give one",
                      "messages", "invalid_request_error", "no_chat_template");
    opts.add_generation_prompt = !continue_final && add_generation_prompt.value_or(true);
    if (const json* kw = field(body, "chat_template_kwargs")) {
      if (!kw->is_object()) bad_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      opts.template_kwargs = *kw;
    }
    std::string rendered;
    try {
      rendered = text.apply_chat_template_json(messages, opts);
    } catch (const zipage::error& e) {
      bad_param("messages", e.what());
    }
    if (continue_final) {
      // Cut right after the final message's text, dropping the end-of-turn the template closed it with.
      const std::size_t at = rendered.rfind(last_content);
      if (at == std::string::npos)
        bad_param("continue_final_message", "the chat template does not write the final message's text verbatim");
      rendered.resize(at + last_content.size());
    }
    if (info) {
      info->opens_reasoning = zipage::prompt_opens_reasoning(rendered);
      info->closes_reasoning = zipage::prompt_closes_reasoning(rendered);
    }
    // The template writes the special tokens it wants; add_special_tokens (vLLM's chat field, default false) adds
    // the tokenizer's own on top.
    return boolean(body, "add_special_tokens").value_or(false) ? text.encode(rendered) : text.encode_templated(rendered);
  }

  const server_options& so_;
  const zipage_cli::engine_options& eo_;
  const served_model& model_;
  engine_service& service_;
  server_metrics& metrics_;
  std::time_t created_;
  std::mutex rng_mutex_;
  std::mt19937_64 rng_;
  zipage::tool_call_format tool_format_;
  const std::optional<zipage::reasoning_tags> think_tags_;  // <think> / </think> as token ids (think_tags_of)
  zipage::guide_cache guides_;  // compiled structured-output constraints, shared by the handler threads

  // <think> and </think> as single tokens (Qwen3's and DeepSeek-R1's tokenizers have them), for guided chat answers
  // that may think first; none where the tokenizer splits either.
  static std::optional<zipage::reasoning_tags> think_tags_of(const zipage_cli::model_text& text) {
    const auto one = [&](std::string_view tag) -> zipage::token_id {
      const std::vector<zipage::token_id> ids = text.encode_templated(std::string(tag));
      return ids.size() == 1 ? ids.front() : -1;
    };
    zipage::reasoning_tags tags;
    tags.open = one(zipage::think_open);
    tags.close = one(zipage::think_close);
    if (tags.open < 0 || tags.close < 0 || tags.open == tags.close) return std::nullopt;
    return tags;
  }

  // zipage-serve's flag check refuses unknown names before the model loads; this one guards other callers.
  static zipage::tool_call_format tool_format_of(const std::string& name) {
    if (name.empty()) return zipage::tool_call_format::hermes;  // unused: no tool calls are parsed
    const auto format = zipage::tool_call_format_named(name);
    zipage::check(format.has_value(), "--tool-call-parser ", name, ": unknown tool-call parser; supported: ",
                  zipage::tool_call_format_names());
    return *format;
  }
};

// ---------------------------------------------------------------------------------------------
// Client liveness: the handler finds its connection's socket (by the addresses httplib reports) and hands
// it to the hang-up watch, so a client that goes away is noticed at once even when nothing is being
// written (queued requests, non-streaming requests).
// ---------------------------------------------------------------------------------------------

// "address|port", as httplib reports a request's ends (numeric address text).
std::string endpoint_key(const std::string& addr, int port) { return addr + "|" + std::to_string(port); }

// The same key for a socket address; empty for a family other than IPv4/IPv6.
std::string endpoint_key(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
    return endpoint_key(buf, ntohs(in.sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
    return endpoint_key(buf, ntohs(in6.sin6_port));
  }
  return {};
}

bool same_endpoint(const sockaddr_storage& a, const std::string& addr, int port) {
  return endpoint_key(a) == endpoint_key(addr, port);
}

// This process's sockets: f(fd, peer address or nullptr for a socket without a peer, such as a listener,
// local address) returns false to stop. httplib 0.11 does not hand out its sockets, so they are found by
// their addresses. `local` is a callable: most sockets are ruled out by their peer alone, and with 1,000
// connections open every request's lookup walks all of them.
template <class F>
void for_each_socket(F&& f) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (const dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage peer{};
    socklen_t pl = sizeof peer;
    const bool connected = getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0;
    if (!connected && errno == ENOTSOCK) continue;
    const auto local = [fd](sockaddr_storage& out) {
      socklen_t ll = sizeof out;
      return getsockname(fd, reinterpret_cast<sockaddr*>(&out), &ll) == 0;
    };
    if (!f(fd, connected ? &peer : nullptr, local)) break;
  }
  closedir(dir);
}

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// A handler's wait for its request's events is woken by tokens and by the client's hang-up; the timeout
// only bounds a missed wake-up.
constexpr std::chrono::milliseconds handler_wait = 1s;

// Finds the socket of a request's connection (-1 if none). A walk of /proc/self/fd costs a syscall per open
// socket, and requests come in bursts: one walk records every connection by its peer, so the rest of a
// burst finds its socket with one check of the recorded number (which may have been reused meanwhile: the
// check compares both addresses) instead of a walk each (5,000 streams: 5,000 walks of 5,000 sockets).
class socket_finder {
 public:
  int find(const httplib::Request& req) {
    const std::string key = endpoint_key(req.remote_addr, req.remote_port);
    {
      std::lock_guard lock(m_);
      if (auto it = seen_.find(key); it != seen_.end()) {
        const int fd = it->second;
        seen_.erase(it);
        if (is_connection_of(fd, req)) return fd;
      }
    }
    std::unordered_map<std::string, int> all;
    for_each_socket([&](int fd, const sockaddr_storage* peer, auto) {
      if (peer != nullptr) all[endpoint_key(*peer)] = fd;
      return true;
    });
    int found = -1;
    if (auto it = all.find(key); it != all.end()) {
      if (is_connection_of(it->second, req)) found = it->second;
      all.erase(it);
    }
    std::lock_guard lock(m_);
    seen_ = std::move(all);
    return found;
  }

 private:
  static bool is_connection_of(int fd, const httplib::Request& req) {
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    return getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 &&
           same_endpoint(peer, req.remote_addr, req.remote_port) &&
           getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) == 0 &&
           same_endpoint(local, req.local_addr, req.local_port);
  }

  std::mutex m_;
  std::unordered_map<std::string, int> seen_;  // peer "address|port" -> socket, from the last walk
};

// Tunes the listener (the socket on `port` without a peer) that httplib 0.11 made:
// - its backlog of 5 (compiled into the library) made a burst of connects beyond it wait for a SYN
//   retransmit (~1 s); listening again on the bound socket widens the queue (Linux updates it in place);
// - TCP_DEFER_ACCEPT (nginx's `deferred`): a connection is accepted once its request has arrived. httplib
//   gives each accepted connection a thread that polls every ~11 ms until the first request comes, and
//   closes the connection after the keep-alive timeout; a busy client that connects a thousand sockets
//   and writes to them over tens of seconds cost a core of polling, and its last requests were cut off.
//   A client that never writes is still accepted after defer_accept_s, then meets the timeout as before.
void tune_listener(int port) {
  constexpr int defer_accept_s = 30;
  for_each_socket([&](int fd, const sockaddr_storage* peer, auto local) {
    sockaddr_storage here{};
    if (peer != nullptr || !local(here) || port_of(here) != port) return true;
    ::listen(fd, SOMAXCONN);
    if (here.ss_family == AF_INET || here.ss_family == AF_INET6)
      setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_accept_s, sizeof defer_accept_s);
    return true;
  });
}

// At shutdown, once no request is in flight: closes the connections still open to `port` (idle keep-alive
// ones, whose httplib threads would otherwise wait out the keep-alive timeout before the server can stop).
void close_connections(int port) {
  for_each_socket([&](int fd, const sockaddr_storage* peer, auto local) {
    sockaddr_storage here{};
    if (peer != nullptr && local(here) && port_of(here) == port) ::shutdown(fd, SHUT_RDWR);
    return true;
  });
}

// The request's Content-Length when it is above `limit` (a value too large to parse counts as above), else none.
std::optional<std::string> length_above(const httplib::Request& req, std::size_t limit) {
  if (!req.has_header("Content-Length")) return std::nullopt;
  const std::string v = req.get_header_value("Content-Length");
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (end != v.data() + v.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) return std::nullopt;
  if (ec == std::errc() && n <= limit) return std::nullopt;
  return v;  // (a malformed value is left to httplib: 400)
}

// A 413 naming --max-body-bytes for a declared body above it.
void too_large(httplib::Response& res, const std::string& length, std::size_t limit) {
  res.status = 413;
  res.set_content(error_json("a request body of " + zipage::json::printable(length) +
                                 " bytes (Content-Length) is more than --max-body-bytes (" + std::to_string(limit) + ")",
                             "invalid_request_error", {}, "payload_too_large").dump(),
                  "application/json");
}

// Reads and drops what a client still sends, until it pauses for `quiet_ms` or `most_ms` have passed, before a
// 413 closes its connection unread: closing a socket with unread bytes sends a reset, which a client still
// writing its body could get instead of the answer. A client that sent only the headers waits one pause.
void drop_pending_input(int fd, int quiet_ms, int most_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(most_ms);
  char buf[1 << 16];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, quiet_ms) <= 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  }
}

// ---------------------------------------------------------------------------------------------
// Responses.
// ---------------------------------------------------------------------------------------------

std::string random_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = std::random_device{}();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(counter++));
  return buf;
}

// One sampled token's log-probability entry: its text delta, log-probability and the step's alternatives.
struct logprob_entry {
  std::string text;
  zipage::token_id token = -1;
  float logprob = 0.0f;
  std::vector<zipage::token_logprob> top;
};

// What one choice has produced so far, and how much of its text the client has been sent.
struct choice_state {
  std::string text;  // the text the engine's events added (the final text on finish)
  std::size_t sent = 0;
  std::size_t logprob_text_offset = 0;  // where the next logprobs entry's token starts (its tokens' texts so far)
  bool finished = false;
  bool role_sent = false;
  bool reported = false;  // its end has been sent (streaming)
  std::string finish_reason, error;
  zipage::stopped_by stop_reason;  // the engine's (vLLM's stop_reason), once finished
  int completion_tokens = 0;  // once finished
  int generated = 0;          // tokens so far (continuous usage stats)
  std::vector<logprob_entry> logprobs;  // not yet sent
  std::optional<zipage::reasoning_stream> reasoning;  // --reasoning-parser, streaming
  std::optional<zipage::tool_call_stream> tool_calls;  // --tool-call-parser, streaming
};

// A parsed call as OpenAI's message.tool_calls item; arguments re-serialised as Python's json.dumps writes
// them (vLLM's), ids derived from the response's id (for Mistral, 9 letters and digits, as its tokenizers
// require them).
json tool_call_json(const std::string& response_id, std::size_t choice, std::size_t k,
                    const zipage::parsed_tool_call& call, zipage::tool_call_format format) {
  std::string arguments = call.arguments;
  if (const auto j = json::parse(arguments, nullptr, false); j.is_object())
    arguments = zipage::jinja::to_json(zipage::jinja::value::from_json(j));
  // Unique over the response's choices too: a client keys the tool results by id.
  const std::string of_choice = choice == 0 ? response_id : response_id + "-" + std::to_string(choice);
  std::string id = format == zipage::tool_call_format::mistral ? zipage::mistral_tool_call_id(of_choice, k)
                                                               : "call-" + of_choice + "-" + std::to_string(k);
  return {{"id", std::move(id)},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", std::move(arguments)}}}};
}

// JSON numbers cannot be -inf or NaN: a token the model rules out gets -9999, as OpenAI and vLLM report it, and
// so does every token of a logits row with no finite value (NaN: the entry is kept, the lists stay as long as
// the tokens).
double json_logprob(float lp) { return std::isnan(lp) || lp < -9999.0f ? -9999.0 : static_cast<double>(lp); }

// vLLM's stop_reason: the stop token's id, the stop string, or null (the model's EOS, length).
json stop_reason_json(const zipage::stopped_by& r) {
  if (const auto* id = std::get_if<zipage::token_id>(&r)) return *id;
  if (const auto* text = std::get_if<std::string>(&r)) return *text;
  return nullptr;
}

// A streamed chat chunk's choices: choice i with `delta`, vLLM's fields in OpenAI's order. vLLM writes chat
// chunks with exclude_unset and sets stop_reason only on the choice that finishes, so a chunk before the last has
// no stop_reason key at all (its completions chunks, written in full, have it null; see drain_sse).
json chat_delta(std::size_t i, json delta, json lp) {
  return json::array(
      {{{"index", i}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}});
}

// A streamed chat choice made the one that finishes: finish_reason and, only here, stop_reason.
void finish_choice(json& choice, const std::string& finish_reason, const zipage::stopped_by& stop_reason) {
  choice["finish_reason"] = finish_reason;
  choice["stop_reason"] = stop_reason_json(stop_reason);
}

// The finishing chunk when no delta is left to carry it.
json chat_finish(std::size_t i, const std::string& finish_reason, const zipage::stopped_by& stop_reason) {
  json list = chat_delta(i, json::object(), nullptr);
  finish_choice(list[0], finish_reason, stop_reason);
  return list;
}

// A token's own text (its bytes; possibly part of a UTF-8 character), for the alternatives.
std::string token_piece(const zipage_cli::model_text* text, zipage::token_id id) {
  std::string out;
  if (text == nullptr) return out;
  try {
    if (text->bpe) {
      text->bpe->append_token_bytes(out, id);
    } else if (text->spm) {
      bool at_start = false;
      text->spm->append_token_text(out, id, at_start);
    }
  } catch (const std::exception&) {
    out.clear();  // an id the tokenizer does not define (a padded vocabulary): no text
  }
  return out;
}

json byte_list(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// How logprobs name a token: its own bytes (possibly part of a UTF-8 character; OpenAI's chat "bytes"), and its
// text, the same for the sampled token and the alternatives (a lone byte of a character reads U+FFFD, as vLLM's
// per-token decode gives it), or "token_id:N" with return_tokens_as_token_ids (vLLM's).
struct token_name {
  std::string text, bytes;
};
token_name name_of(const gen_request& req, zipage::token_id id) {
  if (req.tokens_as_ids) {
    std::string text = "token_id:" + std::to_string(id);
    return {text, text};
  }
  std::string bytes = token_piece(req.text, id);
  return {zipage::utf8::sanitize(bytes), std::move(bytes)};
}

// OpenAI's shapes: chat {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]};
// completions {tokens, token_logprobs, top_logprobs: [{text: logprob}: the k best, most likely first, and the
// sampled token (alone when logprobs is 0), as vLLM; alternatives whose texts coincide (lone bytes of UTF-8
// characters) keep the likeliest, as a JSON object must have distinct keys], text_offset}.
json logprobs_json(const gen_request& req, const std::vector<logprob_entry>& entries, std::size_t text_offset) {
  if (req.chat) {
    json content = json::array();
    for (const auto& e : entries) {
      json top = json::array();
      for (const auto& t : e.top) {
        const token_name n = name_of(req, t.id);
        top.push_back({{"token", n.text}, {"logprob", json_logprob(t.logprob)}, {"bytes", byte_list(n.bytes)}});
      }
      const token_name n = name_of(req, e.token);
      content.push_back(
          {{"token", n.text}, {"logprob", json_logprob(e.logprob)}, {"bytes", byte_list(n.bytes)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), offsets = json::array(), tops = json::array();
  for (const auto& e : entries) {
    const std::string sampled = name_of(req, e.token).text;
    tokens.push_back(sampled);
    lps.push_back(json_logprob(e.logprob));
    offsets.push_back(text_offset);  // where the token's text starts in the choice's text
    json top = json::object();
    for (const auto& t : e.top) top.emplace(name_of(req, t.id).text, json_logprob(t.logprob));  // first = likeliest
    top.emplace(sampled, json_logprob(e.logprob));
    tops.push_back(std::move(top));
    text_offset += e.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// One streaming or non-streaming generation, from submission to its last byte.
struct generation {
  gen_request req;
  std::shared_ptr<channel> ch = std::make_shared<channel>();
  std::vector<choice_state> choices;
  std::string id;
  std::time_t created = std::time(nullptr);
  std::string model;
  int prompt_tokens = 0;
  hangup_watch::ticket watched;  // while the request waits on its connection
  std::size_t open = 0;  // choices not yet finished
  bool done = false;     // [DONE] written (streaming) or the body built

  void absorb(choice_event& e) {
    auto& c = choices[static_cast<std::size_t>(e.choice)];
    if (!e.finished || e.finish_reason == "stop" || e.finish_reason == "length") {
      c.text += e.text;
      if (e.token >= 0) ++c.generated;
      if (req.logprobs && e.logprob)
        c.logprobs.push_back({e.token_text, e.token, *e.logprob, std::move(e.top_logprobs)});
    }
    if (e.finished) {
      c.finished = true;
      c.text = e.final_text;
      c.finish_reason = e.finish_reason;
      c.stop_reason = e.stop_reason;
      c.error = e.error;
      c.completion_tokens = e.completion_tokens;
      --open;
    }
  }

  json usage() const {
    int completion = 0;
    for (const auto& c : choices) completion += c.finished ? c.completion_tokens : c.generated;
    return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion}, {"total_tokens", prompt_tokens + completion}};
  }

  json chunk(json choice_list) const {
    json j = {{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", std::move(choice_list)}};
    if (req.include_usage) j["usage"] = req.continuous_usage ? usage() : json(nullptr);
    return j;
  }

  // Content for the client now: with tool-call parsing, text from where a call may start is held for the end.
  std::string tool_content(choice_state& c, const std::string& text) const {
    if (!req.parse_tool_calls) return text;
    if (!c.tool_calls) c.tool_calls.emplace(req.tool_format);
    return c.tool_calls->push(text);
  }

  // SSE events for what the client has not seen yet.
  std::string drain_sse() {
    std::string out;
    auto emit = [&](const json& j) { out += "data: " + dump_json(j) + "\n\n"; };
    for (std::size_t i = 0; i < choices.size(); ++i) {
      auto& c = choices[i];
      if (c.reported) continue;
      if (c.finished && c.finish_reason != "stop" && c.finish_reason != "length") {
        // An engine error, or a cancellation at shutdown: an error event in the stream, as vLLM sends one.
        const bool error = c.finish_reason == "error";
        emit(error_json(error ? c.error : "the request was cancelled: the server is shutting down",
                        error ? "server_error" : "service_unavailable", {}, error ? "" : "shutting_down"));
        c.reported = true;
        continue;
      }
      const bool role_due = req.chat && !c.role_sent;
      if (!c.finished && !role_due && c.text.size() <= c.sent && c.logprobs.empty()) continue;
      // The engine's events already hold back text a stop string could still cut (zipage::step_event::text), so
      // all that arrived can go.
      const std::size_t upto = std::max(c.text.size(), c.sent);
      const std::string delta = c.text.substr(c.sent, upto - c.sent);
      json lp = req.logprobs && !c.logprobs.empty() ? logprobs_json(req, c.logprobs, c.logprob_text_offset) : json(nullptr);
      for (const auto& e : c.logprobs) c.logprob_text_offset += e.text.size();
      c.logprobs.clear();
      if (req.chat) {
        if (role_due) {
          emit(chunk(chat_delta(i, {{"role", "assistant"}, {"content", ""}}, nullptr)));
          c.role_sent = true;
        }
        // This drain's deltas, held so that the last one carries finish_reason, as vLLM sends the last delta
        // (text, tool calls) with it; a chunk of its own with an empty delta only when nothing is left to send.
        std::vector<json> deltas;
        const auto send = [&](json choice_list) { deltas.push_back(std::move(choice_list)); };
        if (req.split_reasoning) {
          // reasoning_content and content deltas, a <think> tag split across deltas held back until it is whole
          if (!c.reasoning) c.reasoning.emplace(req.reasoning_opened);
          auto d = c.reasoning->push(delta);
          if (c.finished) {
            auto rest = c.reasoning->finish();
            d.reasoning += rest.reasoning;
            d.content += rest.content;
          }
          auto part = [&](const char* key, const std::string& text) {
            send(chat_delta(i, {{key, text}}, lp));
            lp = nullptr;  // the step's logprobs go with the first part
          };
          if (!d.reasoning.empty() && req.include_reasoning) part("reasoning_content", d.reasoning);
          // Text a tool call may start with is held back (tool_content): nothing to send unless logprobs are due.
          const std::string content = d.content.empty() ? d.content : tool_content(c, d.content);
          if (!content.empty() || !lp.is_null()) part("content", content);
        } else if (!delta.empty() || !lp.is_null() || (c.finished && req.parse_tool_calls)) {
          const std::string content = tool_content(c, delta);
          if (!content.empty() || !lp.is_null())
            send(chat_delta(i, {{"content", content}}, lp));
        }
        std::string finish_reason = c.finish_reason;
        if (c.finished && req.parse_tool_calls) {
          // The answer's end: held text that turned out not to be calls goes out as content, calls as one delta.
          auto end = c.tool_calls ? c.tool_calls->finish() : zipage::tool_call_stream::ending{};
          if (!end.content.empty())
            send(chat_delta(i, {{"content", end.content}}, nullptr));
          if (!end.calls.empty()) {
            json calls = json::array();
            for (std::size_t k = 0; k < end.calls.size(); ++k) {
              json call = tool_call_json(id, i, k, end.calls[k], req.tool_format);
              call["index"] = k;
              calls.push_back(std::move(call));
            }
            send(chat_delta(i, {{"tool_calls", std::move(calls)}}, nullptr));
            if (finish_reason == "stop") finish_reason = "tool_calls";
          }
        }
        if (c.finished && deltas.empty()) deltas.push_back(chat_finish(i, finish_reason, c.stop_reason));
        else if (c.finished) finish_choice(deltas.back()[0], finish_reason, c.stop_reason);
        for (json& d : deltas) emit(chunk(std::move(d)));
      } else if (!delta.empty() || !lp.is_null() || c.finished) {
        emit(chunk(json::array({{{"index", i},
                                 {"text", delta},
                                 {"logprobs", lp},
                                 {"finish_reason", c.finished ? json(c.finish_reason) : json(nullptr)},
                                 {"stop_reason", c.finished ? stop_reason_json(c.stop_reason) : json(nullptr)}}})));
      }
      c.sent = upto;
      c.reported = c.finished;
    }
    if (open == 0 && !done) {
      if (req.include_usage) {
        json u = chunk(json::array());
        u["usage"] = usage();
        emit(u);
      }
      out += "data: [DONE]\n\n";
      done = true;
    }
    return out;
  }

  // The non-streaming body (every choice finished).
  json body() const {
    json list = json::array();
    for (std::size_t i = 0; i < choices.size(); ++i) {
      const auto& c = choices[i];
      json lp = req.logprobs ? logprobs_json(req, c.logprobs, 0) : json(nullptr);
      if (req.chat) {
        json message = {{"role", "assistant"}, {"content", c.text}};
        if (req.split_reasoning) {
          const auto s = zipage::split_reasoning(c.text, req.reasoning_opened);
          message["content"] = s.content ? json(*s.content) : json(nullptr);
          message["reasoning_content"] = s.reasoning && req.include_reasoning ? json(*s.reasoning) : json(nullptr);
        }
        std::string finish_reason = c.finish_reason;
        if (req.parse_tool_calls && message["content"].is_string()) {
          auto s = zipage::split_tool_calls(message["content"].get<std::string>(), req.tool_format);
          if (!s.calls.empty()) {
            message["content"] = s.content ? json(*s.content) : json(nullptr);
            json calls = json::array();
            for (std::size_t k = 0; k < s.calls.size(); ++k) calls.push_back(tool_call_json(id, i, k, s.calls[k], req.tool_format));
            message["tool_calls"] = std::move(calls);
            if (finish_reason == "stop") finish_reason = "tool_calls";
          }
        }
        list.push_back({{"index", i},
                        {"message", std::move(message)},
                        {"logprobs", lp},
                        {"finish_reason", finish_reason},
                        {"stop_reason", stop_reason_json(c.stop_reason)}});
      } else {
        list.push_back({{"index", i},
                        {"text", c.text},
                        {"logprobs", lp},
                        {"finish_reason", c.finish_reason},
                        {"stop_reason", stop_reason_json(c.stop_reason)}});
      }
    }
    return {{"id", id},
            {"object", req.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", list},
            {"usage", usage()}};
  }
};

// httplib's worker threads, started as connections need them (up to `max`) rather than all at once.
class growing_pool final : public httplib::TaskQueue {
 public:
  explicit growing_pool(std::size_t max) : max_(max) {}
  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(m_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
    cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lock(m_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(m_);
        ++idle_;
        cv_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        --idle_;
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  std::size_t max_;
  std::mutex m_;
  std::condition_variable cv_;
  std::list<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool shutdown_ = false;
};

// The start line's context: the limit served, or that there is none.
std::string context_line(const served_model& m) {
  if (m.max_context > 0) return std::to_string(m.max_context) + " tokens";
  if (m.model_context > 0)
    return "no limit: --allow-beyond-context, the model's is " + std::to_string(m.model_context) + " tokens";
  return "unknown";
}

}  // namespace

int serve(const server_options& so_in, const zipage_cli::engine_options& eo, const served_model& model,
          engine_driver& driver) {
  server_options so = so_in;
  server_metrics metrics;
  engine_service service(driver, metrics);
  api a(so, eo, model, service, metrics);
  // Choices held at once (running + waiting); both flags may be as large as an int, so their sum is clamped.
  const int limit = static_cast<int>(
      std::min<long long>(std::numeric_limits<int>::max(), static_cast<long long>(model.max_num_seqs) + so.max_queue));
  const std::size_t threads =
      so.http_threads > 0 ? static_cast<std::size_t>(so.http_threads) : std::min<std::size_t>(4096, static_cast<std::size_t>(limit) + 16);

  hangup_watch hangups;  // before svr: handlers hold its tickets until the listener has stopped
  socket_finder sockets;
  httplib::Server svr;
  svr.new_task_queue = [threads] { return new growing_pool(threads); };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second server bind a port in use
  // and take half its connections.
  svr.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Before httplib reads a body: a known route with the wrong method is a 405 naming the right one; a body
  // with neither Content-Length nor chunked encoding is a 411 (httplib 0.11 would read it until the client
  // closes: the 30 s read timeout for a client that waits for the answer); a declared length above
  // --max-body-bytes is a 413 (httplib reads and drops such a body before answering: the same 30 s for a client
  // that waits). Every connection closes after its response (keep_alive_max_count 1, below), so no unread body
  // is taken for the next request.
  svr.set_expect_100_continue_handler([limit = so.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    const auto length = length_above(req, limit);
    if (!length) return 100;
    too_large(res, *length, limit);  // the client has not sent its body and will not
    return 413;
  });
  svr.set_pre_routing_handler([&sockets, limit = so.max_body_bytes](const httplib::Request& req,
                                                                    httplib::Response& res) {
    if (const auto length = length_above(req, limit)) {
      too_large(res, *length, limit);
      if (const int fd = sockets.find(req); fd >= 0) drop_pending_input(fd, 200, 30000);
      return httplib::Server::HandlerResponse::Handled;
    }
    static const std::map<std::string, std::string, std::less<>> route_method = {
        {"/health", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
        {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"}};
    const auto route = route_method.find(req.path);
    if (route != route_method.end() && req.method != route->second &&
        !(req.method == "HEAD" && route->second == "GET")) {
      res.status = 405;
      res.set_header("Allow", route->second);
      res.set_content(dump_json(error_json("method " + zipage::json::printable(req.method) + " is not allowed on " +
                                               req.path + "; use " + route->second,
                                           "invalid_request_error", {}, "method_not_allowed")),
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool body_method = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                             req.method == "DELETE" || req.method == "PRI";
    if (!body_method || req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = route == route_method.end() ? 404 : 411;
    res.set_content(route == route_method.end()
                        ? dump_json(error_json("no route " + req.method + " " + zipage::json::printable(req.path),
                                               "invalid_request_error", {}, "not_found"))
                        : error_json("a request body needs a Content-Length header (or chunked transfer encoding)",
                                     "invalid_request_error", {}, "length_required").dump(),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_payload_max_length(so.max_body_bytes);
  // One request per connection (every response says `Connection: close`): a client that reused an idle
  // keep-alive connection just as the server's keep-alive ran out lost that request ("other side closed",
  // seen under 1,000 streams), and httplib 0.11 keeps a thread polling each idle connection every ~11 ms.
  // A new loopback/LAN connection costs microseconds, a generation seconds. The timeout is then only the
  // wait for a connection's first request. A client juggling a thousand streams may send it tens of seconds
  // after it connected (Node did, in the load test, on a loaded 2-core machine: past 60 s, until the
  // server's own polling stopped taking its CPU); tune_listener's TCP_DEFER_ACCEPT hands httplib a
  // connection only once the request is there, so this wait starts late and ends at once.
  svr.set_keep_alive_timeout(60);
  svr.set_keep_alive_max_count(1);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  // Every error status gets OpenAI's error object (httplib's own 404 and 413 included).
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = "error", code;
    if (res.status == 404) msg = "no route " + req.method + " " + zipage::json::printable(req.path), code = "not_found";
    else if (res.status == 413) msg = "request body too large", code = "payload_too_large";
    else if (res.status == 400) msg = "malformed HTTP request";
    res.set_content(dump_json(error_json(msg, res.status >= 500 ? "server_error" : "invalid_request_error", {}, code)),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(dump_json(error_json(msg, "server_error", {}, {})), "application/json");
  });

  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (a.draining) {
      res.status = 503;
      res.set_content(error_json("shutting down", "service_unavailable", {}, "shutting_down").dump(), "application/json");
      return;
    }
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    {
      std::lock_guard lock(metrics.mutex);
      metrics.http_in_flight = a.in_flight.load();
    }
    res.set_content(metrics.render(a.name()), "text/plain; version=0.0.4; charset=utf-8");
  });
  svr.Get("/v1/models", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      a.check_auth(req);
      res.set_content(a.models().dump(), "application/json");
    } catch (const api_error& e) {
      send_error(res, e);
    }
  });

  // Cancels what is left of a request whose client went away and waits for the engine's last events.
  const auto cancel_and_drain = [&service](generation& g) {
    service.cancel(g.ch);
    while (g.open > 0)
      for (auto& e : g.ch->pop_events(handler_wait)) g.absorb(e);
  };
  auto generate = [&](const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto arrival = clock_type::now();
    auto g = std::make_shared<generation>();
    try {
      if (a.draining) throw api_error(503, "the server is shutting down", {}, "service_unavailable", "shutting_down");
      a.check_auth(req);
      try {
        g->req = a.parse(req.body, chat);
      } catch (const api_error& e) {
        if (e.status == 400) {
          std::lock_guard lock(metrics.mutex);
          ++metrics.rejected_invalid;
        }
        throw;
      }
      const int n = static_cast<int>(g->req.jobs.size());
      // More choices than the server ever holds: no retry can succeed, so a 400 rather than a 429.
      if (n > limit) {
        {
          std::lock_guard lock(metrics.mutex);
          ++metrics.rejected_invalid;
        }
        throw api_error(400,
                        "this request has " + std::to_string(n) + " choices (prompts x n); the server holds at most " +
                            std::to_string(limit) + " at once (--max-num-seqs " + std::to_string(model.max_num_seqs) +
                            " + --max-queue " + std::to_string(so.max_queue) + ")",
                        "n");
      }
      if (!service.reserve(n, limit)) {
        std::lock_guard lock(metrics.mutex);
        ++metrics.rejected_queue_full;
        throw api_error(429,
                        "the server is at capacity: " + std::to_string(service.active_choices()) +
                            " requests running or waiting (--max-num-seqs " + std::to_string(model.max_num_seqs) +
                            " + --max-queue " + std::to_string(so.max_queue) + "); retry later",
                        {}, "rate_limit_exceeded", "queue_full");
      }
    } catch (const api_error& e) {
      if (e.status == 503) {
        std::lock_guard lock(metrics.mutex);
        ++metrics.rejected_shutting_down;
      }
      send_error(res, e);
      if (e.status == 503) res.set_header("Connection", "close");
      return;
    }
    g->id = random_id(chat ? "chatcmpl-" : "cmpl-");
    g->model = a.name();
    g->choices.resize(g->req.jobs.size());
    g->open = g->choices.size();
    for (const auto& p : g->req.prompts) g->prompt_tokens += static_cast<int>(p.size());
    std::int64_t choice_prompt_tokens = 0;
    for (const auto& j : g->req.jobs) choice_prompt_tokens += static_cast<std::int64_t>(j.prompt.size());
    service.submit(g->ch, std::move(g->req.jobs), arrival);
    std::string refusal;
    const int settled = g->ch->wait_settled(60s, refusal);
    {
      // Counted once the engine has taken the request: a refused one is a rejection, not accepted tokens.
      std::lock_guard lock(metrics.mutex);
      if (settled == 1) metrics.request_prompt_tokens += choice_prompt_tokens;
      if (settled < 0) ++metrics.rejected_invalid;
    }
    if (settled != 1) {
      if (settled == 0) service.cancel(g->ch);
      send_error(res, settled < 0 ? api_error(400, refusal, chat ? "messages" : "prompt")
                                  : api_error(503, "the engine did not take the request in time", {}, "service_unavailable"));
      return;
    }
    ++a.in_flight;
    g->watched = hangups.watch(sockets.find(req), [ch = g->ch] { ch->hang_up(); });

    if (!g->req.stream) {
      while (g->open > 0) {
        for (auto& e : g->ch->pop_all(handler_wait)) g->absorb(e);
        if (g->open > 0 && g->ch->hung_up()) {
          cancel_and_drain(*g);
          --a.in_flight;
          return;  // nobody to answer
        }
      }
      g->watched = {};
      --a.in_flight;
      for (const auto& c : g->choices) {
        if (c.finish_reason == "error") return send_error(res, api_error(500, c.error, {}, "server_error"));
        if (c.finish_reason == "cancelled")
          return send_error(res, api_error(503, "the request was cancelled: the server is shutting down", {},
                                           "service_unavailable", "shutting_down"));
      }
      res.set_content(dump_json(g->body()), "application/json");
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [g](std::size_t, httplib::DataSink& sink) {
          for (auto& e : g->ch->pop_all(handler_wait)) g->absorb(e);
          if (g->ch->hung_up()) return false;
          const std::string out = g->drain_sse();
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (g->done) sink.done();
          return true;
        },
        [g, &cancel_and_drain, &a](bool) {
          // The client went away (or the write failed): cancel now; the engine frees its KV blocks.
          if (g->open > 0) cancel_and_drain(*g);
          g->watched = {};
          --a.in_flight;
        });
  };
  // The tokenizer alone, as vLLM's routes: nothing reaches the engine.
  auto tokenizer_route = [&](const httplib::Request& req, httplib::Response& res, bool forward) {
    try {
      a.check_auth(req);
      const json out = forward ? a.tokenize(req.body) : a.detokenize(req.body);
      res.set_content(dump_json(out), "application/json");
    } catch (const api_error& e) {
      send_error(res, e);
    }
  };
  svr.Post("/tokenize", [&](const httplib::Request& req, httplib::Response& res) { tokenizer_route(req, res, true); });
  svr.Post("/detokenize", [&](const httplib::Request& req, httplib::Response& res) { tokenizer_route(req, res, false); });
  svr.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
  svr.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });

  int port = so.port;
  if (port == 0) {
    port = svr.bind_to_any_port(so.host);
    zipage::check(port > 0, "cannot listen on ", so.host, " (any port)");
  } else {
    zipage::check(svr.bind_to_port(so.host, port), "cannot listen on ", so.host, ":", port,
                  " (in use, or not an address of this machine)");
  }
  tune_listener(port);
  service.start();

  std::fprintf(stderr, "%s\n%s\n", model.memory_line.c_str(), eo.sampling_line.c_str());
  std::fprintf(stderr,
               "zipage-serve: serving '%s' (context %s, max-num-seqs %d, max-queue %d%s) on http://%s:%d/v1\n",
               a.name().c_str(), context_line(model).c_str(), model.max_num_seqs, so.max_queue,
               so.api_key.empty() ? "" : ", API key required", so.host.c_str(), port);
  std::fflush(stderr);

  // SIGINT/SIGTERM (blocked in every thread by main): stop taking requests (503), let the in-flight ones
  // finish within --shutdown-timeout, cancel what is left, then stop the listener.
  std::atomic<bool> finished{false};
  std::thread signals([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    if (finished) return;
    a.draining = true;
    std::fprintf(stderr, "zipage-serve: %s: draining %d request(s), at most %.1f s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 a.in_flight.load(), so.shutdown_timeout);
    const auto deadline = clock_type::now() + std::chrono::duration<double>(so.shutdown_timeout);
    while (a.in_flight > 0 && clock_type::now() < deadline) std::this_thread::sleep_for(10ms);
    if (a.in_flight > 0) {
      std::fprintf(stderr, "zipage-serve: cancelling %d request(s) still in flight\n", a.in_flight.load());
      service.cancel_all();
      const auto grace = clock_type::now() + 2s;
      while (a.in_flight > 0 && clock_type::now() < grace) std::this_thread::sleep_for(10ms);
    }
    svr.stop();
    close_connections(port);
  });

  const bool ok = svr.listen_after_bind();
  finished = true;
  if (signals.joinable()) {
    pthread_kill(signals.native_handle(), SIGTERM);  // wakes sigwait when the listener ended by itself
    signals.join();
  }
  service.stop();
  std::fprintf(stderr, "zipage-serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace zipage_serve
