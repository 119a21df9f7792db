#pragma once
// The executor: runs a step_plan on the backend and reports what it produced, changing no request state
// (scheduler.update does that with the result). In order: the plan's data movement (swap-outs,
// copy-on-write copies, swap-ins, then the compressions handed to the worker), the batch layout, the
// model's forward (a pure decode step through the backend's decode graphs when it has them), and
// sampling — on the device when the backend can, else on the host, with the requested log-probabilities
// (a request's output, written here).
#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/compression/compression_worker.hpp"
#include "zipage/core/cache_geometry.hpp"
#include "zipage/model/concepts.hpp"
#include "zipage/model/forward_context.hpp"
#include "zipage/sampling/logprobs.hpp"
#include "zipage/sampling/sampler.hpp"
#include "zipage/scheduler/step_plan.hpp"

namespace zipage {

// The batch layout: a step_plan as the one forward batch the model runs. The planned tokens go back to back
// with their logical positions (RoPE), their physical slots (block_table::slot), per-token causal
// lengths, the page tables in CSR form, the rows whose logits are sampled and, when queries are recorded
// (an evicting policy), the query-window row of each token in the last W positions of a block. It reads
// the requests and writes nothing of them. The buffers are kept between steps (no reallocation).
class batch_layout {
 public:
  // record_window: queries are recorded for compression (an evicting policy: the geometry's window W).
  batch_layout(const cache_geometry& geometry, bool record_window)
      : block_size_(geometry.block_size), window_(geometry.window), record_window_(record_window) {}

  // Lays the plan's tokens out; the returned batch views this layout until the next build or pad.
  const forward_batch& build(const step_plan& plan) {
    tokens_.clear();
    positions_.clear();
    slots_.clear();
    token_seq_.clear();
    token_kv_len_.clear();
    logits_rows_.clear();
    page_indptr_.assign(1, 0);
    page_indices_.clear();
    window_rows_.clear();
    for (std::size_t i = 0; i < plan.batch.size(); ++i) {
      const scheduled_seq& e = plan.batch[i];
      const sequence& s = *e.seq;
      // A chunk longer than a block maps several of its tokens to each window row; only the last of them is
      // recorded, because a backend writes a batch's rows in parallel, in no set order (the GPU kernel did, and
      // the window of a prompt that compresses within a block of its end came out different run to run).
      const int first_recorded = s.kv_len + e.tokens - block_size_;
      for (int j = 0; j < e.tokens; ++j) {
        const int logical = s.num_computed + j;
        const int physical = s.kv_len + j;
        tokens_.push_back(s.tokens[static_cast<std::size_t>(logical)]);
        positions_.push_back(logical);
        slots_.push_back(s.table.slot(physical, block_size_));
        token_seq_.push_back(static_cast<std::int32_t>(i));
        token_kv_len_.push_back(physical + 1);
        if (record_window_) window_rows_.push_back(physical >= first_recorded ? window_row(s, physical) : -1);
      }
      if (e.samples()) logits_rows_.push_back(static_cast<std::int32_t>(tokens_.size()) - 1);
      page_indices_.insert(page_indices_.end(), s.table.blocks().begin(), s.table.blocks().end());
      page_indptr_.push_back(static_cast<std::int32_t>(page_indices_.size()));
    }
    point(logits_rows_);
    return batch_;
  }

  // Pads a pure decode batch to `padded` sequences (a decode graph's batch size): one token each that
  // writes nowhere (slot -1), attends to nothing (kv_len 0, no pages) and records no query; every row's
  // logits are computed.
  const forward_batch& pad(int padded) {
    const int real = static_cast<int>(tokens_.size());
    for (int i = real; i < padded; ++i) {
      tokens_.push_back(0);
      positions_.push_back(0);
      slots_.push_back(-1);
      token_seq_.push_back(i);
      token_kv_len_.push_back(0);
      page_indptr_.push_back(page_indptr_.back());
      if (record_window_) window_rows_.push_back(-1);
    }
    graph_rows_.resize(static_cast<std::size_t>(padded));
    std::iota(graph_rows_.begin(), graph_rows_.end(), 0);
    point(graph_rows_);
    return batch_;
  }

  // The current batch (as built or padded) as two nano-batches, sequences [0, first) and [first, n), each with
  // its own tokens, positions, logits rows and attention metadata (sequence indices, page offsets and logits
  // rows renumbered from 0); they view this layout and the whole batch until the next build or pad.
  std::span<const forward_batch> split(int first) {
    const forward_batch& b = batch_;
    const attention_metadata& m = b.attention;
    const int num_seqs = m.num_seqs();
    check(first > 0 && first < num_seqs, "batch_layout: a nano-batch split at ", first, " of ", num_seqs, " sequences");
    // Tokens of a sequence are contiguous and sequences in order, so token_seq is sorted.
    const auto tokens = static_cast<std::size_t>(
        std::lower_bound(m.token_seq.begin(), m.token_seq.end(), first) - m.token_seq.begin());
    const auto pages = static_cast<std::size_t>(m.page_indptr[static_cast<std::size_t>(first)]);
    const auto seqs = static_cast<std::size_t>(first);
    second_seq_.assign(m.token_seq.begin() + static_cast<std::ptrdiff_t>(tokens), m.token_seq.end());
    for (auto& s : second_seq_) s -= first;
    second_indptr_.assign(m.page_indptr.begin() + static_cast<std::ptrdiff_t>(seqs), m.page_indptr.end());
    for (auto& p : second_indptr_) p -= static_cast<std::int32_t>(pages);
    for (auto& rows : split_rows_) rows.clear();
    for (const std::int32_t r : b.logits_rows) {
      const bool second = static_cast<std::size_t>(r) >= tokens;
      split_rows_[second].push_back(second ? r - static_cast<std::int32_t>(tokens) : r);
    }
    auto window = [&](std::size_t from, std::size_t count) {
      return m.token_window_row.empty() ? m.token_window_row : m.token_window_row.subspan(from, count);
    };
    const std::size_t rest = b.tokens.size() - tokens;
    halves_[0] = {b.tokens.first(tokens), b.positions.first(tokens), split_rows_[0],
                  {m.slot_mapping.first(tokens), m.token_seq.first(tokens), m.token_kv_len.first(tokens),
                   m.page_indptr.first(seqs + 1), m.page_indices.first(pages), window(0, tokens)}};
    halves_[1] = {b.tokens.subspan(tokens), b.positions.subspan(tokens), split_rows_[1],
                  {m.slot_mapping.subspan(tokens), second_seq_, m.token_kv_len.subspan(tokens), second_indptr_,
                   m.page_indices.subspan(pages), window(tokens, rest)}};
    return halves_;
  }

  [[nodiscard]] const forward_batch& batch() const { return batch_; }
  // Rows of the logits the model returns for the plan's sampling entries, in batch order (before padding).
  [[nodiscard]] std::size_t num_sampled_rows() const { return logits_rows_.size(); }

 private:
  // Queries are recorded while the write position is in the last W slots of a block, so at a block
  // boundary the window holds the last W queries of the block that just filled.
  [[nodiscard]] std::int32_t window_row(const sequence& s, int physical) const {
    const int offset = physical % block_size_ - (block_size_ - window_);
    return offset >= 0 && s.query_slot >= 0 ? s.query_slot * window_ + offset : -1;
  }

  // The forward batch views the buffers (again after they grew).
  void point(std::span<const std::int32_t> logits_rows) {
    batch_.tokens = tokens_;
    batch_.positions = positions_;
    batch_.logits_rows = logits_rows;
    batch_.attention = {slots_, token_seq_, token_kv_len_, page_indptr_, page_indices_, window_rows_};
  }

  int block_size_;
  int window_;
  bool record_window_;
  std::vector<token_id> tokens_;
  std::vector<std::int32_t> positions_, token_seq_, token_kv_len_, logits_rows_, page_indptr_, page_indices_;
  std::vector<std::int64_t> slots_;
  std::vector<std::int32_t> window_rows_;
  std::vector<std::int32_t> graph_rows_;  // logits rows of a padded decode-graph step (all of them)
  forward_batch batch_;
  // split(): the second nano-batch's renumbered sequences and page offsets, each half's logits rows
  std::vector<std::int32_t> second_seq_, second_indptr_;
  std::array<std::vector<std::int32_t>, 2> split_rows_;
  std::array<forward_batch, 2> halves_;
};

template <class Model, class Backend, bool Evicts>
class step_executor {
 public:
  using tensor = typename Backend::tensor;

  step_executor(Model& model, Backend& backend, typename Backend::kv_storage& kv, const cache_geometry& geometry)
      : model_(&model), backend_(&backend), kv_(&kv), layout_(geometry, Evicts) {}

  // Data movement the plan asks for, in an order that keeps every source intact until it is read:
  // swap-outs read blocks the plan may already have handed to others, then copy-on-write copies (their
  // sources may be among the blocks handed out), then swap-ins write into their fresh blocks, and only
  // then compressions start: a request swapped in this step may be compressed in the same step, and its
  // compression must read its restored cache and window queries. The worker gets one submission per step
  // (so it can compress the burst as one batch) of values (pages, lengths, slot), never the requests.
  template <class Worker>
  void move_state(const step_plan& plan, Worker& worker) {
    for (const swap_out_job& job : plan.swap_out) swapped_.emplace(job.seq->id, backend_->swap_out(*kv_, job.pages, job.slot));
    for (const compression_job& job : plan.compress)
      for (const block_copy& c : job.copies) backend_->copy_block(*kv_, c.from, c.to);
    for (const sequence* s : plan.swap_in) {
      auto it = swapped_.find(s->id);
      check(it != swapped_.end(), "engine: request ", s->id, " was swapped in without a saved state");
      backend_->swap_in(*kv_, s->table.blocks(), s->query_slot, it->second);
      swapped_.erase(it);
    }
    std::vector<compression_request> to_compress;
    for (const compression_job& job : plan.compress) to_compress.push_back(compression_request_of(*job.seq));
    worker.submit(std::move(to_compress));
  }

  // A cancelled request's host copy, if it was swapped out.
  void drop_swapped(request_id id) { swapped_.erase(id); }

  // Forward and sampling over the plan's batch: the token of every entry that samples, in batch order.
  std::vector<token_id> run(const step_plan& plan) {
    layout_.build(plan);
    return sample(plan, forward(plan));
  }

  [[nodiscard]] std::int64_t graph_steps() const { return graph_steps_; }
  [[nodiscard]] std::int64_t graph_padding_rows() const { return graph_padding_rows_; }
  // Steps run as two nano-batches (overlapping_backend).
  [[nodiscard]] std::int64_t nano_batch_steps() const { return nano_steps_; }

 private:
  [[nodiscard]] const model_config& config() const { return model_->config(); }

  const tensor& forward(const step_plan& plan) {
    if constexpr (decode_graph_runner<Backend> && forward_returns_reference<Model>) {
      if (const int padded = graph_batch_size(plan); padded > 0) {
        graph_steps_ += 1;
        graph_padding_rows_ += padded - static_cast<int>(plan.batch.size());
        layout_.pad(padded);
        forward_context<Backend> ctx = context(nano_batches(padded));
        return backend_->run_decode_graph(padded, [&]() -> const tensor& { return model_->forward(ctx); });
      }
    }
    forward_context<Backend> ctx = context(decode_only(plan) ? nano_batches(static_cast<int>(plan.batch.size()))
                                                               : std::span<const forward_batch>{});
    if constexpr (forward_returns_reference<Model>) {
      return model_->forward(ctx);
    } else {
      logits_ = model_->forward(ctx);
      return logits_;
    }
  }

  forward_context<Backend> context(std::span<const forward_batch> nano) {
    return forward_context<Backend>(*backend_, *kv_, layout_.batch(), config().num_q_heads, nano);
  }

  // A decode step of `num_seqs` sequences as two nano-batches when the backend overlaps them (it says from
  // which batch size on), else none.
  std::span<const forward_batch> nano_batches(int num_seqs) {
    if constexpr (overlapping_backend<Backend>) {
      const int first = backend_->nano_batch_split(num_seqs);
      if (first > 0 && first < num_seqs) {
        nano_steps_ += 1;
        return layout_.split(first);
      }
    }
    return {};
  }

  [[nodiscard]] static bool decode_only(const step_plan& plan) {
    return !plan.batch.empty() &&
           std::all_of(plan.batch.begin(), plan.batch.end(), [](const scheduled_seq& e) { return e.tokens == 1; });
  }

  // Whether an entry's token is chosen on the host: a forced token (teacher forcing). Logits processors do not
  // need the host: a device sampler applies them (sample_row::rules).
  [[nodiscard]] static bool host_sampled(const scheduled_seq& e) {
    return e.samples() && !e.seq->forced_tokens.empty();
  }

  // The graph batch size for this step, or 0: only steps where every sequence decodes one token and
  // samples it on the device (forced tokens need the logits on the host).
  [[nodiscard]] int graph_batch_size(const step_plan& plan) const {
    if constexpr (decode_graph_runner<Backend> && device_sampler<Backend>) {
      for (const scheduled_seq& e : plan.batch)
        if (e.tokens != 1 || !e.samples() || host_sampled(e)) return 0;
      return backend_->decode_graph_batch(static_cast<int>(plan.batch.size()));
    } else {
      return 0;
    }
  }

  // On a backend that can sample on the device the logits stay there (log-probabilities and logits processors
  // included), unless a row is forced (evaluation): then the host samples the step's rows.
  std::vector<token_id> sample(const step_plan& plan, const tensor& logits) {
    if constexpr (device_sampler<Backend>) {
      const bool host_only = std::any_of(plan.batch.begin(), plan.batch.end(), host_sampled);
      if (!host_only) {
        sample_rows_.clear();
        for (const scheduled_seq& e : plan.batch)
          if (e.samples())
            sample_rows_.push_back({static_cast<int>(sample_rows_.size()), &e.seq->params, e.seq->tokens,
                                    static_cast<std::uint64_t>(e.seq->num_generated()),
                                    e.seq->params.logprobs ? &e.seq->logprobs : nullptr,
                                    e.seq->params.top_logprobs > 0 ? &e.seq->top_logprobs : nullptr,
                                    &e.seq->rules});
        return backend_->sample(logits, sample_rows_);
      }
    }
    const std::size_t rows = layout_.num_sampled_rows();
    std::vector<token_id> out;
    out.reserve(rows);
    const auto vocab = static_cast<std::size_t>(config().vocab_size);
    // The shape, not only the size: logits written [vocab][rows] hold as many numbers and sample garbage.
    if constexpr (requires { logits.rows(); logits.cols(); })
      check(static_cast<std::size_t>(logits.rows()) == rows && static_cast<std::size_t>(logits.cols()) == vocab,
            "engine: the model returned logits of ", logits.rows(), " x ", logits.cols(), ", not ", rows,
            " rows (one per forward_context::logits_rows entry) x ", vocab, " (the vocabulary)");
    const std::vector<float> host_logits = backend_->to_host(logits);
    check(host_logits.size() == vocab * rows, "engine: the model returned ", host_logits.size(), " logits for ", rows,
          " requests of vocabulary ", vocab);
    std::size_t row = 0;
    for (const scheduled_seq& e : plan.batch)
      if (e.samples()) out.push_back(next_token(*e.seq, {host_logits.data() + row++ * vocab, vocab}));
    return out;
  }

  // A forced token (teacher forcing) or a draw; its log-probabilities when asked for.
  token_id next_token(sequence& s, std::span<const float> row) {
    const auto step = static_cast<std::size_t>(s.num_generated());
    const token_id tok = step < s.forced_tokens.size()
                             ? s.forced_tokens[step]
                             : sampler_.sample(row, s.params, s.tokens, static_cast<std::uint64_t>(step), s.rules);
    if (s.params.logprobs) s.logprobs.push_back(token_logprob_of(row, tok));
    if (s.params.top_logprobs > 0) s.top_logprobs.push_back(top_logprobs(row, s.params.top_logprobs));
    return tok;
  }

  Model* model_;
  Backend* backend_;
  typename Backend::kv_storage* kv_;
  batch_layout layout_;
  sampler sampler_;
  std::vector<sample_row> sample_rows_;
  tensor logits_;  // the last step's logits, for models that return them by value
  std::unordered_map<request_id, typename Backend::swap_blob> swapped_;  // host copies of swapped-out requests
  std::int64_t graph_steps_ = 0, graph_padding_rows_ = 0, nano_steps_ = 0;
};

}  // namespace zipage
