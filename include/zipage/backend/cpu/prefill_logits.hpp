#pragma once
// One prefill of a single sequence with full KV on the CPU backend, outside any engine: the logits of the
// rows asked for, flattened [rows][vocab]. For comparing a loaded model's numbers with a reference's
// (zipage-logits, the model tests).
#include <cstdint>
#include <numeric>
#include <vector>

#include "zipage/backend/cpu/cpu_backend.hpp"
#include "zipage/core/cache_geometry.hpp"
#include "zipage/core/error.hpp"
#include "zipage/model/forward_context.hpp"

namespace zipage {

template <class Model>
std::vector<float> cpu_prefill_logits(Model& m, const std::vector<token_id>& tokens,
                                      const std::vector<std::int32_t>& rows) {
  const auto& c = m.config();
  check(!tokens.empty(), "prefill_logits: no tokens");
  const std::size_t n = tokens.size();
  const int T = static_cast<int>(n), bs = default_block_size, blocks = (T + bs - 1) / bs;
  cpu_backend backend;
  kv_cache_shape shape;
  shape.num_layers = c.num_layers;
  shape.num_blocks = blocks;
  shape.block_size = bs;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  auto kv = backend.allocate_kv(shape);
  // Sized from n, not from each other: GCC 12 -O3 otherwise warns (-Wfree-nonheap-object, a false positive).
  std::vector<std::int32_t> pos(n), seq(n, 0), len(n), pages(static_cast<std::size_t>(blocks));
  std::vector<std::int64_t> slots(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);  // block b holds positions [b·bs, b·bs + bs): slot == position
  std::iota(len.begin(), len.end(), 1);
  std::iota(pages.begin(), pages.end(), 0);
  const std::vector<std::int32_t> indptr{0, blocks};
  forward_batch batch{tokens, pos, rows, {slots, seq, len, indptr, pages, {}}};
  forward_context<cpu_backend> ctx(backend, kv, batch, c.num_q_heads);
  return backend.to_host(m.forward(ctx));
}

}  // namespace zipage
