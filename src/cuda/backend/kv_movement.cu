// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): KV movement (engine thread, main stream) — copy-on-write
// block copies, swap-out to and swap-in from pinned host memory, each one batched-copy launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "context.cuh"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------------
// block copies and swapping (engine thread, main stream)

namespace {

struct kv_geometry {
  std::size_t block_bytes;  // K (or V) of one block, one layer
  std::size_t score_bytes;  // scores of one block, one layer (0 without a score cache)
  std::size_t slot_bytes;   // query-window rows of one slot, one layer
  std::size_t layer_bytes;
  std::size_t score_layer_bytes;
  std::size_t query_layer_bytes;
  std::size_t scale_bytes;        // FP8: one side's scales of one block (0 otherwise)
  std::size_t scale_layer_bytes;
};

kv_geometry geometry(const cuda_kv_storage& kv) {
  const auto& s = kv.shape;
  const std::size_t eb = kv.element_bytes();
  kv_geometry g{};
  g.block_bytes = static_cast<std::size_t>(s.block_size * s.token_stride()) * eb;
  g.score_bytes = s.score_cache ? static_cast<std::size_t>(s.block_size) * s.num_kv_heads * sizeof(float) : 0;
  g.slot_bytes = static_cast<std::size_t>(s.window * s.query_row_stride()) * kv.query_element_bytes();
  g.layer_bytes = static_cast<std::size_t>(s.layer_stride()) * eb;
  g.score_layer_bytes = static_cast<std::size_t>(s.num_blocks) * g.score_bytes;
  g.query_layer_bytes = static_cast<std::size_t>(s.query_layer_stride()) * kv.query_element_bytes();
  // (one bf16 per token and KV head; allocate_kv makes it a multiple of 4, as batched_copy moves 4-byte words)
  g.scale_bytes = kv.fp8() ? static_cast<std::size_t>(s.block_size) * s.num_kv_heads * sizeof(std::uint16_t) : 0;
  g.scale_layer_bytes = static_cast<std::size_t>(s.num_blocks) * g.scale_bytes;
  return g;
}

std::uint64_t addr(const void* p, std::size_t off) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) + off);
}

void run_copies(context& c, const std::vector<cuda::copy_desc>& descs) {
  if (descs.empty()) return;
  std::uint64_t max_bytes = 0;
  for (const auto& d : descs) max_bytes = std::max(max_bytes, d.bytes);
  const section s{descs.data(), descs.size() * sizeof(cuda::copy_desc)};
  c.misc_up.put({&s, 1}, c.stream);
  cuda::batched_copy(c.misc_up.device<cuda::copy_desc>(0), static_cast<int>(descs.size()), max_bytes,
                     as_stream(c.stream));
}

// Pieces of a request's state, in the blob's order: per layer and page K, V, scores; then per layer the
// slot's query rows. `to_host` picks the direction.
std::vector<cuda::copy_desc> state_copies(const cuda_kv_storage& kv, std::span<const block_id> pages, int slot,
                                                  bool queries, void* host, bool to_host) {
  const auto g = geometry(kv);
  const auto& s = kv.shape;
  std::vector<cuda::copy_desc> descs;
  std::size_t at = 0;
  auto add = [&](const void* dev, std::size_t off, std::size_t bytes) {
    if (bytes == 0) return;
    const std::uint64_t d = addr(dev, off), h = addr(host, at);
    descs.push_back(to_host ? cuda::copy_desc{d, h, bytes} : cuda::copy_desc{h, d, bytes});
    at += bytes;
  };
  for (int l = 0; l < s.num_layers; ++l)
    for (const block_id b : pages) {
      const std::size_t off = g.layer_bytes * static_cast<std::size_t>(l) + g.block_bytes * static_cast<std::size_t>(b);
      add(kv.k.data(), off, g.block_bytes);
      add(kv.v.data(), off, g.block_bytes);
      const std::size_t soff = g.scale_layer_bytes * static_cast<std::size_t>(l) + g.scale_bytes * static_cast<std::size_t>(b);
      add(kv.k_scale.data(), soff, g.scale_bytes);  // FP8 only (0 bytes otherwise)
      add(kv.v_scale.data(), soff, g.scale_bytes);
      add(kv.scores.data(), g.score_layer_bytes * static_cast<std::size_t>(l) + g.score_bytes * static_cast<std::size_t>(b),
          g.score_bytes);
    }
  if (queries)
    for (int l = 0; l < s.num_layers; ++l)
      add(kv.queries.data(), g.query_layer_bytes * static_cast<std::size_t>(l) + g.slot_bytes * static_cast<std::size_t>(slot),
          g.slot_bytes);
  return descs;
}

}  // namespace

void cuda_backend::copy_block(cuda_kv_storage& kv, block_id from, block_id to) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  check(from >= 0 && from < s.num_blocks && to >= 0 && to < s.num_blocks, "copy_block: block outside the pool");
  const auto g = geometry(kv);
  std::vector<cuda::copy_desc> descs;
  for (int l = 0; l < s.num_layers; ++l) {
    const std::size_t base = g.layer_bytes * static_cast<std::size_t>(l);
    const std::size_t f = base + g.block_bytes * static_cast<std::size_t>(from);
    const std::size_t t = base + g.block_bytes * static_cast<std::size_t>(to);
    descs.push_back({addr(kv.k.data(), f), addr(kv.k.data(), t), g.block_bytes});
    descs.push_back({addr(kv.v.data(), f), addr(kv.v.data(), t), g.block_bytes});
    if (g.scale_bytes) {
      const std::size_t sb = g.scale_layer_bytes * static_cast<std::size_t>(l);
      for (void* scales : {kv.k_scale.data(), kv.v_scale.data()})
        descs.push_back({addr(scales, sb + g.scale_bytes * static_cast<std::size_t>(from)),
                         addr(scales, sb + g.scale_bytes * static_cast<std::size_t>(to)), g.scale_bytes});
    }
    if (g.score_bytes) {
      const std::size_t sb = g.score_layer_bytes * static_cast<std::size_t>(l);
      descs.push_back({addr(kv.scores.data(), sb + g.score_bytes * static_cast<std::size_t>(from)),
                       addr(kv.scores.data(), sb + g.score_bytes * static_cast<std::size_t>(to)), g.score_bytes});
    }
  }
  run_copies(c, descs);
  // The compression worker reads these blocks from its own stream next.
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.count([&](cuda_backend_counters& k) { ++k.block_copies; });
}

cuda_swap_blob cuda_backend::swap_out(cuda_kv_storage& kv, std::span<const block_id> pages, int slot) const {
  context& c = use(ctx_);
  c.activate();
  const auto& s = kv.shape;
  check_pages(s, pages, 0);
  const auto g = geometry(kv);
  cuda_swap_blob blob;
  blob.num_pages = pages.size();
  blob.has_queries = slot >= 0 && g.slot_bytes > 0 && kv.queries.data() != nullptr;
  blob.bytes = pages.size() * static_cast<std::size_t>(s.num_layers) * (2 * g.block_bytes + 2 * g.scale_bytes + g.score_bytes) +
               (blob.has_queries ? g.slot_bytes * static_cast<std::size_t>(s.num_layers) : 0);
  if (blob.bytes == 0) return blob;
  void* host = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostAlloc(&host, blob.bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  blob.host = std::shared_ptr<void>(host, [](void* p) { cudaFreeHost(p); });
  void* dev_view = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostGetDevicePointer(&dev_view, host, 0));
  run_copies(c, state_copies(kv, pages, slot, blob.has_queries, dev_view, true));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.count([&](cuda_backend_counters& k) {
    ++k.swaps_out;
    k.swap_bytes += static_cast<std::int64_t>(blob.bytes);
  });
  return blob;
}

void cuda_backend::swap_in(cuda_kv_storage& kv, std::span<const block_id> pages, int slot, cuda_swap_blob& blob) const {
  context& c = use(ctx_);
  c.activate();
  check(pages.size() >= blob.num_pages, "swap-in: ", pages.size(), " pages for ", blob.num_pages, " saved");
  if (blob.bytes == 0) return;
  const auto restore = pages.first(blob.num_pages);
  check_pages(kv.shape, restore, 0);
  void* dev_view = nullptr;
  ZIPAGE_CUDA_CHECK(cudaHostGetDevicePointer(&dev_view, blob.host.get(), 0));
  const bool queries = blob.has_queries && slot >= 0;
  run_copies(c, state_copies(kv, restore, slot, queries, dev_view, false));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // the engine drops the blob right after
  c.count([&](cuda_backend_counters& k) {
    ++k.swaps_in;
    k.swap_bytes += static_cast<std::int64_t>(blob.bytes);
  });
}

}  // namespace zipage
