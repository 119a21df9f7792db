#pragma once
// What a front end works out from a request before it accepts it: its bad words encoded and its guide compiled.
// zipage-serve must do both to refuse a bad word or a bad regex with a 400 before any streaming header is out; it
// then hands the results to engine::add_request, which otherwise does the same work again on the engine's thread,
// between two steps, while every running request waits (a large regex's DFA takes up to ~0.1 s).
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/engine/bad_words.hpp"
#include "zipage/sampling/guided.hpp"
#include "zipage/sampling/sampling_params.hpp"

namespace zipage {

// A request's guide compiled ahead, with the constraint and the vocabulary it was compiled from. Only
// compile_checked_guide makes one, so an engine given one can trust it as its own after checking that the
// constraint is the request's and the vocabulary its engine_config::guide_vocab.
class compiled_guide {
 public:
  [[nodiscard]] const guided_decoding& spec() const { return spec_; }
  [[nodiscard]] const std::shared_ptr<const guide>& get() const { return guide_; }
  [[nodiscard]] const guide_vocabulary* vocabulary() const { return vocab_; }

 private:
  compiled_guide(guided_decoding spec, std::shared_ptr<const guide> g, const guide_vocabulary* vocab)
      : spec_(std::move(spec)), guide_(std::move(g)), vocab_(vocab) {}
  friend compiled_guide compile_checked_guide(const guided_decoding&, std::shared_ptr<const guide_vocabulary>);

  guided_decoding spec_;
  std::shared_ptr<const guide> guide_;
  const guide_vocabulary* vocab_ = nullptr;
};

// `spec` compiled for `vocab` (make_guide). Throws zipage::error starting with the constraint's field
// (guided_regex: ..., guided_choice: ...) for a constraint it cannot compile, or naming the missing vocabulary.
[[nodiscard]] inline compiled_guide compile_checked_guide(const guided_decoding& spec,
                                                          std::shared_ptr<const guide_vocabulary> vocab) {
  check(spec.active(), "guided decoding: no constraint given");
  check(vocab != nullptr, spec.field(), ": compiling a guide needs the tokens' bytes (a guide_vocabulary)");
  const guide_vocabulary* v = vocab.get();
  return {spec, make_guide(spec, std::move(vocab)), v};
}

// Compiled guides by constraint and vocabulary, so that requests with the same constraint (a batch sharing its
// sampling_params, or clients repeating one schema or choice list) share one compilation and one guide, whose
// per-state token lists (guide::next_tokens) each request then finds already walked. The least recently used go
// beyond `capacity` guides or, since those lists grow as requests visit states (up to half the vocabulary's ids
// each), beyond `max_bytes` of lists; a request still running keeps its guide alive. Thread-safe.
class guide_cache {
 public:
  static constexpr std::size_t default_capacity = 32;
  static constexpr std::size_t default_max_bytes = std::size_t{256} << 20;
  explicit guide_cache(std::size_t capacity = default_capacity, std::size_t max_bytes = default_max_bytes)
      : capacity_(capacity), max_bytes_(max_bytes) {}

  // The guide of `spec` for `vocab`: cached, or compiled (compile_checked_guide, whose errors it throws) and cached.
  [[nodiscard]] std::shared_ptr<const compiled_guide> get(const guided_decoding& spec,
                                                          const std::shared_ptr<const guide_vocabulary>& vocab) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if ((*it)->spec() != spec || (*it)->vocabulary() != vocab.get()) continue;
        entries_.splice(entries_.begin(), entries_, it);  // most recently used first
        ++hits_;
        trim();
        return entries_.front();
      }
    }
    // Compiled outside the lock: another thread's lookup need not wait for it (two threads may both compile a new
    // constraint; the second one's entry is then a duplicate that ages out).
    auto compiled = std::make_shared<const compiled_guide>(compile_checked_guide(spec, vocab));
    const std::lock_guard<std::mutex> lock(mutex_);
    if (capacity_ == 0) return compiled;
    entries_.push_front(compiled);
    trim();
    return compiled;
  }

  [[nodiscard]] std::size_t size() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  [[nodiscard]] std::size_t hits() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }

 private:
  // Under mutex_: the least recently used out while more than capacity_ guides, or more than max_bytes_ of token
  // lists in more than one guide, are kept.
  void trim() {
    while (entries_.size() > capacity_) entries_.pop_back();
    std::vector<std::size_t> bytes;  // each guide's, read once (running requests may add lists meanwhile)
    std::size_t total = 0;
    for (const auto& e : entries_) total += bytes.emplace_back(e->get()->memo_bytes());
    while (entries_.size() > 1 && total > max_bytes_) {
      total -= bytes.back();
      bytes.pop_back();
      entries_.pop_back();
    }
  }

  std::size_t capacity_, max_bytes_;
  mutable std::mutex mutex_;
  std::list<std::shared_ptr<const compiled_guide>> entries_;
  std::size_t hits_ = 0;
};

// The parts engine::add_request(prompt, params, prepared) takes ready-made; a null part is worked out by the engine
// as usual. Each must have been made from the same request's sampling_params (and for the engine's vocabulary):
// the engine checks that and refuses the request otherwise.
struct prepared_request {
  std::shared_ptr<const encoded_bad_words> bad_words{};  // params.bad_words (encode_checked_bad_words)
  std::shared_ptr<const compiled_guide> guided{};        // params.guided (compile_checked_guide)
};

}  // namespace zipage
