// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): the compression hooks (worker thread, side stream) — key /
// score / window-query gathers for the host path, apply_compaction, and compress_on_device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "context.cuh"
#include "zipage/backend/cuda/compression.hpp"
#include "zipage/backend/cuda/ops.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------------
// compression hooks (worker thread, side stream)

namespace {

// Runs `fill(device_out)` on the side stream into `count` fp32 values and copies them into `out`.
template <class Fill>
void side_gather(context& c, std::size_t count, std::vector<float>& out, Fill&& fill) {
  const std::size_t bytes = count * sizeof(float);
  out.resize(count);
  if (count == 0) return;
  auto* dev = static_cast<float*>(c.side_dev.reserve(bytes, c.side));
  c.side_host.reserve(bytes);
  fill(dev);
  ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(c.side_host.p, dev, bytes, cudaMemcpyDeviceToHost, c.side));
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));
  std::memcpy(out.data(), c.side_host.p, bytes);
}

}  // namespace

void cuda_backend::gather_keys(cuda_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                               std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const auto& s = kv.shape;
  check_pages(s, pages, kv_len);
  const section sec{pages.data(), pages.size_bytes()};
  c.side_up.upload({&sec, 1}, c.side);
  const void* k_layer =
      static_cast<const char*>(kv.k.data()) + static_cast<std::size_t>(s.layer_stride() * layer) * kv.element_bytes();
  const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * static_cast<std::size_t>(kv_len) * s.head_dim;
  side_gather(c, n, out, [&](float* dev) {
    const std::uint16_t* k_scale =
        kv.fp8() ? static_cast<const std::uint16_t*>(kv.k_scale.data()) + kv.scale_layer_elements() * layer : nullptr;
    cuda::gather_keys(kv.dtype, k_layer, k_scale, c.side_up.device<std::int32_t>(0), s.block_size, s.num_kv_heads,
                      s.head_dim, kv_len, dev, as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::gather_scores(cuda_kv_storage& kv, int layer, std::span<const block_id> pages, int kv_len,
                                 std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * static_cast<std::size_t>(kv_len);
  if (!s.score_cache) {
    out.assign(n, 0.0f);
    return;
  }
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  check_pages(s, pages, kv_len);
  const section sec{pages.data(), pages.size_bytes()};
  c.side_up.upload({&sec, 1}, c.side);
  const float* layer_scores = static_cast<const float*>(kv.scores.data()) +
                              static_cast<std::size_t>(s.num_blocks) * s.block_size * s.num_kv_heads * layer;
  side_gather(c, n, out, [&](float* dev) {
    cuda::gather_scores(layer_scores, c.side_up.device<std::int32_t>(0), s.block_size, s.num_kv_heads, kv_len, dev,
                        as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::gather_window_queries(cuda_kv_storage& kv, int layer, int slot, std::vector<float>& out) const {
  context& c = use(ctx_);
  const auto& s = kv.shape;
  check(slot >= 0 && slot < s.num_query_slots, "compression: query slot ", slot, " outside ", s.num_query_slots);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const std::size_t n = static_cast<std::size_t>(s.window * s.query_row_stride());
  const void* src = static_cast<const char*>(kv.queries.data()) +
                    (static_cast<std::size_t>(s.query_layer_stride()) * static_cast<std::size_t>(layer) +
                     n * static_cast<std::size_t>(slot)) *
                        kv.query_element_bytes();
  side_gather(c, n, out, [&](float* dev) {
    cuda::to_f32(kv.dtype, src, dev, static_cast<std::int64_t>(n), as_stream(c.side));
  });
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.gathers;
    k.gather_seconds += dt;
    k.gather_bytes += static_cast<std::int64_t>(n * sizeof(float));
  });
}

void cuda_backend::apply_compaction(cuda_kv_storage& kv, const compaction_plan& plan) const {
  context& c = use(ctx_);
  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  const auto& s = kv.shape;
  check(plan.num_layers == s.num_layers && plan.num_kv_heads == s.num_kv_heads, "apply_compaction: plan for ",
        plan.num_layers, " layers x ", plan.num_kv_heads, " heads on a cache of ", s.num_layers, " x ", s.num_kv_heads);
  check(plan.keep.size() == static_cast<std::size_t>(plan.num_layers) * plan.num_kv_heads * plan.new_len,
        "apply_compaction: keep has ", plan.keep.size(), " entries");
  check_pages(s, plan.pages, plan.old_len);
  for (int l = 0; l < plan.num_layers; ++l)
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      const auto kept = plan.kept(l, h);
      for (int i = 0; i < plan.new_len; ++i) {
        const int src = kept[static_cast<std::size_t>(i)];
        check(src >= i && src < plan.old_len && (i == 0 || src > kept[static_cast<std::size_t>(i) - 1]),
              "apply_compaction: kept indices must ascend within [0, old_len)");
      }
    }
  const bool scores = s.score_cache && !plan.kept_scores.empty();
  const section secs[] = {cuda_detail::span_section(std::span<const block_id>(plan.pages)),
                          cuda_detail::span_section(std::span<const std::int32_t>(plan.keep)),
                          scores ? cuda_detail::span_section(std::span<const float>(plan.kept_scores)) : section{nullptr, 0}};
  c.side_up.put(secs, c.side);
  cuda::compaction_params p;
  p.kv.k_cache = kv.k.data();
  p.kv.v_cache = kv.v.data();
  p.scores = scores ? static_cast<float*>(kv.scores.data()) : nullptr;
  p.kv.page_indices = c.side_up.device<std::int32_t>(0);
  p.keep = c.side_up.device<std::int32_t>(1);
  p.kept_scores = scores ? c.side_up.device<float>(2) : nullptr;
  p.layer_elements = s.layer_stride();
  p.score_layer_elements = std::int64_t{s.num_blocks} * s.block_size * s.num_kv_heads;
  p.num_layers = plan.num_layers;
  p.kv.num_kv_heads = plan.num_kv_heads;
  p.kv.head_dim = s.head_dim;
  p.kv.block_size = s.block_size;
  p.new_len = plan.new_len;
  p.dtype = kv.dtype;
  if (kv.fp8()) {
    // Codes (1 byte each) with the scores, then the scales as rows of one bf16 (head_dim 1, 2 bytes): a kept
    // token's codes and scale move together, bit for bit.
    p.element_bytes = 1;
    cuda::apply_compaction(p, as_stream(c.side));
    cuda::compaction_params ps = p;
    ps.kv.k_cache = kv.k_scale.data();
    ps.kv.v_cache = kv.v_scale.data();
    ps.scores = nullptr;
    ps.kept_scores = nullptr;
    ps.layer_elements = kv.scale_layer_elements();
    ps.kv.head_dim = 1;
    ps.element_bytes = 2;
    cuda::apply_compaction(ps, as_stream(c.side));
  } else {
    cuda::apply_compaction(p, as_stream(c.side));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));  // done before the engine reuses the freed tail blocks
  const double dt = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.compactions;
    k.compaction_seconds += dt;
  });
}

bool cuda_backend::compress_on_device(cuda_kv_storage& kv, std::span<const device_compression_job> jobs,
                                     const score_recipe& recipe, const compression_params& params, int keep) const {
  context& c = use(ctx_);
  const auto& sh = kv.shape;
  // Configurations the kernels do not cover go to the host path (which also reports bad arguments).
  // FP8 caches are covered too (keys dequantised to bf16 tiles, compaction moves codes and scales).
  if (!c.opts.device_compression || kv.dtype != cuda_dtype::bf16) return false;
  if (recipe.uses_score_cache() && (!sh.score_cache || kv.scores.data() == nullptr)) return false;
  if (recipe.needs_queries() && kv.queries.data() == nullptr) return false;
  if (sh.head_dim != 64 && sh.head_dim != 128) return false;
  if (!power_of_two(sh.block_size) || sh.block_size < 2 || sh.block_size > 512) return false;
  if (params.block_size != sh.block_size || params.window != sh.window || sh.window < 1 || sh.window > 256) return false;
  if (sh.num_kv_heads <= 0 || sh.num_q_heads % sh.num_kv_heads != 0 || sh.num_q_heads / sh.num_kv_heads > 128)
    return false;
  if (keep < sh.window) return false;  // the host path throws its message
  if (jobs.empty()) return true;
  int max_len = 0;
  std::int64_t total_pages = 0;
  for (const device_compression_job& j : jobs) {
    if (j.kv_len < sh.window || (recipe.needs_queries() && (j.slot < 0 || j.slot >= sh.num_query_slots))) return false;
    if (static_cast<std::int64_t>(j.pages.size()) * sh.block_size < j.kv_len) return false;
    for (const block_id b : j.pages)
      if (b < 0 || b >= sh.num_blocks) return false;
    max_len = std::max(max_len, j.kv_len);
    total_pages += static_cast<std::int64_t>(j.pages.size());
  }

  cuda::compress_params p;
  p.kv.k_cache = kv.k.data();
  p.kv.v_cache = kv.v.data();
  p.score_cache = sh.score_cache ? static_cast<float*>(kv.scores.data()) : nullptr;
  p.query_cache = kv.queries.data();
  p.kv.num_blocks = sh.num_blocks;
  p.num_slots = std::max(1, sh.num_query_slots);
  p.num_reqs = static_cast<int>(jobs.size());
  p.max_kv_len = max_len;
  p.num_q_heads = sh.num_q_heads;
  p.kv.num_kv_heads = sh.num_kv_heads;
  p.kv.head_dim = sh.head_dim;
  p.kv.block_size = sh.block_size;
  p.window = sh.window;
  p.keep = keep;
  p.recipe = recipe;
  // Layers per launch: as many as keep the workspace under its cap (the reference scores 8 layers per
  // launch for the same reason), at least one.
  p.num_layers = 1;
  std::size_t per_layer = 0;
  try {
    per_layer = cuda::compress_workspace_bytes(p);  // validates the shape (host-side only)
  } catch (const error&) {
    return false;
  }
  constexpr std::size_t workspace_cap = std::size_t{512} << 20;
  const int layers_per_launch =
      std::clamp(static_cast<int>(workspace_cap / std::max<std::size_t>(per_layer, 1)), 1, sh.num_layers);
  p.num_layers = layers_per_launch;
  const std::size_t ws_bytes = cuda::compress_workspace_bytes(p);

  const auto t0 = cuda_detail::clock::now();
  std::lock_guard lock(c.side_mu);
  c.activate();
  c.compress_staging.indptr.assign(1, 0);
  c.compress_staging.indices.clear();
  c.compress_staging.indices.reserve(static_cast<std::size_t>(total_pages));
  c.compress_staging.lens.clear();
  c.compress_staging.slots.clear();
  c.compress_staging.first.clear();
  for (const device_compression_job& j : jobs) {
    c.compress_staging.indices.insert(c.compress_staging.indices.end(), j.pages.begin(), j.pages.end());
    c.compress_staging.indptr.push_back(static_cast<std::int32_t>(c.compress_staging.indices.size()));
    c.compress_staging.lens.push_back(j.kv_len);
    c.compress_staging.slots.push_back(std::max(0, j.slot));
    c.compress_staging.first.push_back(j.first_compression ? 1 : 0);
  }
  const auto& st = c.compress_staging;
  const section secs[] = {cuda_detail::span_section(std::span<const std::int32_t>(st.indptr)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.indices)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.lens)),
                          cuda_detail::span_section(std::span<const std::int32_t>(st.slots)),
                          cuda_detail::span_section(std::span<const std::uint8_t>(st.first))};
  c.side_up.put(secs, c.side);
  p.kv.page_indptr = c.side_up.device<std::int32_t>(0);
  p.kv.page_indices = c.side_up.device<std::int32_t>(1);
  p.kv.kv_len = c.side_up.device<std::int32_t>(2);
  p.slot = c.side_up.device<std::int32_t>(3);
  p.first_compression = c.side_up.device<std::uint8_t>(4);
  void* ws = c.compress_ws.reserve(std::max<std::size_t>(ws_bytes, 256), c.side);
  const std::size_t elem = kv.element_bytes();
  for (int l0 = 0; l0 < sh.num_layers; l0 += layers_per_launch) {
    cuda::compress_params q = p;
    q.num_layers = std::min(layers_per_launch, sh.num_layers - l0);
    q.kv.k_cache = static_cast<char*>(kv.k.data()) + static_cast<std::size_t>(sh.layer_stride()) * l0 * elem;
    q.kv.v_cache = static_cast<char*>(kv.v.data()) + static_cast<std::size_t>(sh.layer_stride()) * l0 * elem;
    if (p.score_cache != nullptr)
      q.score_cache = p.score_cache + static_cast<std::size_t>(sh.num_blocks) * sh.block_size * sh.num_kv_heads * l0;
    if (kv.fp8()) {
      q.kv.k_scale = static_cast<std::uint16_t*>(kv.k_scale.data()) + kv.scale_layer_elements() * l0;
      q.kv.v_scale = static_cast<std::uint16_t*>(kv.v_scale.data()) + kv.scale_layer_elements() * l0;
    }
    if (kv.queries.data() != nullptr)
      q.query_cache = static_cast<const char*>(kv.queries.data()) +
                      static_cast<std::size_t>(sh.query_layer_stride()) * l0 * kv.query_element_bytes();
    cuda::compress(q, ws, ws_bytes, as_stream(c.side));
  }
  ZIPAGE_CUDA_CHECK(cudaStreamSynchronize(c.side));  // done before the engine reuses the freed tail blocks
  const double dt = cuda_detail::seconds_since(t0);
  const auto n = static_cast<std::int64_t>(jobs.size());
  c.count([&](cuda_backend_counters& k) {
    ++k.device_compression_batches;
    k.device_compressions += n;
    k.device_compression_seconds += dt;
    k.compactions += n;
    k.compaction_seconds += dt;
  });
  return true;
}

}  // namespace zipage
