#pragma once
// zipage::engine<Model, EvictionPolicy, Scheduler, Backend>: the pieces composed at compile time.
// The engine owns the model, the backend and its KV storage, the block pool and the requests, and runs
// each step as plan -> execute -> update:
//
//   plan = scheduler.schedule();        // who runs, with which blocks and slots (scheduler/)
//   tokens = executor.run(plan);        // data movement, batch layout, forward, sampling (step_executor.hpp)
//   out = process_sampled(...);         // text, stop strings, events (output_processor.hpp)
//   scheduler.update(plan, out);        // lengths, new tokens, finished requests, compression points,
//                                       // prefix blocks, landed compactions
//
// The scheduler (with its block manager) is the only writer of request and cache state; the engine
// creates requests, and the executor and output processing write only their outputs.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/block/block_pool.hpp"
#include "zipage/compression/compression_worker.hpp"
#include "zipage/concepts.hpp"
#include "zipage/core/error.hpp"
#include "zipage/engine/bad_words.hpp"
#include "zipage/engine/engine_config.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/engine/memory_profile.hpp"
#include "zipage/engine/output_processor.hpp"
#include "zipage/engine/prepared_request.hpp"
#include "zipage/engine/step_executor.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/policy/eviction_policy.hpp"
#include "zipage/request/sequence.hpp"
#include "zipage/scheduler/scheduler.hpp"
#include "zipage/scheduler/zipage_scheduler.hpp"

namespace zipage {

template <class Model, class EvictionPolicy = full_kv, class Scheduler = zipage_scheduler,
          class Backend = typename detail::model_backend<Model>::type>
class engine {
  // One static_assert per missing piece, each saying what to add (zipage/concepts.hpp).
  static_assert(engine_requirements<Model, EvictionPolicy, Scheduler, Backend>::checked);

 public:
  using model_type = Model;
  using backend_type = Backend;
  using tensor = typename Backend::tensor;

  explicit engine(Model model, engine_config cfg = {}, EvictionPolicy policy = {}, Backend backend = {})
      : cfg_(std::move(cfg)),
        geometry_(checked_geometry(cfg_, EvictionPolicy::evicts)),
        model_(std::move(model)),
        policy_(std::move(policy)),
        backend_(std::move(backend)),
        memory_(checked_host_memory(
            plan_memory(checked_model_config(model_.config()),
                        sized_memory_request<EvictionPolicy::evicts, EvictionPolicy::uses_score_cache,
                                             requires { Scheduler::slot_per_running_request; }>(model_, backend_, cfg_,
                                                                                                geometry_)),
            cfg_, backend_)),
        pool_(checked_pool_blocks(cfg_, geometry_, model_.config(), memory_, EvictionPolicy::evicts)),
        stop_(stop_rules_for(model_.config(), cfg_)),
        scheduler_(scheduler_settings(), pool_),
        kv_(backend_.allocate_kv(
            kv_shape_for(model_.config(), geometry_, memory_, EvictionPolicy::evicts, EvictionPolicy::uses_score_cache))),
        executor_(model_, backend_, kv_, geometry_),
        worker_(backend_, kv_, policy_, geometry_, model_.config(),
                EvictionPolicy::evicts && cfg_.async_compression) {}

  [[nodiscard]] const model_config& config() const { return model_.config(); }
  [[nodiscard]] const engine_config& settings() const { return cfg_; }
  [[nodiscard]] const EvictionPolicy& policy() const { return policy_; }
  [[nodiscard]] const memory_plan& memory() const { return memory_; }

  // Queues a request. Throws zipage::error (and changes nothing) for a request that can never run.
  request_id add_request(std::vector<token_id> prompt, sampling_params params = {}) {
    return enqueue(make_sequence(std::move(prompt), std::move(params)));
  }

  // The same, with parts of the request already worked out (prepared_request.hpp): params.bad_words encoded
  // (encode_checked_bad_words against this model's vocabulary; no engine_config::encode_words is then needed) and
  // params.guided compiled (compile_checked_guide for engine_config::guide_vocab). A front end that had to do this
  // to check the request before accepting it hands the results over instead of having them redone here, on the
  // thread that runs the steps. Parts made from other words, another constraint or another vocabulary are an error.
  request_id add_request(std::vector<token_id> prompt, sampling_params params, const prepared_request& prepared) {
    return enqueue(make_sequence(std::move(prompt), std::move(params), &prepared));
  }

  // Queues several requests, all or none: every prompt is checked before any is queued, so a bad one
  // throws zipage::error (naming its index) and leaves nothing queued.
  std::vector<request_id> add_requests(const std::vector<std::vector<token_id>>& prompts, const sampling_params& params) {
    std::vector<std::unique_ptr<sequence>> seqs;
    seqs.reserve(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      try {
        seqs.push_back(make_sequence(prompts[i], params));
      } catch (const error& e) {
        fail("prompt ", i, " of ", prompts.size(), ": ", e.what(), " (no request was queued)");
      }
    }
    std::vector<request_id> ids;
    ids.reserve(seqs.size());
    for (auto& s : seqs) ids.push_back(enqueue(std::move(s)));
    return ids;
  }

  // Teacher forcing (evaluation): the request emits `forced` token by token instead of sampling, so its
  // logprobs score that continuation under this engine's (possibly compressed) cache.
  request_id add_forced_request(std::vector<token_id> prompt, std::vector<token_id> forced, sampling_params params = {}) {
    check(!forced.empty(), "request: the forced continuation is empty");
    for (token_id t : forced)  // checked here: a bad id would fail every later step() of every request
      check(t >= 0 && t < config().vocab_size, "request: forced token ", t, " is outside the vocabulary of ",
            config().vocab_size);
    params.max_tokens = static_cast<int>(forced.size());
    params.ignore_eos = true;
    params.stop.clear();
    params.stop_token_ids.clear();
    params.min_tokens = 0;
    params.logprobs = true;
    auto s = make_sequence(std::move(prompt), std::move(params));
    s->forced_tokens = std::move(forced);
    return enqueue(std::move(s));
  }

  // Stops a request now; everything it held (blocks, query slot, host copy) is freed at once. Returns
  // false for an unknown or finished id.
  bool cancel(request_id id) {
    sequence* s = find(id);
    if (s == nullptr || s->is_finished()) return false;
    if (s->compressing) {
      worker_.wait_idle(s->id);  // the worker must not write into blocks that are about to be reused
      land(worker_.take_finished(), failed_events_);
    }
    scheduler_.cancel(s);
    executor_.drop_swapped(s->id);
    return true;
  }

  [[nodiscard]] bool has_unfinished() const {
    return scheduler_.num_waiting() + scheduler_.num_running() + scheduler_.num_swapped() > 0;
  }

  // Runs one step (plan -> execute -> update); returns the tokens it produced and the requests it ended.
  std::vector<step_event> step() {
    // Requests whose compression failed while cancel() waited for the worker end now.
    std::vector<step_event> events = std::exchange(failed_events_, {});
    const step_plan plan = scheduler_.schedule();
    for (const sequence* s : plan.rejected) events.push_back({s->id, 0, {}, true, finish_reason::error});
    executor_.move_state(plan, worker_);
    if (plan.batch.empty()) {
      // Nothing can run until a compression lands (its request holds the blocks others wait for).
      land(worker_.in_flight() > 0 ? worker_.wait_finished() : worker_.take_finished(), events);
      return events;
    }
    const std::vector<token_id> sampled = executor_.run(plan);
    const std::size_t first = events.size();
    const step_output out{process_sampled(plan, sampled, stop_, events), worker_.take_finished()};
    record_step(plan);  // before update: its counts read the plan as it was run
    const std::vector<request_id> failed = scheduler_.update(plan, out);
    finish_events(plan, events, first);
    for (request_id id : failed) events.push_back({id, 0, {}, true, finish_reason::error});
    return events;
  }

  // Runs until every queued request is done.
  void run_to_completion(const std::function<void(const step_event&)>& on_event = {}) {
    while (has_unfinished()) {
      for (const auto& e : step())
        if (on_event) on_event(e);
    }
  }

  // Convenience: queue the prompts (all or none, as add_requests), run them as one continuous batch, return
  // outputs in prompt order.
  std::vector<request_output> generate(const std::vector<std::vector<token_id>>& prompts, const sampling_params& params) {
    const std::vector<request_id> ids = add_requests(prompts, params);
    run_to_completion();
    std::vector<request_output> out;
    out.reserve(ids.size());
    for (request_id id : ids) out.push_back(take_output(id));
    return out;
  }

  [[nodiscard]] const sequence& request(request_id id) const {
    const auto it = requests_.find(id);
    check(it != requests_.end(), "engine: unknown request id ", id);
    return *it->second;
  }

  // Hands a finished request's result over and forgets the request.
  request_output take_output(request_id id) {
    const sequence& s = request(id);
    check(s.is_finished(), "engine: request ", id, " has not finished");
    request_output out = output_of(s);
    requests_.erase(id);
    return out;
  }

  [[nodiscard]] engine_stats stats() const {
    engine_stats st = stats_;
    st.preemptions = scheduler_.num_preemptions();
    st.swaps = scheduler_.num_swaps();
    st.compressions = scheduler_.num_compressions();
    st.tokens_evicted = scheduler_.num_tokens_evicted();
    st.graph_steps = executor_.graph_steps();
    st.graph_padding_rows = executor_.graph_padding_rows();
    st.nano_batch_steps = executor_.nano_batch_steps();
    st.num_blocks = pool_.num_blocks();
    st.peak_blocks_used = pool_.peak_used();
    st.blocks_in_use = pool_.num_used();
    st.running = scheduler_.num_running();
    st.waiting = scheduler_.num_waiting();
    st.swapped = scheduler_.num_swapped();
    st.compressing = worker_.in_flight();
    st.slots_in_use = scheduler_.num_slots_in_use();
    st.num_query_slots = memory_.num_query_slots;
    st.prefix_hit_tokens = scheduler_.num_prefix_hit_tokens();
    st.prefix_lookups = pool_.prefix_lookups();
    st.prefix_hits = pool_.prefix_hits();
    return st;
  }

  [[nodiscard]] const block_pool& pool() const { return pool_; }
  [[nodiscard]] const typename Backend::kv_storage& kv_cache() const { return kv_; }
  // Requests not yet handed over with take_output (for inspection and tests).
  [[nodiscard]] std::vector<const sequence*> requests() const {
    std::vector<const sequence*> out;
    for (const auto& [id, s] : requests_) out.push_back(s.get());
    return out;
  }

 private:
  // A checked request, not yet queued: the prompt, the sampling parameters, what the pool, a step and the
  // model's context can hold, and text for stop strings. Throws zipage::error naming what is wrong.
  std::unique_ptr<sequence> make_sequence(std::vector<token_id> prompt, sampling_params params,
                                          const prepared_request* prepared = nullptr) const {
    check_request(prompt, params, config(), cfg_, prepared);
    auto s = std::make_unique<sequence>();
    s->prompt_len = static_cast<int>(prompt.size());
    s->tokens = std::move(prompt);
    s->params = std::move(params);
    if (!scheduler_.admissible(*s)) {
      const int blocks = blocks_for_tokens(s->num_tokens(), geometry_.block_size);
      check(blocks <= pool_.num_blocks(), "request: a prompt of ", s->num_tokens(), " tokens needs ", blocks,
            " KV blocks; the pool has ", pool_.num_blocks());
      fail("request: the scheduler refuses a prompt of ", s->num_tokens(), " tokens (its admissible() is false), "
           "though the pool's ", pool_.num_blocks(), " blocks hold it");
    }
    if (cfg_.make_detokenizer) s->detokenizer = cfg_.make_detokenizer(s->tokens);
    s->rules = token_rules_of(s->params, prepared ? *prepared : prepared_request{});
    return s;
  }

  // The request's logits processors in token form: its bad words encoded (each id checked against the model's
  // vocabulary; `prepared.bad_words` when the caller did that already), and with min_tokens the EOS ids it masks:
  // the model's eos and extra end-of-turn ids and the tokenizer's EOS (vLLM's all_stop_token_ids, which hold them
  // with or without ignore_eos); a guided request gets them too (the ids its guide allows at a match) and its
  // compiled guide (`prepared.guided`, or compiled here). The tokenizer's EOS reaches a request's stop ids only
  // through with_end_of_turn, which leaves it out under ignore_eos, so engine_config::tokenizer_eos is what keeps
  // it masked then.
  [[nodiscard]] token_rules token_rules_of(const sampling_params& p, const prepared_request& prepared) const {
    token_rules rules;
    rules.bad_words = bad_word_ids_of(p, prepared.bad_words.get());
    if (p.guided.active() || prepared.guided) rules.guided = guide_of(p.guided, prepared.guided.get());
    if (p.min_tokens > 0 || rules.guided) {  // (a guide allows them at a match)
      auto add = [&](token_id t) {
        if (t >= 0 && t < config().vocab_size &&
            std::find(rules.eos_ids.begin(), rules.eos_ids.end(), t) == rules.eos_ids.end())
          rules.eos_ids.push_back(t);
      };
      add(stop_.eos);
      for (token_id t : stop_.extra_eos) add(t);
      add(stop_.default_eos);
    }
    check_some_allowed(p, rules);
    return rules;
  }

  // allowed_token_ids of end ids only, which min_tokens masks: no token could be drawn for the first steps (a row
  // with every logit -inf samples token 0, outside the allowed set), so the request is an error at once.
  static void check_some_allowed(const sampling_params& p, const token_rules& rules) {
    if (p.min_tokens <= 0 || !p.allowed_token_ids || p.allowed_token_ids->empty()) return;
    const auto masked = [&](token_id t) {
      return std::find(rules.eos_ids.begin(), rules.eos_ids.end(), t) != rules.eos_ids.end() ||
             std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end();
    };
    check(!std::all_of(p.allowed_token_ids->begin(), p.allowed_token_ids->end(), masked),
          "request: sampling_params::allowed_token_ids holds only end-of-sequence or stop ids, which min_tokens = ",
          p.min_tokens, " rules out: no token could be sampled before it");
  }

  // The request's bad words in token form: `encoded` (checked to be made from them, for this vocabulary) or
  // encoded here.
  [[nodiscard]] std::vector<std::vector<token_id>> bad_word_ids_of(const sampling_params& p,
                                                                   const encoded_bad_words* encoded) const {
    if (encoded != nullptr) {
      // The ids stand for the request's words only if they were made from them, for this vocabulary.
      const auto& made = encoded->words();
      if (made != p.bad_words) {
        std::size_t i = 0;
        while (i < made.size() && i < p.bad_words.size() && made[i] == p.bad_words[i]) ++i;
        const auto word = [&](const std::vector<std::string>& w) {
          return i < w.size() ? "\"" + w[i] + "\"" : std::string("no word");
        };
        fail("request: the encoded bad words were made from other words than sampling_params::bad_words: at [", i,
             "] the request has ", word(p.bad_words), ", the encoding ", word(made));
      }
      check(encoded->vocab_size() == config().vocab_size, "request: the bad words were encoded for a vocabulary "
            "of ", encoded->vocab_size(), ", this model's is ", config().vocab_size);
      return encoded->ids();
    }
    if (p.bad_words.empty()) return {};
    return encode_checked_bad_words(p.bad_words, cfg_.encode_words, config().vocab_size).ids();
  }

  // The request's compiled guide: `compiled` (checked to be made from its constraint, for engine_config::guide_vocab)
  // or this engine's for that constraint (guide_cache: requests with one constraint share it).
  [[nodiscard]] std::shared_ptr<const guide> guide_of(const guided_decoding& spec,
                                                      const compiled_guide* compiled) const {
    if (compiled != nullptr) {
      check(compiled->spec() == spec, "request: the compiled guide was made from another constraint than "
            "sampling_params::guided (", spec.field(), ")");
      check(compiled->vocabulary() == cfg_.guide_vocab.get(), "request: the compiled guide was made for another "
            "vocabulary than engine_config::guide_vocab");
      return compiled->get();
    }
    try {
      return guides_->get(spec, cfg_.guide_vocab)->get();
    } catch (const error& e) {
      fail("request: sampling_params::guided: ", e.what());
    }
  }

  request_id enqueue(std::unique_ptr<sequence> s) {
    s->id = next_id_++;
    sequence* raw = s.get();
    requests_.emplace(raw->id, std::move(s));
    scheduler_.add(raw);
    return raw->id;
  }

  // Compactions the worker finished land through the scheduler (block manager); a failed one ends its
  // request, reported by an error event.
  void land(std::vector<finished_compression> done, std::vector<step_event>& events) {
    if (done.empty()) return;
    for (request_id id : scheduler_.update(step_plan{}, step_output{{}, std::move(done)}))
      events.push_back({id, 0, {}, true, finish_reason::error});
  }

  // The scheduler's settings: limits, B and W, the slots the memory plan made, and the rules update()
  // applies: when a request stops (EOS ids, the model's context) and when it compresses (the policy's).
  [[nodiscard]] scheduler_config scheduler_settings() const {
    scheduler_config sc;
    sc.max_num_seqs = cfg_.max_num_seqs;
    sc.max_batched_tokens = cfg_.max_batched_tokens;
    sc.geometry = geometry_;
    sc.prefix_caching = cfg_.prefix_caching;
    sc.order = cfg_.scheduling;
    sc.hybrid = cfg_.hybrid;
    sc.stop = stop_;
    if constexpr (EvictionPolicy::evicts) {
      sc.compress = true;
      sc.num_query_slots = memory_.num_query_slots;
      sc.compress_at = [policy = &policy_, geometry = geometry_](int kv_len) { return policy->should_compress(kv_len, geometry); };
    }
    return sc;
  }

  sequence* find(request_id id) {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : it->second.get();
  }

  // Step counts of the plan as it ran: a batch entry is a prompt (chunk) or one decode token.
  void record_step(const step_plan& plan) {
    bool prefill = false;
    for (const scheduled_seq& e : plan.batch) {
      const bool samples = e.samples();
      const bool is_prefill = e.tokens > 1 || !samples;
      prefill |= is_prefill;
      if (is_prefill) stats_.prompt_tokens += e.tokens;
      if (samples) ++stats_.generated_tokens;
    }
    ++stats_.steps;
    prefill ? ++stats_.prefill_steps : ++stats_.decode_steps;
    stats_.peak_running = std::max(stats_.peak_running, scheduler_.num_running());
  }

  engine_config cfg_;
  cache_geometry geometry_;  // from cfg_, checked once: block size, B and W as everything below uses them
  Model model_;
  EvictionPolicy policy_;
  Backend backend_;
  memory_plan memory_;
  block_pool pool_;
  stop_rules stop_;  // the scheduler's copy decides; output processing asks which tokens end the text
  Scheduler scheduler_;
  typename Backend::kv_storage kv_;
  std::unordered_map<request_id, std::unique_ptr<sequence>> requests_;
  // Compiled guides by constraint (a pointer: the engine stays movable, and make_sequence, const, may add to it).
  std::unique_ptr<guide_cache> guides_ = std::make_unique<guide_cache>();
  std::vector<step_event> failed_events_;  // compressions that failed while cancel() waited, reported by the next step()
  request_id next_id_ = 0;
  engine_stats stats_;  // step and token counts; the rest is read from the scheduler, the pool and the executor
  step_executor<Model, Backend, EvictionPolicy::evicts> executor_;  // holds the swapped requests' host copies

  // Declared last, so destroyed first: its thread finishes (joins) while the KV storage and the backend
  // it writes into still exist. It holds requests only by value (compression_request), never a pointer.
  compression_worker<EvictionPolicy, Backend> worker_;
};

}  // namespace zipage
