#pragma once
// Output processing: what a step's sampled tokens mean to the user. Each token's text (the request's
// streaming detokenizer; none for an EOS, and a stop token's is left out of the output), stop strings looked for
// in the new text (the output cut before the match, as vLLM does; after it with include_stop_str_in_output),
// the step's events, and a finished request's result. It writes only a
// request's output (its text); lengths, tokens and whether it finished are scheduler.update's, which
// gets the stop-string verdicts from here (sampled_token::stop).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

// One token produced for one request in a step (what a streaming client sees).
struct step_event {
  request_id id = 0;
  token_id token = 0;
  // The output text this event adds: concatenated, a request's events give exactly its final text. While the
  // request has stop strings, the text a later match could cut (one byte less than the longest) is held back
  // to a later event, as vLLM does; it is never split inside a UTF-8 character.
  std::string text;
  bool finished = false;
  finish_reason reason = finish_reason::none;
  std::string token_text{};  // the text this token completed (may be empty mid-character; no stop string cut)
  stopped_by stop_reason{};  // on the finishing event: the stop token or stop string, as request_output's
};

struct request_output {
  request_id id = 0;
  std::vector<token_id> prompt;
  std::vector<token_id> output;
  std::string text;
  finish_reason reason = finish_reason::none;
  stopped_by stop_reason{};  // vLLM's stop_reason: the stop token's id or the stop string (sequence.hpp)
  std::string error_message;
  int num_preemptions = 0;
  int num_compressions = 0;
  std::vector<float> logprobs;  // when sampling_params::logprobs
  std::vector<std::vector<token_logprob>> top_logprobs;  // when sampling_params::top_logprobs > 0: per token
};

// Looks for a stop string that ends in the text added after `old_size`; cuts the output just before it, as
// vLLM does (the first of params.stop that matches wins), or just after it with include_stop_str_in_output.
// Returns the stop string that matched, or null.
inline const std::string* truncate_at_stop_string(sequence& s, std::size_t old_size) {
  for (const std::string& stop : s.params.stop) {
    if (stop.empty()) continue;
    const std::size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const std::size_t at = s.output_text.find(stop, from);
    if (at == std::string::npos) continue;
    s.output_text.resize(s.params.include_stop_str_in_output ? at + stop.size() : at);
    return &stop;
  }
  return nullptr;
}

// The bytes at the end of the output that a stop string completed by a later token could still cut: one less
// than the longest stop string (the text before a match's last byte). None with include_stop_str_in_output: a
// match then keeps itself and cuts only what follows it, all of it new.
[[nodiscard]] inline std::size_t stop_holdback(const sampling_params& p) {
  if (p.include_stop_str_in_output) return 0;
  std::size_t longest = 0;
  for (const std::string& stop : p.stop) longest = std::max(longest, stop.size());
  return longest > 0 ? longest - 1 : 0;
}

// The output text not handed out yet, for the next event: all of it when the request is done (`all`), else
// all but what a stop string could still cut (as vLLM holds it back), never ending inside a UTF-8 character.
// Why: a stop string spanning tokens cuts text that an earlier token completed; streamed at once, that text
// reached clients although the result does not have it, so the streamed text did not add up to the result.
inline std::string take_streamable(sequence& s, bool all) {
  std::size_t end = s.output_text.size();
  if (!all) {
    const std::size_t hold = stop_holdback(s.params);
    end = end > hold ? end - hold : 0;
    while (end > s.streamed_text_size && (static_cast<unsigned char>(s.output_text[end]) & 0xC0) == 0x80) --end;
  }
  if (end <= s.streamed_text_size) return {};
  std::string text = s.output_text.substr(s.streamed_text_size, end - s.streamed_text_size);
  s.streamed_text_size = end;
  return text;
}

// Whether a token's text goes into the output, given the stop it makes (token_reason): a stop token's text is
// left out unless include_stop_str_in_output, as vLLM's detokenizer leaves it out (its id stays in the output
// tokens, and step_event::token_text keeps it for log-probabilities). (An EOS has no text here.)
[[nodiscard]] inline bool keeps_token_text(const sampling_params& p, finish_reason by_token) {
  return by_token != finish_reason::stop_token || p.include_stop_str_in_output;
}

// The token's text from the request's detokenizer into `text`; returns why it failed (empty: it did not).
[[nodiscard]] inline std::string detokenize(sequence& s, token_id tok, std::string& text) {
  try {
    text = s.detokenizer(tok);
    return {};
  } catch (...) {
    return "the detokenizer failed on token " + std::to_string(tok) + ": " + what_of(std::current_exception());
  }
}

// The text of each token sampled this step (`sampled`: one per sampling batch entry, in batch order),
// appended to its request's output; one event per token (appended to `events`; finished and reason are
// filled by finish_events once scheduler.update has decided). Returns what update needs.
inline std::vector<sampled_token> process_sampled(const step_plan& plan, const std::vector<token_id>& sampled,
                                                  const stop_rules& rules, std::vector<step_event>& events) {
  std::vector<sampled_token> out;
  out.reserve(sampled.size());
  std::size_t row = 0;
  for (const scheduled_seq& e : plan.batch) {
    if (!e.samples()) continue;
    sequence& s = *e.seq;
    const token_id tok = sampled.at(row++);
    step_event ev{s.id, tok, {}, false, finish_reason::none};
    const std::size_t old_size = s.output_text.size();
    if (s.detokenizer && !rules.is_eos(s.params, tok)) {
      // A detokenizer that throws (e.g. a tokenizer with fewer ids than the model) fails its own request, in
      // update(); escaping here it would leave the step half applied for every request, and repeat each step.
      std::string error = detokenize(s, tok, ev.token_text);
      if (!error.empty()) {
        out.push_back({tok, {}, std::move(error)});
        events.push_back(std::move(ev));
        continue;
      }
    }
    // A stop token or EOS ends the request whatever its text, so no stop string is looked for after one; nor
    // before min_tokens tokens (this one included), as vLLM's detokenizer skips them (only text this token adds
    // can then match, so text of the first min_tokens tokens never ends the request).
    const finish_reason by_token = rules.token_reason(s.params, tok);
    if (keeps_token_text(s.params, by_token)) s.output_text += ev.token_text;
    const bool past_min = s.num_generated() + 1 > s.params.min_tokens;  // s.tokens does not hold tok yet
    const std::string* stop =
        by_token == finish_reason::none && past_min ? truncate_at_stop_string(s, old_size) : nullptr;
    ev.text = take_streamable(s, stop != nullptr);
    out.push_back({tok, stop != nullptr ? *stop : std::string{}});
    events.push_back(std::move(ev));
  }
  return out;
}

// After scheduler.update: the events from `first` on (one per sampling batch entry, as process_sampled
// made them) say whether their request finished, and why; a finished request's last event carries the text
// it held back.
inline void finish_events(const step_plan& plan, std::vector<step_event>& events, std::size_t first) {
  for (const scheduled_seq& e : plan.batch) {
    if (!e.seq->is_finished()) continue;  // a request that finished here sampled here: its event is ahead
    const auto it = std::find_if(events.begin() + static_cast<std::ptrdiff_t>(first), events.end(),
                                 [&](const step_event& ev) { return ev.id == e.seq->id; });
    if (it == events.end()) continue;  // it sampled nothing (it failed in update()): reported as failed
    first = static_cast<std::size_t>(it - events.begin());
    events[first].finished = true;
    events[first].reason = e.seq->reason;
    events[first].stop_reason = e.seq->stop_reason;
    events[first].text += take_streamable(*e.seq, true);
  }
}

// A finished request's result.
[[nodiscard]] inline request_output output_of(const sequence& s) {
  request_output out;
  out.id = s.id;
  out.prompt.assign(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
  out.output.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
  out.text = s.output_text;
  out.reason = s.reason;
  out.stop_reason = s.stop_reason;
  out.error_message = s.error_message;
  out.num_preemptions = s.num_preemptions;
  out.num_compressions = s.num_compressions;
  out.logprobs = s.logprobs;
  out.top_logprobs = s.top_logprobs;
  return out;
}

}  // namespace zipage
