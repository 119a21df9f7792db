#pragma once
// Per-request sampling parameters, and the counter-based random numbers that every backend draws with.
//
// The random number for a token depends only on (seed, step), never on a generator's hidden state, so a
// request's output is the same whatever else shares its batch, after preemption and recomputation, and on
// any backend that evaluates sampling_uniform() with the same integer arithmetic.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/host_device.hpp"
#include "zipage/core/types.hpp"

namespace zipage {

// A request's structured output (vLLM's guided_choice / guided_regex / guided_json / guided_grammar /
// structural_tag; zipage/sampling/guided.hpp compiles it): at most one of choice, regex, json_schema, grammar and
// structural_tag. The constraint applies from the first generated token.
struct guided_decoding {
  std::vector<std::string> choice{};  // guided_choice: the output is exactly one of these (non-empty strings)
  std::optional<std::string> regex{};  // guided_regex: the whole output matches it
  // guided_json: the output is JSON text that this JSON Schema (JSON text; zipage/sampling/json_schema.hpp lists
  // the subset) describes. vLLM's json_object is the schema {"type": "object"}.
  std::optional<std::string> json_schema{};
  // With json_schema: the regex of the whitespace allowed between JSON tokens (vLLM's whitespace_pattern);
  // unset: "[ ]?", as outlines.
  std::optional<std::string> whitespace_pattern{};
  // guided_grammar: the output is a string that this GBNF grammar derives from its root rule
  // (zipage/sampling/grammar.hpp; recursion exact at any depth through a pushdown guide, pushdown.hpp).
  std::optional<std::string> grammar{};
  // structured_outputs.structural_tag: this structural tag (JSON text: vLLM's legacy {"structures", "triggers"} or
  // xgrammar's {"format"}; zipage/sampling/structural_tag.hpp lists what is supported): free text in which each
  // trigger starts a structure, or the format's text.
  std::optional<std::string> structural_tag{};

  [[nodiscard]] bool active() const { return count() > 0; }
  // The request field a constraint's error names.
  [[nodiscard]] const char* field() const {
    return regex ? "guided_regex" : json_schema ? "guided_json" : grammar ? "guided_grammar"
         : structural_tag ? "structural_tag" : "guided_choice";
  }
  // How many of the five constraints are set (more than one is an error).
  [[nodiscard]] int count() const {
    return static_cast<int>(!choice.empty()) + static_cast<int>(regex.has_value()) +
           static_cast<int>(json_schema.has_value()) + static_cast<int>(grammar.has_value()) +
           static_cast<int>(structural_tag.has_value());
  }
  friend bool operator==(const guided_decoding&, const guided_decoding&) = default;
};

// A reasoning model's thinking block in token form, for a guided answer that may reason first
// (sampling_params::guided_after_reasoning): the ids of its opening and closing tags (Qwen3's and DeepSeek-R1's
// <think> and </think>), and whether the prompt opened the block already (DeepSeek-R1's template does).
struct reasoning_tags {
  token_id open = -1;   // may start the answer (as its first token) unless `opened`; -1: only with `opened`
  token_id close = -1;  // ends the block; the guide applies to the tokens after it
  bool opened = false;  // the answer starts inside the block
  friend bool operator==(const reasoning_tags&, const reasoning_tags&) = default;
};

class guide;  // zipage/sampling/guided.hpp

struct sampling_params {
  float temperature = 1.0f;         // 0 => greedy
  int top_k = 0;                    // 0 or -1 (vLLM's off) => off; k >= vocabulary size also keeps everything
  float top_p = 1.0f;               // 1 => off
  float min_p = 0.0f;               // 0 => off
  float repetition_penalty = 1.0f;  // 1 => off; over prompt + output tokens, positive logits divided, negative multiplied
  // OpenAI's penalties, over the tokens generated so far (not the prompt), in [-2, 2], 0 => off: a token
  // generated c times has frequency_penalty * c, and presence_penalty once if c > 0, subtracted from its
  // logit (after the repetition penalty, before the temperature), as OpenAI and vLLM do.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::uint64_t seed = 0;           // per-request seed
  int max_tokens = 256;
  bool ignore_eos = false;
  std::vector<std::string> stop{};        // stop strings (need the engine's detokenizer)
  std::vector<token_id> stop_token_ids{};
  bool logprobs = false;  // record the log-probability (under the model, before sampling filters) of each emitted token
  int top_logprobs = 0;   // with logprobs: also the k most likely tokens of each step and their log-probabilities
  int priority = 0;       // under scheduling_order::priority: lower runs first (ties: arrival order)
  // vLLM's include_stop_str_in_output: the output text keeps the stop string that ended it, or the text of the
  // stop_token_ids token that did (left out by default, as in vLLM). EOS's text is always left out.
  bool include_stop_str_in_output = false;
  // vLLM's logits processors. They change the logits before the penalties, the temperature and the filters
  // (greedy's argmax included), in vLLM V1's order: allowed_token_ids, bad_words, logit_bias, min_tokens; the
  // log-probabilities reported stay the raw model's. A request using any of them is sampled on the host.
  // OpenAI's logit_bias: token id -> a bias in [-100, 100] added to that token's logit.
  std::map<token_id, float> logit_bias{};
  // When set: only these ids may be sampled (every other logit is -inf); set but empty is an error, as vLLM.
  std::optional<std::vector<token_id>> allowed_token_ids{};
  // Words never generated: each is encoded (engine_config::encode_words, no special tokens) as written and with
  // a leading space, as vLLM; a word of one token bans it at every step, a longer one bans its last token whenever
  // the generated tokens end with its others. Needs an engine that can encode text (zipage::llm's does).
  std::vector<std::string> bad_words{};
  // Before this many tokens are generated no EOS id (the model's and its end-of-turn ids) and no stop_token_ids
  // id can be sampled (their logits are -inf), and no stop string is looked for, as vLLM. At most max_tokens.
  int min_tokens = 0;
  // Structured output: the generated text must be one of guided.choice, match guided.regex as a whole, be JSON
  // that guided.json_schema describes, a string guided.grammar derives (both compiled to a regex), or text of
  // guided.structural_tag (free text with structures where triggers occur, or a tree of formats). Each
  // step allows only the tokens whose bytes keep the text a prefix of a match (special tokens never), and EOS
  // only once the text is a whole match; at a match no longer choice or regex text extends, EOS is all that is
  // allowed. Needs an engine that knows its tokens' bytes (engine_config::guide_vocab; zipage::llm sets it).
  // Not with allowed_token_ids or min_tokens. An unsupported regex, schema, grammar or structural tag is an error
  // naming guided_regex, guided_json, guided_grammar or structural_tag (zipage/sampling/guided.hpp).
  guided_decoding guided{};
  // With `guided`: the answer may start with a reasoning block, left free, and the guide applies to the tokens
  // after the block's closing tag (vLLM with a reasoning parser: structured output constrains the content, not
  // the thinking). Unless the tags say the prompt opened the block, the first token may be its opening tag as well
  // as what the guide allows; any other first token starts the guided text at once. Unset: the guide applies
  // from the first generated token. zipage-serve sets it for chat with --reasoning-parser.
  std::optional<reasoning_tags> guided_after_reasoning{};

  // Throws zipage::error naming the first bad field and its value. Checks are written as "in range"
  // so that NaN, which fails every comparison, is rejected too.
  void validate() const {
    check(std::isfinite(temperature) && temperature >= 0.0f,
          "sampling: temperature must be finite and >= 0 (0 = greedy), got ", temperature);
    check(top_k >= -1, "sampling: top_k must be >= -1 (0 or -1 = off), got ", top_k);
    check(top_p > 0.0f && top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", top_p);
    check(min_p >= 0.0f && min_p <= 1.0f, "sampling: min_p must be in [0, 1], got ", min_p);
    check(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
          "sampling: repetition_penalty must be finite and > 0 (1 = off), got ", repetition_penalty);
    check(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
          "sampling: frequency_penalty must be in [-2, 2] (0 = off), got ", frequency_penalty);
    check(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
          "sampling: presence_penalty must be in [-2, 2] (0 = off), got ", presence_penalty);
    check(top_logprobs >= 0 && top_logprobs <= max_top_logprobs, "sampling: top_logprobs must be in [0, ",
          max_top_logprobs, "], got ", top_logprobs);
    check(top_logprobs == 0 || logprobs, "sampling: top_logprobs > 0 needs logprobs");
    check(max_tokens >= 1, "sampling: max_tokens must be >= 1, got ", max_tokens);
    // An empty stop string would match at every position and end every request at once.
    for (std::size_t i = 0; i < stop.size(); ++i)
      check(!stop[i].empty(), "sampling: stop[", i, "] must not be empty");
    for (std::size_t i = 0; i < stop_token_ids.size(); ++i)
      check(stop_token_ids[i] >= 0, "sampling: stop_token_ids[", i, "] must be >= 0, got ", stop_token_ids[i]);
    for (const auto& [id, bias] : logit_bias) {
      check(id >= 0, "sampling: logit_bias holds token id ", id, ", which no vocabulary has");
      check(bias >= -100.0f && bias <= 100.0f, "sampling: logit_bias[", id, "] must be in [-100, 100], got ", bias);
    }
    if (allowed_token_ids) {
      check(!allowed_token_ids->empty(), "sampling: allowed_token_ids is set but empty (no token could be sampled)");
      for (std::size_t i = 0; i < allowed_token_ids->size(); ++i)
        check((*allowed_token_ids)[i] >= 0, "sampling: allowed_token_ids[", i, "] must be >= 0, got ",
              (*allowed_token_ids)[i]);
    }
    for (std::size_t i = 0; i < bad_words.size(); ++i)
      check(bad_words[i].find_first_not_of(" \t\n\r\f\v") != std::string::npos, "sampling: bad_words[", i,
            "] must hold more than whitespace");
    for (std::size_t i = 0; i < guided.choice.size(); ++i)
      check(!guided.choice[i].empty(), "sampling: guided_choice[", i, "] must not be empty");
    check(guided.count() <= 1, "sampling: more than one of guided_choice, guided_regex, guided_json, "
          "guided_grammar and structural_tag is set (give one)");
    check(!guided.whitespace_pattern || guided.json_schema, "sampling: guided whitespace_pattern is set without "
          "guided_json");
    check(!guided.active() || !allowed_token_ids, "sampling: ", guided.field(),
          " cannot be combined with allowed_token_ids");
    check(!guided.active() || min_tokens == 0, "sampling: ", guided.field(), " cannot be combined with min_tokens");
    if (guided_after_reasoning) {
      const reasoning_tags& r = *guided_after_reasoning;
      check(guided.active(), "sampling: guided_after_reasoning is set without a guided constraint");
      check(r.close >= 0, "sampling: guided_after_reasoning.close must be a token id >= 0, got ", r.close);
      check(r.opened || r.open >= 0, "sampling: guided_after_reasoning.open must be a token id >= 0 unless the "
            "prompt opened the block (opened), got ", r.open);
      check(r.open != r.close, "sampling: guided_after_reasoning's open and close tags are one token (", r.close, ")");
    }
    check(min_tokens >= 0 && min_tokens <= max_tokens, "sampling: min_tokens must be in [0, max_tokens = ", max_tokens,
          "], got ", min_tokens);
  }

  [[nodiscard]] bool greedy() const { return temperature == 0.0f; }
  [[nodiscard]] bool output_penalties() const { return frequency_penalty != 0.0f || presence_penalty != 0.0f; }
  // Whether a logits processor changes the logits of step `step` (min_tokens only before min_tokens tokens).
  [[nodiscard]] bool processes_logits(std::uint64_t step) const {
    return !logit_bias.empty() || allowed_token_ids.has_value() || !bad_words.empty() || guided.active() ||
           step < static_cast<std::uint64_t>(std::max(min_tokens, 0));
  }

  static constexpr int max_top_logprobs = 20;  // OpenAI's bound
};

// p with the model's end-of-turn ids (a tokenizer EOS that is not the config's, e.g. a base Qwen3's <|im_end|>)
// among its stop ids, unless p ignores EOS: they end a request as EOS does (vLLM adds the generation config's eos
// ids to stop_token_ids only without ignore_eos). Ids p names itself stop it either way; none is added twice.
inline sampling_params with_end_of_turn(sampling_params p, std::span<const token_id> end_of_turn) {
  if (p.ignore_eos) return p;
  for (const token_id id : end_of_turn)
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) == p.stop_token_ids.end())
      p.stop_token_ids.push_back(id);
  return p;
}

// A request's logits processors in token form, which the engine makes when it queues the request: the encoded
// sampling_params::bad_words (vLLM's _bad_words_token_ids) and the EOS ids that min_tokens masks besides the
// request's stop_token_ids (the model's eos, its extra end-of-turn ids, the tokenizer's EOS).
// With sampling_params::guided, its compiled guide, and eos_ids are the ids allowed once the text is a match.
struct token_rules {
  std::vector<std::vector<token_id>> bad_words{};
  std::vector<token_id> eos_ids{};
  std::shared_ptr<const guide> guided{};
};

// vLLM's encoding of bad words (SamplingParams.update_from_tokenizer): each word, leading whitespace stripped, is
// encoded as it is and with one leading space (`encode`: text -> ids, no special tokens); the spaced form is kept
// too when it starts with another token and has as many tokens (a new word token, not a split one). A word that
// encodes to nothing is an error naming it.
template <class Encode>
[[nodiscard]] std::vector<std::vector<token_id>> encode_bad_words(const std::vector<std::string>& words,
                                                                  Encode&& encode) {
  std::vector<std::vector<token_id>> out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::size_t start = words[i].find_first_not_of(" \t\n\r\f\v");
    const std::string word = start == std::string::npos ? std::string() : words[i].substr(start);
    std::vector<token_id> plain = encode(word);
    check(!plain.empty(), "sampling: bad_words[", i, "] (\"", words[i], "\") encodes to no tokens");
    std::vector<token_id> spaced = encode(" " + word);
    out.push_back(std::move(plain));
    if (!spaced.empty() && spaced.front() != out.back().front() && spaced.size() == out.back().size())
      out.push_back(std::move(spaced));
  }
  return out;
}

namespace detail {
// splitmix64's finaliser: a bijective 64-bit mix in which every input bit affects every output bit.
ZIPAGE_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}
}  // namespace detail

// Uniform float in [0, 1) with 24 random bits: output number `step` of a splitmix64 stream whose starting
// state is the mixed seed. Mixing the seed first puts nearby seeds (0, 1, 2, ...) at unrelated points of the
// Weyl sequence, so their streams do not overlap in practice. Unsigned overflow wraps by definition, so a
// GPU backend gets bit-identical values. Changing this formula changes every seeded output.
ZIPAGE_HOST_DEVICE constexpr float sampling_uniform(std::uint64_t seed, std::uint64_t step) {
  const std::uint64_t gamma = 0x9E3779B97F4A7C15ULL;  // 2^64 / golden ratio, splitmix64's increment
  const std::uint64_t bits = detail::mix64(detail::mix64(seed) + (step + 1) * gamma);
  // The top 24 bits fit a float's mantissa exactly, so the result can never round up to 1.
  return static_cast<float>(bits >> 40) * 0x1p-24f;
}

}  // namespace zipage
