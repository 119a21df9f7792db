// Start-up sizing of the KV memory.
#include <doctest/doctest.h>

#include "tiny_llama.hpp"
#include "zipage/engine/engine.hpp"
#include "zipage/engine/memory_plan.hpp"
#include "zipage/policy/policies.hpp"

using namespace zipage;

namespace {

model_config qwen3_8b_shape() {
  model_config c;
  c.vocab_size = 151936;
  c.hidden_size = 4096;
  c.num_layers = 36;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.ffn_size = 12288;
  return c;
}

}  // namespace

TEST_CASE("memory plan: max concurrency = bytes / (block_bytes (B+1) + query slot bytes), the rest blocks") {
  const model_config c = qwen3_8b_shape();
  memory_request r;
  r.budget_bytes = std::size_t{100} << 30;  // 100 GiB
  r.max_running = 1024;
  r.block_size = 256;
  r.budget_blocks = 8;
  r.window = 16;
  r.element_bytes = 2;  // bf16
  const memory_plan p = plan_memory(c, r);
  // K+V of one block: 2 · 36 layers · 256 tokens · 8 heads · 128 dims · 2 bytes = 36 MiB.
  CHECK(p.block_bytes == std::size_t{36} << 20);
  // One query slot: 36 layers · 16 queries · 32 heads · 128 dims · 2 bytes = 4.5 MiB.
  CHECK(p.query_slot_bytes == std::size_t{36} * 16 * 32 * 128 * 2);
  CHECK(p.blocks_per_request == 9);
  const std::size_t per_request = p.block_bytes * 9 + p.query_slot_bytes;
  CHECK(p.max_concurrency == static_cast<int>(r.budget_bytes / per_request));
  CHECK(p.max_concurrency == 311);  // 102,400 MiB / (9 · 36 MiB + 4.5 MiB) = 311.7
  CHECK(p.num_query_slots == p.max_concurrency);
  CHECK(p.num_blocks == static_cast<int>((r.budget_bytes - p.query_slot_bytes * p.num_query_slots) / p.block_bytes));
  CHECK(p.total_bytes() <= r.budget_bytes);
  CHECK(p.describe().find("max concurrency 311") != std::string::npos);

  r.max_running = 100;  // slots beyond the running cap would sit idle
  CHECK(plan_memory(c, r).num_query_slots == 100);

  r.budget_blocks = 0;  // full KV: every byte is blocks, no slots, no bound
  const memory_plan full = plan_memory(c, r);
  CHECK(full.num_query_slots == 0);
  CHECK(full.blocks_per_request == 0);
  CHECK(full.num_blocks == static_cast<int>(r.budget_bytes / full.block_bytes));

  r.budget_bytes = 1000;  // too small for one block
  CHECK_THROWS_AS((void)plan_memory(c, r), zipage::error);
}

namespace {

// The CPU backend pretending to be a device with 1 GiB of which 0.2 GiB is in use.
struct metered_backend : cpu_backend {
  std::pair<std::size_t, std::size_t> memory_info() const { return {std::size_t{800} << 20, std::size_t{1} << 30}; }
};

struct metered_model {
  using backend_type = metered_backend;
  using tensor = cpu_backend::tensor;
  llama_model<cpu_backend> inner = testing::tiny_llama();
  const model_config& config() const { return inner.config(); }
  tensor forward(forward_context<metered_backend>&) { return tensor::Zero(1, config().vocab_size); }
};

}  // namespace

TEST_CASE("gpu_memory_utilization sizes the KV cache from the device's memory, as vLLM does") {
  engine_config cfg;
  cfg.gpu_memory_utilization = 0.5;  // 512 MiB target, 224 MiB in use -> 288 MiB for the KV cache
  engine<metered_model, zipage_policy> eng(metered_model{}, cfg);
  CHECK(eng.memory().budget_bytes == (std::size_t{512} << 20) - (std::size_t{224} << 20));
  CHECK(eng.memory().total_bytes() <= eng.memory().budget_bytes);

  cfg.gpu_memory_utilization = 0.2;  // below what is already in use
  CHECK_THROWS_WITH_AS((engine<metered_model, zipage_policy>(metered_model{}, cfg)),
                       doctest::Contains("leaves nothing for the KV cache"), zipage::error);
  cfg.gpu_memory_utilization = 1.5;
  CHECK_THROWS_WITH_AS((engine<metered_model, zipage_policy>(metered_model{}, cfg)),
                       doctest::Contains("must be in (0, 1]"), zipage::error);
}
