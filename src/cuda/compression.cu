// Launchers of the compression step (kernels in backend/cuda/compression_{scores,select}.cuh): validation, the
// workspace layout, and one launch per stage for the whole batch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "launch_checks.hpp"
#include "zipage/backend/cuda/compression.hpp"
#include "zipage/backend/cuda/compression_scores.cuh"
#include "zipage/backend/cuda/compression_select.cuh"

namespace zipage::cuda {

namespace {

using detail::aligned16;
using detail::compress_args;

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return (1 << s) == x ? s : -1;
}
int log2_ceil(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}
std::size_t align_up(std::size_t x) { return (x + 255) & ~std::size_t{255}; }

constexpr int kSelectSmemLimit = 96 * 1024;  // keys in shared memory up to 24,576 tokens, else from F at each pass

void validate(const compress_params& p) {
  check(p.kv.head_dim == 64 || p.kv.head_dim == 128, "compress: head_dim ", p.kv.head_dim, " is not supported (64 or 128)");
  check(p.kv.num_kv_heads > 0 && p.num_q_heads > 0 && p.num_q_heads % p.kv.num_kv_heads == 0, "compress: ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.num_q_heads / p.kv.num_kv_heads <= 128, "compress: GQA group ", p.num_q_heads / p.kv.num_kv_heads,
        " is larger than 128");
  const int shift = log2_exact(p.kv.block_size);
  check(shift >= 1 && p.kv.block_size <= 512, "compress: block_size ", p.kv.block_size, " is not a power of two in [2, 512]");
  check(p.window >= 1 && p.window <= 256 && p.window <= p.kv.block_size, "compress: window ", p.window,
        " must be in [1, min(256, block_size)]");
  check(p.keep >= p.window, "compress: keep (", p.keep, ") must be >= window (", p.window, ")");
  check(p.num_layers >= 1 && p.num_reqs >= 0 && p.max_kv_len >= 0, "compress: bad batch size");
  check(p.kv.num_blocks > 0 && p.num_slots > 0, "compress: num_blocks and num_slots must be positive");
  p.recipe.validate();
  check(std::int64_t{p.num_layers} * p.num_reqs * p.kv.num_kv_heads < (std::int64_t{1} << 31),
        "compress: too many (layer, request, head) segments");
  check(p.max_kv_len <= 65535 * detail::kAttnChunk, "compress: max_kv_len above ", 65535 * detail::kAttnChunk);
  check(aligned16(p.kv.k_cache) && aligned16(p.kv.v_cache) && (!p.recipe.needs_queries() || aligned16(p.query_cache)),
        "compress: K, V and query caches must be 16-byte aligned");
}

struct layout {
  std::size_t stats = 0, imp = 0, red = 0, dup = 0, fscore = 0, kept = 0, total = 0;
  int rows_pad = 0, attn_chunks = 0, gp_shift = 0;
  std::int64_t segments = 0;
};

layout make_layout(const compress_params& p) {
  layout l;
  const int group = p.num_q_heads / p.kv.num_kv_heads;
  l.gp_shift = log2_ceil(group);
  l.rows_pad = (p.window * (1 << l.gp_shift) + 15) / 16 * 16;
  l.attn_chunks = std::max(1, (p.max_kv_len + detail::kAttnChunk - 1) / detail::kAttnChunk);
  l.segments = std::int64_t{p.num_layers} * p.num_reqs * p.kv.num_kv_heads;
  const auto seg = static_cast<std::size_t>(l.segments);
  const std::size_t row = seg * static_cast<std::size_t>(p.max_kv_len);
  const bool attention = p.recipe.needs_queries();
  const bool full = p.recipe.redundancy == score_recipe::redundancy_kind::full_sequence;
  l.stats = 0;
  l.imp = align_up(l.stats + (attention ? seg * l.rows_pad * l.attn_chunks * sizeof(float2) : 0));
  l.red = align_up(l.imp + (attention ? row * sizeof(float) : 0));
  l.dup = align_up(l.red + row * sizeof(float));
  l.fscore = align_up(l.dup + (full ? row * sizeof(unsigned long long) : 0));
  l.kept = align_up(l.fscore + row * sizeof(float));
  l.total = align_up(l.kept + seg * static_cast<std::size_t>(p.keep) * sizeof(std::int32_t));
  return l;
}

compress_args make_args(const compress_params& p, void* workspace, std::size_t workspace_bytes) {
  validate(p);
  check(!p.recipe.uses_score_cache() || p.score_cache != nullptr,
        "compress: the recipe merges with a history, so it needs the score cache");
  const layout l = make_layout(p);
  check(workspace != nullptr || l.total == 0, "compress: no workspace");
  check(workspace_bytes >= l.total, "compress: workspace of ", workspace_bytes, " bytes, ", l.total, " needed");
  auto* ws = static_cast<unsigned char*>(workspace);
  compress_args a{};
  a.k = static_cast<detail::bf16*>(p.kv.k_cache);
  a.v = static_cast<detail::bf16*>(p.kv.v_cache);
  check((p.kv.k_scale == nullptr) == (p.kv.v_scale == nullptr), "compress: FP8 needs both k_scale and v_scale");
  check(!p.kv.fp8() || p.kv.fp8_scale_words(), "compress: FP8 scales need block_size x num_kv_heads even and "
        "4-byte aligned scale arrays (got block_size ", p.kv.block_size, ", ", p.kv.num_kv_heads, " KV heads)");
  if (p.kv.k_scale != nullptr) {
    a.k8 = static_cast<std::uint8_t*>(p.kv.k_cache);
    a.v8 = static_cast<std::uint8_t*>(p.kv.v_cache);
    a.k_scale = p.kv.k_scale;
    a.v_scale = p.kv.v_scale;
  }
  a.scores = p.score_cache;
  a.q = static_cast<const detail::bf16*>(p.query_cache);
  a.kv_layer_stride = std::int64_t{p.kv.num_blocks} * p.kv.block_size * p.kv.num_kv_heads * p.kv.head_dim;
  a.score_layer_stride = std::int64_t{p.kv.num_blocks} * p.kv.block_size * p.kv.num_kv_heads;
  a.q_layer_stride = std::int64_t{p.num_slots} * p.window * p.num_q_heads * p.kv.head_dim;
  a.page_indptr = p.kv.page_indptr;
  a.page_indices = p.kv.page_indices;
  a.kv_len = p.kv.kv_len;
  a.slot = p.slot;
  a.first = p.first_compression;
  a.num_reqs = p.num_reqs;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.kv.num_kv_heads;
  a.group = p.num_q_heads / p.kv.num_kv_heads;
  a.gp_shift = l.gp_shift;
  a.window = p.window;
  a.keep = p.keep;
  a.bs_shift = log2_exact(p.kv.block_size);
  a.max_len = p.max_kv_len;
  a.rows_pad = l.rows_pad;
  a.attn_chunks = l.attn_chunks;
  a.q_rows = std::min(detail::kAttnMaxRows, l.rows_pad);
  a.red_chunk = std::max(detail::kRedMinChunk, p.kv.block_size);
  const float scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.kv.head_dim));
  a.scale_log2 = scale * detail::kLog2e;
  const score_recipe& r = p.recipe;
  a.history = static_cast<int>(r.history);
  a.recency = r.importance == score_recipe::importance_kind::recency;
  a.pool_mode = static_cast<int>(r.pooling);
  a.redundancy = static_cast<int>(r.redundancy);
  a.gamma = r.gamma;
  a.lambda = r.lambda;
  a.tau = r.tau;
  a.pool_radius = r.pooling == score_recipe::pool_when::never ? 0 : r.pool_kernel / 2;
  a.sinks = r.sinks;
  a.stats = reinterpret_cast<float2*>(ws + l.stats);
  a.imp = reinterpret_cast<float*>(ws + l.imp);
  a.red = reinterpret_cast<float*>(ws + l.red);
  a.dup = reinterpret_cast<unsigned long long*>(ws + l.dup);
  a.fscore = reinterpret_cast<float*>(ws + l.fscore);
  a.kept = reinterpret_cast<std::int32_t*>(ws + l.kept);
  a.select_smem = std::int64_t{p.max_kv_len} * 4 <= kSelectSmemLimit;
  return a;
}

// Dynamic shared memory above 48 KB needs an opt-in per kernel and device: set once to the device's
// maximum (occupancy follows the size given at launch).
template <class Kernel>
void allow_max_smem(Kernel kernel, std::atomic<std::uint64_t>& done) {
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t bit = std::uint64_t{1} << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  int optin = 0;
  ZIPAGE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  ZIPAGE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  ZIPAGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         optin - static_cast<int>(attr.sharedSizeBytes)));
  done.fetch_or(bit, std::memory_order_release);
}

int max_smem_optin() {
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  ZIPAGE_CUDA_CHECK(cudaGetDevice(&dev));
  int optin = dev < 64 ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (optin == 0) {
    ZIPAGE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (dev < 64) cache[dev].store(optin, std::memory_order_relaxed);
  }
  return optin;
}

// Chunks per window-attention CTA: as many as keep ~8 CTAs per SM still to come (2 resident, so the last
// wave is short), so that the Q tile is loaded once for many chunks and each chunk's keys arrive while the
// previous one is computed.
int attn_chunks_per_cta(std::int64_t segments, int chunks) {
  const std::int64_t target = std::int64_t{detail::device_multiprocessors()} * 8;
  return static_cast<int>(std::clamp<std::int64_t>(segments * chunks / target, 1, chunks));
}

template <int D>
void launch_score(compress_args a, unsigned segments, cudaStream_t stream) {
  static std::atomic<std::uint64_t> done_stats{0}, done_score{0};
  allow_max_smem(detail::window_attention_kernel<D, false>, done_stats);
  allow_max_smem(detail::window_attention_kernel<D, true>, done_score);
  a.attn_chunks_per_cta = attn_chunks_per_cta(segments, a.attn_chunks);
  const dim3 grid(segments, static_cast<unsigned>((a.attn_chunks + a.attn_chunks_per_cta - 1) / a.attn_chunks_per_cta));
  using cfg = detail::attn_config<D>;
  const bool fp8 = a.k8 != nullptr;
  detail::window_attention_kernel<D, false>
      <<<grid, detail::kAttnThreads, cfg::smem_bytes(a.q_rows, false, fp8), stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
  const std::int64_t rows = std::int64_t{segments} * a.rows_pad;
  constexpr int kRowsPerCta = detail::kMergeThreads / 32;
  detail::merge_stats_kernel<<<static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta), detail::kMergeThreads, 0,
                               stream>>>(a, rows);
  ZIPAGE_CUDA_CHECK_LAUNCH();
  detail::window_attention_kernel<D, true>
      <<<grid, detail::kAttnThreads, cfg::smem_bytes(a.q_rows, true, fp8), stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_select(const compress_args& a, unsigned segments, cudaStream_t stream) {
  static std::atomic<std::uint64_t> done_block{0}, done_select{0};
  allow_max_smem(detail::block_similarity_kernel<D>, done_block);
  allow_max_smem(detail::select_kernel, done_select);
  if (a.redundancy == static_cast<int>(score_recipe::redundancy_kind::block_local)) {
    const int smem = detail::block_similarity_smem_bytes<D>(a.red_chunk, 1 << a.bs_shift);
    check(smem <= max_smem_optin(), "compress: block_size ", 1 << a.bs_shift, " needs ", smem,
          " bytes of shared memory for head_dim ", D);
    const unsigned chunks = static_cast<unsigned>((a.max_len + a.red_chunk - 1) / a.red_chunk);
    detail::block_similarity_kernel<D><<<dim3(segments, std::max(1u, chunks)), detail::kRedThreads, smem, stream>>>(a);
    ZIPAGE_CUDA_CHECK_LAUNCH();
  } else if (a.redundancy == static_cast<int>(score_recipe::redundancy_kind::full_sequence)) {
    ZIPAGE_CUDA_CHECK(cudaMemsetAsync(a.dup, 0, std::size_t{segments} * a.max_len * sizeof(unsigned long long), stream));
    const unsigned tiles = static_cast<unsigned>((a.max_len + detail::kFullRows - 1) / detail::kFullRows);
    detail::full_similarity_kernel<D><<<dim3(segments, std::max(1u, tiles)), detail::kFullThreads,
                                        detail::full_similarity_smem_bytes<D>(), stream>>>(a);
    ZIPAGE_CUDA_CHECK_LAUNCH();
  }
  detail::finalize_kernel<<<segments, detail::kFinalThreads, 0, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
  const int sel_smem = a.select_smem ? a.max_len * 4 : 0;
  detail::select_kernel<<<segments, detail::kSelThreads, sel_smem, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_compact(const compress_args& a, unsigned segments, cudaStream_t stream) {
  if (a.k8 != nullptr)
    detail::compact_kernel<D, true><<<segments, detail::kCompactThreads, 0, stream>>>(a);
  else
    detail::compact_kernel<D, false><<<segments, detail::kCompactThreads, 0, stream>>>(a);
  ZIPAGE_CUDA_CHECK_LAUNCH();
}

unsigned segment_count(const compress_params& p) {
  return static_cast<unsigned>(std::int64_t{p.num_layers} * p.num_reqs * p.kv.num_kv_heads);
}

}  // namespace

std::size_t compress_workspace_bytes(const compress_params& p) {
  validate(p);
  return make_layout(p).total;
}

compress_workspace_view compress_workspace(const compress_params& p, void* workspace) {
  const layout l = make_layout(p);
  auto* ws = static_cast<unsigned char*>(workspace);
  return {reinterpret_cast<float*>(ws + l.fscore), reinterpret_cast<std::int32_t*>(ws + l.kept)};
}

void compress_score(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream) {
  const compress_args a = make_args(p, workspace, workspace_bytes);
  const unsigned segs = segment_count(p);
  if (segs == 0 || p.max_kv_len == 0 || !p.recipe.needs_queries()) return;
  if (p.kv.head_dim == 128) launch_score<128>(a, segs, stream);
  else launch_score<64>(a, segs, stream);
}

void compress_select(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream) {
  const compress_args a = make_args(p, workspace, workspace_bytes);
  const unsigned segs = segment_count(p);
  if (segs == 0 || p.max_kv_len == 0) return;
  if (p.kv.head_dim == 128) launch_select<128>(a, segs, stream);
  else launch_select<64>(a, segs, stream);
}

void compress_compact(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream) {
  const compress_args a = make_args(p, workspace, workspace_bytes);
  const unsigned segs = segment_count(p);
  if (segs == 0 || p.max_kv_len == 0) return;
  if (p.kv.head_dim == 128) launch_compact<128>(a, segs, stream);
  else launch_compact<64>(a, segs, stream);
}

void compress(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream) {
  compress_score(p, workspace, workspace_bytes, stream);
  compress_select(p, workspace, workspace_bytes, stream);
  compress_compact(p, workspace, workspace_bytes, stream);
}

}  // namespace zipage::cuda
