// The engine's side of decode graphs (model/concepts.hpp decode_graph_runner), on the CPU: a backend
// that pads decode steps like cuda_backend does (here to a multiple of 4) and runs the forward twice, as
// cuda_backend's record and capture passes do, must give exactly the tokens of the plain CPU engine —
// full KV and compressed, greedy and sampled, under preemption. This checks the padding rows (slot -1,
// kv_len 0, no pages, no window query) change nothing for the real ones and that a forward repeated over
// the same batch is harmless.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/policy/policies.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "stories_model.hpp"

using namespace zipage;
using zipage::testing::stories;

namespace {

struct padding_backend : cpu_backend {
  // Shared across the engine's copies of the backend.
  struct tally {
    int graph_calls = 0;
    int padded_rows = 0;
    int wrong_logits_rows = 0;
  };
  std::shared_ptr<tally> seen = std::make_shared<tally>();

  [[nodiscard]] int decode_graph_batch(int n) const { return (n + 3) / 4 * 4; }

  const tensor& run_decode_graph(int batch, const std::function<const tensor&()>& forward) const {
    ++seen->graph_calls;
    forward();  // the "record" pass
    const tensor& logits = forward();
    if (logits.rows() != batch) ++seen->wrong_logits_rows;
    return logits;
  }

  // Host sampling behind the device_sampler hook (the engine pads only steps it samples this way).
  [[nodiscard]] std::vector<token_id> sample(const tensor& logits, std::span<const sample_row> rows) const {
    std::vector<token_id> out;
    for (const sample_row& r : rows) {
      const std::span<const float> row(logits.row(r.logits_row).data(), static_cast<std::size_t>(logits.cols()));
      out.push_back(sampler{}.sample(row, *r.params, r.context, r.step, r.rules ? *r.rules : token_rules{}));
    }
    return out;
  }
};

static_assert(decode_graph_runner<padding_backend>);
static_assert(!decode_graph_runner<cpu_backend>);
static_assert(forward_returns_reference<llama_model<cpu_backend>>);

std::vector<std::vector<token_id>> prompts(int n) {
  std::vector<std::vector<token_id>> out;
  const char* starts[] = {"Once upon a time", "The little dog", "One day, a girl", "Tom and his mom", "The sun"};
  for (int i = 0; i < n; ++i) out.push_back(stories().tokenizer.encode(std::string(starts[i % 5]) + (i % 2 ? "," : ""), true));
  return out;
}

std::vector<sampling_params> params(int n, bool sampled, int max_tokens) {
  std::vector<sampling_params> out;
  for (int i = 0; i < n; ++i) {
    sampling_params p;
    p.temperature = sampled ? 0.9f : 0.0f;
    p.top_p = sampled ? 0.9f : 1.0f;
    p.seed = 100 + static_cast<std::uint64_t>(i);
    p.max_tokens = max_tokens - 7 * (i % 5);  // requests finish at different steps: odd batch sizes
    p.ignore_eos = true;
    out.push_back(p);
  }
  return out;
}

// vLLM's logits processors on every request (a device sampler applies them from sample_row::rules; an engine that
// sampled them on the host would run no graph step).
std::vector<sampling_params> processor_params(int n, bool sampled, int max_tokens) {
  std::vector<sampling_params> out = params(n, sampled, max_tokens);
  for (int i = 0; i < n; ++i) {
    sampling_params& p = out[static_cast<std::size_t>(i)];
    switch (i % 4) {
      case 0: p.logit_bias = {{13, 4.0f}, {400, -100.0f}}; break;
      case 1: p.allowed_token_ids = std::vector<token_id>{13, 261, 298, 376, 432}; break;
      case 2: p.bad_words = {" the", "was"}; break;
      default: p.logit_bias = {{7, 0.5f}};
    }
    if (i % 3 == 0) {
      p.ignore_eos = false;
      p.min_tokens = 20;
    }
  }
  return out;
}

template <class Policy, class Backend>
std::vector<std::vector<token_id>> run(engine_config cfg, bool sampled, const Backend& backend = {},
                                       engine_stats* stats = nullptr, bool processors = false) {
  cfg.encode_words = words_encoder(stories().tokenizer);
  engine<llama_model<Backend>, Policy, zipage_scheduler, Backend> eng(load_llama_gguf<Backend>(stories().file, backend),
                                                                      cfg, Policy{}, backend);
  const auto ps = prompts(11);
  const auto sp = processors ? processor_params(11, sampled, 90) : params(11, sampled, 90);
  std::vector<request_id> ids;
  for (std::size_t i = 0; i < ps.size(); ++i) ids.push_back(eng.add_request(ps[i], sp[i]));
  eng.run_to_completion();
  std::vector<std::vector<token_id>> out;
  for (const request_id id : ids) out.push_back(eng.take_output(id).output);
  if (stats) *stats = eng.stats();
  CHECK(eng.pool().num_used() == 0);
  return out;
}

// The engine configurations both cases run: full KV, full KV under preemption, compressed.
struct variant {
  const char* name;
  engine_config cfg;
  bool compressed;
};
const variant variants[] = {
    {"full KV", engine_config{.block_size = 16, .num_blocks = 256}, false},
    {"full KV, small pool (preemption)", engine_config{.block_size = 16, .num_blocks = 40}, false},
    {"compressed (zipage, budget 3 blocks, window 8)",
     engine_config{.block_size = 16, .num_blocks = 256, .budget_tokens = 48, .window = 8}, true},
};

}  // namespace

// With processors: vLLM's logits processors on every request, which a device sampler applies (sample_row::rules), so
// their steps stay on it and in graphs, with the plain engine's tokens (the host sampler's processors).
TEST_CASE("padded decode-graph steps give the plain engine's tokens (full KV and compressed, greedy and sampled)") {
  for (const auto& v : variants) {
    for (const bool sampled : {false, true}) {
      for (const bool processors : {false, true}) {
        CAPTURE(v.name);
        CAPTURE(sampled);
        CAPTURE(processors);
        const padding_backend pb;
        engine_stats st;
        std::vector<std::vector<token_id>> want, got, plain;
        if (v.compressed) {
          want = run<zipage_policy, cpu_backend>(v.cfg, sampled, {}, nullptr, processors);
          got = run<zipage_policy, padding_backend>(v.cfg, sampled, pb, &st, processors);
          if (processors) plain = run<zipage_policy, cpu_backend>(v.cfg, sampled);
          CHECK(st.compressions > 0);
        } else {
          want = run<full_kv, cpu_backend>(v.cfg, sampled, {}, nullptr, processors);
          got = run<full_kv, padding_backend>(v.cfg, sampled, pb, &st, processors);
          if (processors) plain = run<full_kv, cpu_backend>(v.cfg, sampled);
        }
        CHECK(got == want);
        if (processors) CHECK(want != plain);  // the processors acted
        CHECK(st.graph_steps > 0);
        CHECK(st.graph_steps == pb.seen->graph_calls);
        CHECK(st.graph_padding_rows > 0);  // 11 requests finishing at different steps: never a multiple of 4 throughout
        CHECK(pb.seen->wrong_logits_rows == 0);
        if (v.cfg.num_blocks == 40) CHECK(st.preemptions > 0);
      }
    }
  }
}

// Nano-batches (model/forward_context.hpp): a decode step split in two halves whose layers the model interleaves
// (llama_model::forward_overlapped) must give the whole batch's tokens — eagerly and in padded graph steps, full
// KV and compressed, greedy and sampled, under preemption. On the CPU attention_async attends at once, so this
// checks the split itself: renumbered sequences, page offsets and logits rows, and the halves' order.
TEST_CASE("decode steps split into two nano-batches give the whole batch's tokens") {
  for (const auto& v : variants) {
    for (const bool sampled : {false, true}) {
      for (const bool graphs : {false, true}) {
        CAPTURE(v.name);
        CAPTURE(sampled);
        CAPTURE(graphs);
        engine_stats st;
        std::vector<std::vector<token_id>> want, got;
        cpu_backend plain;
        plain.overlap_min_batch = 3;  // 11 requests: split while 3 or more decode together
        padding_backend padded;
        padded.overlap_min_batch = 3;
        if (v.compressed) {
          want = run<zipage_policy, cpu_backend>(v.cfg, sampled);
          got = graphs ? run<zipage_policy, padding_backend>(v.cfg, sampled, padded, &st)
                       : run<zipage_policy, cpu_backend>(v.cfg, sampled, plain, &st);
          CHECK(st.compressions > 0);
        } else {
          want = run<full_kv, cpu_backend>(v.cfg, sampled);
          got = graphs ? run<full_kv, padding_backend>(v.cfg, sampled, padded, &st)
                       : run<full_kv, cpu_backend>(v.cfg, sampled, plain, &st);
        }
        CHECK(got == want);
        CHECK(st.nano_batch_steps > 0);
        CHECK(st.nano_batch_steps < st.steps);  // prefill steps and small tails are never split
        if (graphs) CHECK(st.graph_steps > 0);
        if (v.cfg.num_blocks == 40) CHECK(st.preemptions > 0);
      }
    }
  }
}

TEST_CASE("nano_batch_split: halves from the minimum batch on, the first a multiple of 16 from 32") {
  CHECK(nano_batch_split(100, 0) == 0);
  CHECK(nano_batch_split(255, 256) == 0);
  CHECK(nano_batch_split(256, 256) == 128);
  CHECK(nano_batch_split(3, 3) == 1);
  CHECK(nano_batch_split(40, 2) == 20);
  CHECK(nano_batch_split(100, 2) == 48);
  CHECK(nano_batch_split(1, 1) == 0);
}
