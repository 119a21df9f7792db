// The whole engine on the real stories260K model (CPU reference backend).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "greedy.hpp"
#include "counting_model.hpp"
#include "stories_model.hpp"

using namespace zipage;
using zipage::testing::greedy;
using zipage::testing::greedy_ignoring_eos;
using zipage::testing::stories;
using zipage::testing::story_prompts;

namespace {

using llama_engine = engine<llama_model<cpu_backend>>;

llama_engine make_engine(engine_config cfg = {}) {
  auto& m = stories();
  cfg.make_detokenizer = detokenizer_factory(m.tokenizer);
  cfg.encode_words = words_encoder(m.tokenizer);
  return llama_engine(load_llama_gguf<cpu_backend>(m.file), cfg);
}

// stories260K's known-good greedy continuation (tests/support/stories_model.hpp).
const std::vector<token_id>& golden = zipage::testing::stories_golden;

using zipage::testing::counting_model;

}  // namespace

TEST_CASE("EOS ends a request unless ignore_eos") {
  engine<counting_model> eng(counting_model{}, {.block_size = 4, .num_blocks = 16});
  auto p = greedy(20);
  auto out = eng.generate({{0, 3}}, p)[0];
  CHECK(out.output == std::vector<token_id>{4, 5, 6, 7});
  CHECK(out.reason == finish_reason::eos);
  p.ignore_eos = true;
  out = eng.generate({{0, 3}}, p)[0];
  CHECK(out.output.size() == 20);
  CHECK(out.output[4] == 0);  // past EOS it wraps around
  CHECK(out.reason == finish_reason::length);
}

TEST_CASE("golden: greedy stories260K reproduces its known output") {
  auto eng = make_engine();
  const auto& tok = stories().tokenizer;

  SUBCASE("from the prompt 'Once upon a time'") {
    const auto prompt = tok.encode("Once upon a time", true);
    REQUIRE(prompt == std::vector<token_id>{1, 403, 407, 261, 378});
    const auto out = eng.generate({prompt}, greedy(static_cast<int>(golden.size()) - 4))[0];
    const std::vector<token_id> expected(golden.begin() + 4, golden.end());
    CHECK(out.output == expected);
    CHECK(out.reason == finish_reason::length);
    const auto st = eng.stats();
    CHECK(st.generated_tokens == static_cast<std::int64_t>(expected.size()));  // the prefill's token counts too
    CHECK(st.prompt_tokens == 5);
    CHECK(st.prefill_steps == 1);
    CHECK(st.decode_steps == static_cast<std::int64_t>(expected.size()) - 1);
  }
  SUBCASE("from BOS alone") {
    const auto out = eng.generate({{1}}, greedy(static_cast<int>(golden.size())))[0];
    CHECK(out.output == golden);
    CHECK(out.text.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", 0) == 0);
  }
}

TEST_CASE("64 prompts through a KV pool too small for all of them give what each gives alone") {
  const auto prompts = story_prompts(64);
  sampling_params sampled;  // sampling too: per-request seeds make the draws independent of batching
  sampled.temperature = 0.8f;
  sampled.top_p = 0.95f;
  sampled.max_tokens = 40;
  sampled.ignore_eos = true;

  for (const auto& params : {greedy(40), sampled}) {
    CAPTURE(params.temperature);
    std::vector<std::vector<token_id>> alone;
    {
      auto eng = make_engine({.block_size = 16, .num_blocks = 16});
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        auto p = params;
        p.seed = 1000 + i;
        alone.push_back(eng.generate({prompts[i]}, p)[0].output);
      }
    }
    // 64 requests of ~55 tokens need ~256 blocks of 16 at once; give the pool 48.
    auto eng = make_engine({.block_size = 16, .num_blocks = 48, .max_num_seqs = 64});
    std::vector<request_id> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto p = params;
      p.seed = 1000 + i;
      ids.push_back(eng.add_request(prompts[i], p));
    }
    eng.run_to_completion();
    const auto st = eng.stats();
    CHECK(st.preemptions > 0);  // the pool really was too small
    CHECK(st.peak_blocks_used <= 48);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      CAPTURE(i);
      const auto out = eng.take_output(ids[i]);
      CHECK(out.output == alone[i]);
    }
    CHECK(eng.pool().num_used() == 0);
    CHECK(eng.pool().total_references() == 0);
  }
}

TEST_CASE("a preempted request resumes with exactly the tokens of an unpreempted run") {
  const auto prompts = story_prompts(2);
  auto reference = make_engine({.block_size = 8, .num_blocks = 64});
  const auto expected = reference.generate(prompts, greedy(60));

  // Two requests that each need 9 blocks of 8 by the end; 12 blocks force the newer one out.
  auto eng = make_engine({.block_size = 8, .num_blocks = 12});
  const auto got = eng.generate(prompts, greedy(60));
  CHECK(eng.stats().preemptions > 0);
  CHECK(got[1].num_preemptions > 0);
  for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(got[i].output == expected[i].output);
}

TEST_CASE("stop conditions: max tokens, stop strings, stop token ids") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);

  auto p = greedy(500);
  p.stop = {"Lily"};
  auto out = eng.generate({prompt}, p)[0];
  CHECK(out.reason == finish_reason::stop_string);
  CHECK(out.text == ", there was a little girl named ");

  p = greedy(100);
  p.stop_token_ids = {golden[6]};  // the third generated token
  out = eng.generate({prompt}, p)[0];
  CHECK(out.reason == finish_reason::stop_token);
  CHECK(out.output.size() == 3);

  p = greedy(7);
  out = eng.generate({prompt}, p)[0];
  CHECK(out.reason == finish_reason::length);
  CHECK(out.output.size() == 7);
}

TEST_CASE("streaming text adds up to the final text") {
  auto eng = make_engine();
  const auto id = eng.add_request(stories().tokenizer.encode("Once upon a time", true), greedy(30));
  std::string streamed;
  eng.run_to_completion([&](const step_event& e) {
    if (e.id == id) streamed += e.text;
  });
  CHECK(streamed == eng.take_output(id).text);
  CHECK(streamed.size() > 50);
}

TEST_CASE("with stop strings that span tokens, the streamed text still adds up to the final text") {
  // A stop string completed by a later token cuts text that earlier tokens completed; streamed at once, that
  // text reached the client although the result lacks it. Events now hold it back, as vLLM does.
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  const std::string full = eng.generate({prompt}, greedy(40))[0].text;
  REQUIRE(full.size() > 60);
  std::map<request_id, std::string> expected, streamed;
  for (std::size_t at = 1; at + 9 < full.size(); at += 3) {  // one request per stop string, all in one batch
    auto p = greedy(40);
    p.stop = {full.substr(at, 2 + at % 7)};
    if (at % 2 == 0) p.stop.push_back("no such text");  // a longer stop string that never matches
    expected[eng.add_request(prompt, p)] = full.substr(0, full.find(p.stop[0]));
  }
  eng.run_to_completion([&](const step_event& e) { streamed[e.id] += e.text; });
  for (const auto& [id, text] : expected) {
    const auto out = eng.take_output(id);
    CAPTURE(text);
    CHECK(out.reason == finish_reason::stop_string);
    CHECK(out.text == text);
    CHECK(streamed[id] == text);
  }
}

TEST_CASE("cancellation frees everything at once; other requests carry on") {
  auto eng = make_engine({.block_size = 8, .num_blocks = 64});
  const auto prompts = story_prompts(3);
  const auto expected = make_engine().generate({prompts[2]}, greedy(30))[0].output;
  const auto a = eng.add_request(prompts[0], greedy(30));
  const auto b = eng.add_request(prompts[1], greedy(30));
  const auto c = eng.add_request(prompts[2], greedy(30));
  for (int i = 0; i < 5; ++i) eng.step();
  const int used_before = eng.pool().num_used();
  CHECK(eng.cancel(b));
  CHECK_FALSE(eng.cancel(b));  // already gone
  CHECK(eng.pool().num_used() < used_before);
  eng.run_to_completion();
  CHECK(eng.take_output(b).reason == finish_reason::cancelled);
  CHECK(eng.take_output(a).output.size() == 30);
  CHECK(eng.take_output(c).output == expected);
  CHECK(eng.pool().num_used() == 0);
}

TEST_CASE("bad requests get a clear error and leave the engine working") {
  auto eng = make_engine({.block_size = 8, .num_blocks = 4, .max_batched_tokens = 64});
  CHECK_THROWS_WITH_AS(eng.add_request({}, greedy(4)), "request: the prompt is empty (add BOS at least)", zipage::error);
  CHECK_THROWS_AS(eng.add_request({1, 99999}, greedy(4)), zipage::error);
  CHECK_THROWS_AS(eng.add_request(std::vector<token_id>(40, 5), greedy(4)), zipage::error);  // needs 5 blocks of 4
  auto bad = greedy(4);
  bad.top_p = 2.0f;
  CHECK_THROWS_AS(eng.add_request({1}, bad), zipage::error);
  // A request that outgrows the pool while generating finishes with an error; it does not hang.
  const auto big = eng.add_request({1, 403}, greedy(100));
  const auto ok = eng.add_request({1, 403}, greedy(3));
  eng.run_to_completion();
  const auto big_out = eng.take_output(big);
  CHECK(big_out.reason == finish_reason::error);
  CHECK(big_out.error_message.find("KV blocks") != std::string::npos);
  CHECK(eng.take_output(ok).output.size() == 3);
  CHECK(eng.pool().num_used() == 0);
}

TEST_CASE("logit_bias: a large negative bias on the greedy token changes it; log-probabilities stay the model's") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  auto p = greedy(3);
  p.logprobs = true;
  const auto plain = eng.generate({prompt}, p)[0];
  REQUIRE(plain.output[0] == golden[4]);
  p.logit_bias = {{golden[4], -100.0f}};
  const auto biased = eng.generate({prompt}, p)[0];
  CHECK(biased.output[0] != golden[4]);
  CHECK(biased.logprobs[0] < plain.logprobs[0]);  // the raw model's, not the biased row's
  p.logit_bias = {{7, 100.0f}};  // a token the model would never pick, at every step
  CHECK(eng.generate({prompt}, p)[0].output == std::vector<token_id>{7, 7, 7});
  p.logit_bias = {{512, 1.0f}};
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, p),
                       "request: sampling_params::logit_bias holds token id 512, outside the vocabulary of 512",
                       zipage::error);
}

TEST_CASE("allowed_token_ids restricts every sampled token, greedy or sampled, in a batch with other requests") {
  auto eng = make_engine();
  const auto prompts = story_prompts(3);
  const std::vector<token_id> allowed = {261, 298, 376, 432};
  auto p = greedy(12);
  p.ignore_eos = true;
  const auto reference = eng.generate({prompts[1]}, p)[0].output;
  p.allowed_token_ids = allowed;
  auto sampled = p;
  sampled.temperature = 1.0f;
  sampled.seed = 3;
  const auto a = eng.add_request(prompts[0], p);
  const auto b = eng.add_request(prompts[1], greedy_ignoring_eos(12));  // no processors: unchanged beside them
  const auto c = eng.add_request(prompts[2], sampled);
  eng.run_to_completion();
  for (const request_id id : {a, c}) {
    const auto out = eng.take_output(id);
    CHECK(out.output.size() == 12);
    for (const token_id t : out.output) CHECK(std::find(allowed.begin(), allowed.end(), t) != allowed.end());
  }
  CHECK(eng.take_output(b).output == reference);
  p.allowed_token_ids = std::vector<token_id>{};
  CHECK_THROWS_WITH_AS(eng.add_request(prompts[0], p),
                       "sampling: allowed_token_ids is set but empty (no token could be sampled)", zipage::error);
  p.allowed_token_ids = std::vector<token_id>{5, 600};
  CHECK_THROWS_WITH_AS(eng.add_request(prompts[0], p),
                       "request: sampling_params::allowed_token_ids holds token id 600, outside the vocabulary of 512",
                       zipage::error);
}

TEST_CASE("min_tokens: no EOS and no stop token before min_tokens tokens, and no stop string") {
  auto eng = make_engine();
  const auto prompt = stories().tokenizer.encode("Once upon a time", true);
  const token_id eos = eng.config().eos;
  auto p = greedy(20);
  p.logit_bias = {{eos, 100.0f}};  // EOS is the greedy token at every step
  auto out = eng.generate({prompt}, p)[0];
  CHECK(out.reason == finish_reason::eos);
  CHECK(out.output.size() == 1);
  p.min_tokens = 5;
  out = eng.generate({prompt}, p)[0];
  CHECK(out.reason == finish_reason::eos);
  REQUIRE(out.output.size() == 6);
  CHECK(std::count(out.output.begin(), out.output.end(), eos) == 1);
  CHECK(out.output.back() == eos);

  p = greedy(20);
  p.stop_token_ids = {golden[6]};  // the third generated token
  p.min_tokens = 4;
  out = eng.generate({prompt}, p)[0];
  CHECK(out.output.size() == 20);
  CHECK(std::find(out.output.begin(), out.output.begin() + 4, golden[6]) == out.output.begin() + 4);

  // "Lily" ends the text of the 10th token or so: with min_tokens past it, that text cannot end the request.
  p = greedy(40);
  p.stop = {"Lily"};
  out = eng.generate({prompt}, p)[0];
  REQUIRE(out.reason == finish_reason::stop_string);
  const auto lily_at = out.output.size();
  p.min_tokens = static_cast<int>(lily_at) + 2;
  out = eng.generate({prompt}, p)[0];
  CHECK(out.output.size() > lily_at + 2);
  CHECK(out.text.rfind(", there was a little girl named Lily", 0) == 0);
  p.min_tokens = 41;
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, p), "sampling: min_tokens must be in [0, max_tokens = 40], got 41",
                       zipage::error);
}

TEST_CASE("bad_words: a one-token word is never sampled; a longer word's last token not after its others") {
  auto eng = make_engine();
  const auto& tok = stories().tokenizer;
  const auto prompt = tok.encode("Once upon a time", true);
  const std::vector<token_id> reference = eng.generate({prompt}, greedy_ignoring_eos(30))[0].output;
  auto p = greedy_ignoring_eos(30);

  // " there" (the second generated token) is one token: banned everywhere.
  REQUIRE(tok.encode("there", false) == std::vector<token_id>{golden[5]});
  p.bad_words = {" there"};
  auto out = eng.generate({prompt}, p)[0];
  CHECK(out.output[0] == reference[0]);
  CHECK(std::find(out.output.begin(), out.output.end(), golden[5]) == out.output.end());

  // "girl" is three tokens: its last is banned right after the others, and the text up to there is unchanged.
  const auto girl = tok.encode("girl", false);
  REQUIRE(girl.size() >= 2);
  const auto at = std::search(reference.begin(), reference.end(), girl.begin(), girl.end());
  REQUIRE(at != reference.end());
  const auto last = static_cast<std::size_t>(at - reference.begin()) + girl.size() - 1;
  p.bad_words = {"girl"};
  out = eng.generate({prompt}, p)[0];
  CHECK(std::equal(reference.begin(), reference.begin() + static_cast<std::ptrdiff_t>(last), out.output.begin()));
  CHECK(out.output[last] != girl.back());
  CHECK(std::search(out.output.begin(), out.output.end(), girl.begin(), girl.end()) == out.output.end());

  // Without an encoder (no tokenizer) bad words are refused, naming the field.
  llama_engine bare(load_llama_gguf<cpu_backend>(stories().file));
  CHECK_THROWS_WITH_AS(bare.add_request(prompt, p),
                       "request: sampling_params::bad_words (\"girl\") need text encoded, and this engine has no "
                       "encoder: set engine_config::encode_words (the tokenizer's encode without special tokens)",
                       zipage::error);
}

TEST_CASE("bad_words encoded by the caller (zipage-serve) are used as they are: the engine does not encode them") {
  const auto& tok = stories().tokenizer;
  // One encoder for the engine, counting its calls; the caller encodes with the tokenizer directly.
  int engine_encodes = 0;
  engine_config cfg;
  cfg.encode_words = [&](const std::string& text) {
    ++engine_encodes;
    return tok.encode(text, false);
  };
  llama_engine eng(load_llama_gguf<cpu_backend>(stories().file), cfg);  // (make_engine sets its own encoder)
  const int vocab = eng.config().vocab_size;
  const auto prompt = tok.encode("Once upon a time", true);
  auto p = greedy_ignoring_eos(30);
  p.bad_words = {" there"};
  REQUIRE(tok.encode("there", false) == std::vector<token_id>{golden[5]});

  const auto prepared_words = [](encoded_bad_words w) {
    return prepared_request{std::make_shared<const encoded_bad_words>(std::move(w)), nullptr};
  };
  const encoded_bad_words encoded = encode_checked_bad_words(p.bad_words, words_encoder(tok), vocab);
  CHECK(encoded.words() == p.bad_words);
  const prepared_request words = prepared_words(encoded);
  const request_id id = eng.add_request(prompt, p, words);
  CHECK(engine_encodes == 0);
  eng.run_to_completion();
  const auto out = eng.take_output(id).output;
  CHECK(out.size() == 30);
  CHECK(std::find(out.begin(), out.end(), golden[5]) == out.end());  // still banned

  // Given only the words, the engine encodes them itself (the library's path, unchanged) to the same tokens.
  CHECK(eng.generate({prompt}, p)[0].output == out);
  CHECK(engine_encodes > 0);

  // Ids of other words, or of another vocabulary, do not stand for the request's words.
  auto other = p;
  other.bad_words = {"girl"};
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, other, words),
                       "request: the encoded bad words were made from other words than sampling_params::bad_words: "
                       "at [0] the request has \"girl\", the encoding \" there\"",
                       zipage::error);
  other.bad_words = {" there", "girl"};
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, other, words),
                       "request: the encoded bad words were made from other words than sampling_params::bad_words: "
                       "at [1] the request has \"girl\", the encoding no word",
                       zipage::error);
  const auto smaller = prepared_words(encode_checked_bad_words(p.bad_words, words_encoder(tok), vocab - 1));
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, p, smaller),
                       ("request: the bad words were encoded for a vocabulary of " + std::to_string(vocab - 1) +
                        ", this model's is " + std::to_string(vocab)).c_str(),
                       zipage::error);

  // Encoded words need no encoder in the engine; words alone still do.
  llama_engine bare(load_llama_gguf<cpu_backend>(stories().file));
  CHECK(bare.generate({prompt}, greedy_ignoring_eos(30)).size() == 1);
  const request_id bare_id = bare.add_request(prompt, p, words);
  bare.run_to_completion();
  CHECK(bare.take_output(bare_id).output == out);
  CHECK_THROWS_AS(bare.add_request(prompt, p), zipage::error);
}

TEST_CASE("a guide compiled by the caller (zipage-serve) is used as it is: the engine does not compile it again") {
  const auto& tok = stories().tokenizer;
  engine_config cfg;
  cfg.guide_vocab = guide_vocabulary_of(tok);
  llama_engine eng(load_llama_gguf<cpu_backend>(stories().file), cfg);
  const auto prompt = tok.encode("Once upon a time", true);
  sampling_params p;
  p.temperature = 0.8f;
  p.seed = 7;
  p.max_tokens = 16;
  p.guided.regex = "(yes|no|maybe)[0-9]";
  const prepared_request prepared{nullptr, std::make_shared<const compiled_guide>(
                                               compile_checked_guide(p.guided, cfg.guide_vocab))};
  const request_id id = eng.add_request(prompt, p, prepared);
  CHECK(eng.request(id).rules.guided == prepared.guided->get());  // the very guide, not a second compilation
  eng.run_to_completion();
  const auto out = eng.take_output(id).output;
  // The same request with only the constraint: compiled by the engine, the same tokens.
  const auto own = eng.generate({prompt}, p)[0].output;
  CHECK(own == out);
  std::string text;
  for (const token_id t : out) text += cfg.guide_vocab->bytes_of(t);
  CHECK(compile_guided_regex(*p.guided.regex).matches(text));

  // Given only the constraint, the engine compiles it once and its requests share that guide.
  const request_id a = eng.add_request(prompt, p), b = eng.add_request(prompt, p);
  CHECK(eng.request(a).rules.guided != nullptr);
  CHECK(eng.request(a).rules.guided == eng.request(b).rules.guided);
  CHECK(eng.request(a).rules.guided != prepared.guided->get());
  eng.run_to_completion();
  CHECK(eng.take_output(a).output == out);  // (the same seed)

  // A guide of another constraint, of none, or for another vocabulary does not stand for the request's.
  auto other = p;
  other.guided.regex = "(yes|no)[0-9]";
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, other, prepared),
                       "request: the compiled guide was made from another constraint than sampling_params::guided "
                       "(guided_regex)",
                       zipage::error);
  other.guided = {};
  CHECK_THROWS_AS(eng.add_request(prompt, other, prepared), zipage::error);
  const prepared_request foreign{nullptr, std::make_shared<const compiled_guide>(
                                              compile_checked_guide(p.guided, guide_vocabulary_of(tok)))};
  CHECK_THROWS_WITH_AS(eng.add_request(prompt, p, foreign),
                       "request: the compiled guide was made for another vocabulary than engine_config::guide_vocab",
                       zipage::error);
  CHECK(!eng.has_unfinished());  // nothing refused was queued
  // compile_checked_guide names the field of a constraint it cannot compile, and a missing vocabulary.
  guided_decoding bad;
  bad.regex = "(a";
  CHECK_THROWS_AS((void)compile_checked_guide(bad, cfg.guide_vocab), zipage::error);
  try {
    (void)compile_checked_guide(bad, cfg.guide_vocab);
  } catch (const zipage::error& e) {
    CHECK(std::string(e.what()).rfind("guided_regex: ", 0) == 0);
  }
  CHECK_THROWS_WITH_AS((void)compile_checked_guide(p.guided, nullptr),
                       "guided_regex: compiling a guide needs the tokens' bytes (a guide_vocabulary)", zipage::error);
}

TEST_CASE("encode_checked_bad_words: an error names the field and the word") {
  // 'a'..'z' are 10..35, a space and a letter one token 40..65 (a new word token); '?' encodes to nothing.
  const auto encode = [](const std::string& text) {
    std::vector<token_id> ids;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '?') continue;
      const bool spaced = text[i] == ' ' && i + 1 < text.size();
      ids.push_back(spaced ? 40 + (text[++i] - 'a') : 10 + (text[i] - 'a'));
    }
    return ids;
  };
  const auto words = encode_checked_bad_words({"ab", " c"}, encode, 66);
  CHECK(words.words() == std::vector<std::string>{"ab", " c"});
  CHECK(words.ids() == std::vector<std::vector<token_id>>{{10, 11}, {40, 11}, {12}, {42}});
  CHECK(words.vocab_size() == 66);
  CHECK_THROWS_WITH_AS((void)encode_checked_bad_words({"a", "??"}, encode, 66),
                       "sampling: bad_words[1] (\"??\") encodes to no tokens", zipage::error);
  // " z" (65) is the id outside; the word named is the one it came from, not the first.
  CHECK_THROWS_WITH_AS((void)encode_checked_bad_words({"a", "z"}, encode, 50),
                       "sampling: bad_words[1] (\"z\") encodes to token id 65, outside the vocabulary of 50",
                       zipage::error);
}

#include "zipage/policy/policies.hpp"

namespace {

template <class Policy>
void check_large_budget_matches_full_kv(const std::vector<std::vector<token_id>>& prompts,
                                        const std::vector<request_output>& full) {
  auto& m = stories();
  // Budget 64 blocks of 8 = 512 tokens: no sequence below reaches it, so nothing is ever evicted.
  engine<llama_model<cpu_backend>, Policy> eng(load_llama_gguf(m.file),
                                               {.block_size = 8, .num_blocks = 256, .budget_tokens = 512, .window = 4});
  const auto out = eng.generate(prompts, greedy(120));
  CHECK(eng.stats().compressions == 0);
  for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(out[i].output == full[i].output);
}

template <class Policy>
void check_compresses_and_stays_close(const std::vector<std::vector<token_id>>& prompts,
                                      const std::vector<request_output>& full) {
  auto& m = stories();
  engine<llama_model<cpu_backend>, Policy> eng(load_llama_gguf(m.file),
                                               {.block_size = 8, .num_blocks = 256, .budget_tokens = 64, .window = 4});
  const auto out = eng.generate(prompts, greedy(120));
  CHECK(eng.stats().compressions > 0);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CHECK(out[i].output.size() == full[i].output.size());
    // Compression starts at 72 cached tokens; up to there the outputs must agree exactly.
    const auto n = static_cast<std::size_t>(72 - static_cast<int>(prompts[i].size()));
    CHECK(std::equal(out[i].output.begin(), out[i].output.begin() + static_cast<std::ptrdiff_t>(n), full[i].output.begin()));
  }
  CHECK(eng.pool().num_used() == 0);
}

}  // namespace

TEST_CASE("with a budget larger than every sequence, every policy is token-for-token full KV") {
  const auto prompts = story_prompts(4);
  auto reference = make_engine({.block_size = 8, .num_blocks = 256});
  const auto full = reference.generate(prompts, greedy(120));
  check_large_budget_matches_full_kv<streaming_llm>(prompts, full);
  check_large_budget_matches_full_kv<h2o>(prompts, full);
  check_large_budget_matches_full_kv<snapkv>(prompts, full);
  check_large_budget_matches_full_kv<rkv>(prompts, full);
  check_large_budget_matches_full_kv<gkv>(prompts, full);
  check_large_budget_matches_full_kv<zipage_policy>(prompts, full);

  // And with a real budget they compress, agree up to the first compression, and return every block.
  check_compresses_and_stays_close<zipage_policy>(prompts, full);
  check_compresses_and_stays_close<streaming_llm>(prompts, full);
}

// batch_layout: a prompt chunk longer than a block maps several of its tokens to each query-window row. Only the
// last of them is named, so a backend may write a batch's rows in any order (the CUDA kernel writes them in
// parallel), and the window holds what writing every token in order would leave: before this, a prompt that
// compressed within a block of its end got a different window from run to run on the GPU.
TEST_CASE("batch_layout: each query-window row is named once per batch, by the last token that maps to it") {
  for (const int window : {16, 5})
    for (const int start : {0, 7, 32})
      for (const int chunk : {1, 5, 16, 17, 40, 301}) {
        const cache_geometry g{.block_size = 16, .budget_tokens = 128, .window = window};
        batch_layout layout(g, true);
        sequence seqs[2];
        step_plan plan;
        for (int i = 0; i < 2; ++i) {
          sequence& s = seqs[i];
          const int fed = i == 0 ? chunk : chunk / 2 + 1;  // two sequences, chunks of different lengths
          s.tokens.assign(static_cast<std::size_t>(start + fed), 1);
          s.prompt_len = s.num_tokens();
          s.num_computed = s.kv_len = start;
          s.query_slot = i == 0 ? 3 : 0;
          for (int b = 0; b * 16 < start + fed; ++b) s.table.push_back(100 * i + b);
          plan.batch.push_back({&s, fed});
        }
        const forward_batch& fb = layout.build(plan);
        const auto rows = fb.attention.token_window_row;
        REQUIRE(rows.size() == static_cast<std::size_t>(plan.num_tokens()));
        // In order, each row keeps the last token written to it: offset physical % 16 - (16 - W), when >= 0.
        std::map<int, std::size_t> in_order, named;
        std::size_t t = 0;
        for (const scheduled_seq& e : plan.batch)
          for (int j = 0; j < e.tokens; ++j, ++t) {
            const int offset = (e.seq->kv_len + j) % 16 - (16 - window);
            if (offset >= 0) in_order[e.seq->query_slot * window + offset] = t;
          }
        for (t = 0; t < rows.size(); ++t)
          if (rows[t] >= 0) {
            CHECK_MESSAGE(named.count(rows[t]) == 0, "row ", rows[t], " named twice (W ", window, ", chunk ", chunk, ")");
            named[rows[t]] = t;
          }
        CHECK(named == in_order);
      }
}

TEST_CASE("guide_cache: one compilation per constraint and vocabulary, least recently used out, errors not kept") {
  const auto vocab = guide_vocabulary_of(stories().tokenizer);
  const auto other_vocab = guide_vocabulary_of(stories().tokenizer);
  guide_cache cache(2);
  guided_decoding yes_no, digits, letters;
  yes_no.choice = {"yes", "no"};
  digits.regex = "[0-9]{1,3}";
  letters.regex = "[a-z]+";
  const auto first = cache.get(yes_no, vocab);
  CHECK(cache.get(yes_no, vocab) == first);
  CHECK(cache.hits() == 1);
  CHECK(cache.get(yes_no, other_vocab) != first);  // another vocabulary: another guide
  CHECK(cache.size() == 2);
  CHECK(cache.get(yes_no, vocab) == first);  // used again: now the most recent
  CHECK(cache.hits() == 2);
  const auto d = cache.get(digits, vocab);  // the least recently used (yes_no for other_vocab) goes
  CHECK(cache.size() == 2);
  CHECK(cache.get(yes_no, vocab) == first);
  CHECK(cache.get(digits, vocab) == d);
  CHECK(cache.hits() == 4);
  (void)cache.get(letters, vocab);  // digits was used after yes_no, so yes_no goes
  CHECK(cache.get(digits, vocab) == d);
  CHECK(cache.get(yes_no, vocab) != first);  // compiled again
  CHECK(cache.get(yes_no, vocab)->spec() == yes_no);
  // A constraint that does not compile throws, and is not kept.
  guided_decoding bad;
  bad.regex = "(";
  CHECK_THROWS_AS((void)cache.get(bad, vocab), zipage::error);
  CHECK(cache.size() == 2);
  // Beyond max_bytes of token lists the least recently used go, down to one guide.
  guide_cache small(8, 1);
  const auto walked = small.get(digits, vocab);
  CHECK(walked->get()->memo_bytes() == 0);
  (void)walked->get()->next_tokens(byte_dfa::start);  // a request's first step
  CHECK(walked->get()->memo_bytes() > 0);
  CHECK(small.get(digits, vocab) == walked);  // alone, it stays
  (void)small.get(letters, vocab);
  CHECK(small.size() == 1);  // digits' lists were over the bound
  CHECK(small.get(digits, vocab) != walked);
  guide_cache none(0);  // capacity 0: compiles every time, keeps nothing
  CHECK(none.get(digits, vocab) != none.get(digits, vocab));
  CHECK(none.size() == 0);
}
