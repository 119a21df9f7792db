#pragma once
// Start-up sizing of the KV memory. With an evicting policy each request with a query slot holds at
// most B + 1 blocks, so max_concurrency = bytes / (block_bytes · (B + 1) + query_slot_bytes); that many
// query slots are made (up to the running cap) and the rest of the memory becomes blocks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "zipage/core/cache_geometry.hpp"
#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/model/model_config.hpp"

namespace zipage {

struct memory_plan {
  std::size_t budget_bytes = 0;      // memory given to the KV cache
  std::size_t block_bytes = 0;       // K + V (+ scores) of one block, all layers
  std::size_t query_slot_bytes = 0;  // one slot of the query-window cache, all layers
  int num_blocks = 0;
  int num_query_slots = 0;
  int max_concurrency = 0;           // requests whose bounded caches fit at once (0 = unbounded, full KV)
  int blocks_per_request = 0;        // B + 1 when compressing, else 0 (unbounded)
  int block_size = 0;                // tokens per block

  // Tokens a compressed request keeps (B · block_size), 0 without compression.
  [[nodiscard]] int budget_tokens() const { return blocks_per_request > 0 ? (blocks_per_request - 1) * block_size : 0; }

  [[nodiscard]] std::size_t total_bytes() const {
    return block_bytes * static_cast<std::size_t>(num_blocks) + query_slot_bytes * static_cast<std::size_t>(num_query_slots);
  }

  [[nodiscard]] std::string describe() const {
    char buf[400];
    if (blocks_per_request > 0)
      std::snprintf(buf, sizeof buf,
                    "KV memory plan: %d blocks of %d tokens x %.1f KiB + %d query slots x %.1f KiB = %.1f MiB; each "
                    "compressed request keeps %d tokens (%d blocks of %d) + 1 write block; max concurrency %d",
                    num_blocks, block_size, block_bytes / 1024.0, num_query_slots, query_slot_bytes / 1024.0,
                    total_bytes() / 1048576.0, budget_tokens(), blocks_per_request - 1, block_size, max_concurrency);
    else
      std::snprintf(buf, sizeof buf,
                    "KV memory plan: %d blocks of %d tokens x %.1f KiB = %.1f MiB (full KV, no per-request bound)",
                    num_blocks, block_size, block_bytes / 1024.0, total_bytes() / 1048576.0);
    return buf;
  }
};

// K + V of one cached token over all layers, plus its fp32 score per KV head when a score cache is kept,
// plus `scale_bytes` per KV head and side when K/V are quantised with per-(token, head) scales (the FP8
// cache: element_bytes 1, scale_bytes 2, a bf16). Computed in 64 bits and checked: a config whose sizes
// overflow is an error, never a wrapped size.
[[nodiscard]] inline std::size_t kv_bytes_per_token(const model_config& c, std::size_t element_bytes, bool score_cache,
                                                    std::size_t scale_bytes = 0) {
  const std::int64_t kv_row = checked_mul(2 * std::int64_t{c.num_layers}, c.kv_size(), "KV cache: 2 x num_layers x kv_size");
  std::int64_t bytes = checked_mul(kv_row, static_cast<std::int64_t>(element_bytes), "KV cache: bytes per token");
  if (scale_bytes > 0)
    bytes = checked_add(bytes,
                        checked_mul(2 * std::int64_t{c.num_layers} * c.num_kv_heads, static_cast<std::int64_t>(scale_bytes),
                                    "KV cache: scale bytes per token"),
                        "KV cache: bytes per token");
  if (score_cache)
    bytes = checked_add(bytes, checked_mul(std::int64_t{c.num_layers} * c.num_kv_heads, sizeof(float), "KV cache: score bytes per token"),
                        "KV cache: bytes per token");
  return static_cast<std::size_t>(bytes);
}

// The KV cache's share of a device as vLLM sizes it: utilization x total memory - memory already in use
// (weights, workspaces), from the device's {free, total} bytes.
[[nodiscard]] inline std::size_t device_kv_budget(double utilization, std::pair<std::size_t, std::size_t> info) {
  const auto [free_bytes, total_bytes] = info;
  check(utilization > 0.0 && utilization <= 1.0, "engine: gpu_memory_utilization must be in (0, 1], got ", utilization);
  const double target = utilization * static_cast<double>(total_bytes);
  const double in_use = static_cast<double>(total_bytes - std::min(free_bytes, total_bytes));
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  check(target > in_use, "engine: gpu_memory_utilization ", utilization, " of ", static_cast<double>(total_bytes) / gib,
        " GiB leaves nothing for the KV cache: ", in_use / gib, " GiB are already in use");
  return static_cast<std::size_t>(target - in_use);
}

struct memory_request {
  std::size_t budget_bytes = 0;   // used when num_blocks == 0
  int num_blocks = 0;             // fixed pool size, or 0
  int num_query_slots = 0;        // fixed slot count, or 0 = derive
  int max_running = 0;            // slots beyond the running cap would sit idle
  cache_geometry geometry{};      // block size; with `compress` also the budget (B + 1 blocks a request) and W
  bool compress = false;          // false: no eviction (full KV: no query slots, no bound per request)
  bool score_cache = false;
  std::size_t element_bytes = sizeof(float);  // one K or V element
  std::size_t kv_scale_bytes = 0;             // per (token, KV head, side) scale of a quantised cache (FP8: 2)
  std::size_t query_element_bytes = 0;        // one query-window element; 0 = element_bytes
};

[[nodiscard]] inline memory_plan plan_memory(const model_config& c, const memory_request& r) {
  if (r.compress) r.geometry.validate("memory_request::geometry.");
  else r.geometry.validate_block_size("memory_request::geometry.");
  check(r.num_blocks >= 0 && r.num_query_slots >= 0, "memory plan: num_blocks and num_query_slots must not be negative");
  memory_plan p;
  p.block_size = r.geometry.block_size;
  // Every byte count in 64 bits, checked (an overflow is an error naming the product, not a wrapped size).
  const auto mul = [](std::int64_t a, std::int64_t b, const char* what) { return checked_mul(a, b, what); };
  const std::int64_t layers = c.num_layers;
  const std::int64_t block_bytes =
      mul(r.geometry.block_size, static_cast<std::int64_t>(kv_bytes_per_token(c, r.element_bytes, r.score_cache, r.kv_scale_bytes)),
          "memory plan: block_size x bytes per token");
  p.block_bytes = static_cast<std::size_t>(block_bytes);
  const bool compress = r.compress;
  if (compress) {
    p.blocks_per_request = static_cast<int>(checked_add(r.geometry.budget_blocks(), 1, "memory plan: budget_blocks + 1",
                                                        std::numeric_limits<int>::max()));
    p.query_slot_bytes = static_cast<std::size_t>(
        mul(mul(mul(layers, r.geometry.window, "memory plan: num_layers x window"), c.q_size(), "memory plan: query slot values"),
            static_cast<std::int64_t>(r.query_element_bytes > 0 ? r.query_element_bytes : r.element_bytes),
            "memory plan: query slot bytes"));
  }
  const std::int64_t per_request =
      checked_add(mul(block_bytes, p.blocks_per_request, "memory plan: block bytes x blocks per request"),
                  static_cast<std::int64_t>(p.query_slot_bytes), "memory plan: bytes per request");
  if (r.num_blocks > 0) {
    p.num_blocks = r.num_blocks;
    if (compress) p.max_concurrency = std::max(1, r.num_blocks / p.blocks_per_request);
  } else {
    p.budget_bytes = r.budget_bytes;
    if (compress && per_request > 0)
      p.max_concurrency = static_cast<int>(std::min<std::size_t>(r.budget_bytes / static_cast<std::size_t>(per_request), 1u << 20));
  }
  if (compress) {
    p.num_query_slots = r.num_query_slots > 0 ? r.num_query_slots : std::clamp(p.max_concurrency, 1, std::max(1, r.max_running));
  }
  const std::int64_t slot_total = mul(static_cast<std::int64_t>(p.query_slot_bytes), p.num_query_slots, "memory plan: query slots x slot bytes");
  if (r.num_blocks == 0) {
    check(r.budget_bytes > static_cast<std::size_t>(slot_total), "memory plan: the KV cache's ", r.budget_bytes,
          " bytes (engine_config::kv_cache_bytes, or what gpu_memory_utilization leaves on the device) cannot hold "
          "the query slots (", p.num_query_slots, " x ", p.query_slot_bytes, " = ", slot_total,
          " bytes) and a KV block; give it more, or fewer engine_config::num_query_slots");
    check(block_bytes > 0, "memory plan: a KV block of 0 bytes");
    p.num_blocks = static_cast<int>(
        std::min<std::size_t>((r.budget_bytes - static_cast<std::size_t>(slot_total)) / p.block_bytes, 1u << 30));
  }
  // The whole pool must be addressable (a fixed --num-blocks times a large block can overflow too).
  (void)checked_add(mul(block_bytes, p.num_blocks, "memory plan: num_blocks x block bytes"), slot_total,
                    "memory plan: pool bytes");
  check(p.num_blocks > 0, "memory plan: the KV cache's ", r.budget_bytes,
        " bytes (engine_config::kv_cache_bytes, or what gpu_memory_utilization leaves on the device) hold no KV block "
        "of ", p.block_bytes, " bytes (engine_config::block_size tokens, all layers)");
  return p;
}

}  // namespace zipage
