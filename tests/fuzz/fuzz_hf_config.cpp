// config.json → model_config (and generation_config.json's fields on the same text): every field's type
// and range, then every size the engine derives from the config (q/k/v widths, K/V bytes per token, a
// memory plan with and without compression), which must be an error or a sane value, never a wrapped one.
#include "fuzz_common.hpp"

#include "zipage/engine/memory_plan.hpp"
#include "zipage/models/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = zipage_fuzz::text(data, size);
  zipage_fuzz::expect_only_zipage_errors([&] {
    const auto json = zipage::json::parse(text, "config.json");
    zipage_fuzz::expect_only_zipage_errors([&] {
      zipage::sampling_params p;
      zipage::generation_defaults_from_json(json, "generation_config.json").apply(p);
    });
    zipage_fuzz::expect_only_zipage_errors([&] {  // quantization_config (FP8 checkpoints)
      const auto q = zipage::hf_quantization_from_json(json, "config.json");
      zipage_fuzz::require(q.block_rows > 0 && q.block_cols > 0);
      zipage_fuzz::require(q.scale_rows(1) == 1 && q.scale_cols(std::int64_t{1} << 31) >= 1);
    });
    auto c = zipage::hf_config_from_json(json);
    zipage_fuzz::expect_only_zipage_errors([&] { zipage::merge_hf_generation_eos(c, json, "generation_config.json"); });
    zipage_fuzz::require(c.q_size() > 0 && c.kv_size() > 0 && c.gqa_group() > 0);
    for (const bool score_cache : {false, true}) {
      zipage_fuzz::expect_only_zipage_errors([&] {
        const std::size_t per_token = zipage::kv_bytes_per_token(c, 2, score_cache);
        zipage_fuzz::require(per_token >= 2u * static_cast<std::size_t>(c.kv_size()));
      });
      for (const bool compress : {false, true}) {
        zipage_fuzz::expect_only_zipage_errors([&] {
          zipage::memory_request r;
          r.budget_bytes = std::size_t{64} << 20;
          r.geometry = {.block_size = 16, .budget_tokens = 8 * 16, .window = 16};
          r.compress = compress;
          r.max_running = 8;
          r.score_cache = score_cache;
          const auto plan = zipage::plan_memory(c, r);
          zipage_fuzz::require(plan.num_blocks > 0 && plan.total_bytes() <= r.budget_bytes);
        });
      }
    }
  });
  return 0;
}
