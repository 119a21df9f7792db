#pragma once
// The compression step of Compressed PagedAttention on the GPU for any score_recipe
// (policy/score_recipe.hpp: every built-in policy is one), batched over requests and layers: every stage
// is one kernel launch for all (layer, request, KV head) of the batch. Computes, on bf16 K/V/queries with
// fp32 scores, the same function as the CPU reference: scoring::run_recipe (policy/scoring.hpp) + the
// compressor's forced window keep and select_top_k (compression/compressor.hpp) + cpu::apply_compaction
// (backend/cpu/compaction.hpp).
//
// This header includes no CUDA header: device memory is passed as plain pointers (bf16 tensors as
// `void*`), streams as `cuda_stream` (dtype.hpp). Every function launches asynchronously on `stream`
// and throws zipage::error when its arguments are out of range or a CUDA call fails.
//
// Stages (each one launch for the whole batch):
//   score   1. window attention A over the full cache (two passes: softmax statistics, then scores);
//              nothing for recency importance (the score is the position)
//           2. history: S = max(A, gamma * S_prev) or A + S_prev outside the newest block unless first
//              compression; S goes to the workspace and, when the recipe has a history, to the score
//              cache (in place, the unpooled value)
//   select  3-5. redundancy sums r (block-local, or the whole sequence), R = one softmax over the
//              request's tokens of r / (tau * n); F = lambda * S' - (1 - lambda) * R (or S'), S' =
//              max-pool(S) when the recipe pools; the window (and sinks) +inf
//           6. top-keep per (layer, request, KV head) by a block-wide radix select (CUB block scans):
//              ties go to the older token, NaN counts as -inf; kept indices ascending
//   compact 7. in place, order-preserving: kept token i of each head moves from slot kept[i] to slot i
//              (K, V and the score cache); slots >= keep are left as they are
// compress() runs the three in order. A request with kv_len <= keep keeps everything (nothing moves).
#include <cstddef>
#include <cstdint>

#include "zipage/backend/cuda/dtype.hpp"  // cuda_stream
#include "zipage/backend/cuda/paged_kv_view.hpp"
#include "zipage/policy/score_recipe.hpp"

namespace zipage::cuda {

struct compress_params {
  // The method's reference recipe (zipage_policy with its defaults).
  static score_recipe default_recipe() {
    score_recipe r;
    r.history = score_recipe::history_kind::decayed_max;
    r.pooling = score_recipe::pool_when::first_compression;
    r.redundancy = score_recipe::redundancy_kind::block_local;
    return r;
  }

  // ---- The paged cache and the batch's page tables (device memory). The cache pointers point at the
  // first layer to process; layer l of the batch is at + l * (its layer stride), so one layer, a range
  // of layers or all layers work:
  //   kv.k_cache, kv.v_cache  bf16 [layers][kv.num_blocks][block_size][kv_heads][head_dim]
  //   kv.k_scale, kv.v_scale  FP8 KV cache (docs/fp8.md): when both are set, k_cache / v_cache hold E4M3
  //                           codes and these the bf16 scales [layers][num_blocks][block_size][kv_heads]
  //                           (the score cache's layout; paged_kv_view::fp8_scale_words must hold); keys are
  //                           scored as bf16(float(code) * scale) and compaction moves codes and scales together
  //   kv.num_blocks           blocks per layer of the pool (layer stride of K/V/scores)
  //   kv.page_indptr          [num_reqs + 1]; kv.page_indices: block ids of each request, in order
  //   kv.kv_len               [num_reqs] physical tokens, each in [window, max_kv_len]
  //   kv.head_dim             64 or 128; kv.block_size: power of two, 2..512
  paged_kv_view kv;
  float* score_cache = nullptr;       // fp32 [layers][num_blocks][block_size][kv_heads]; required when the
                                      // recipe has a history, else optional (compacted along if given)
  const void* query_cache = nullptr;  // bf16 [layers][num_slots][window][q_heads][head_dim] (unused for recency)
  int num_layers = 1;
  int num_slots = 0;   // query slots per layer (layer stride of the query cache)

  // ---- The batch (device memory, num_reqs entries).
  const std::int32_t* slot = nullptr;          // [num_reqs] query slot of each request
  const std::uint8_t* first_compression = nullptr;  // [num_reqs] 1 = never compressed (no score history)
  int num_reqs = 0;
  int max_kv_len = 0;  // host-side upper bound of kv.kv_len (sizes the grids and the workspace)

  // ---- Shape (the KV side is kv's).
  int num_q_heads = 0;
  int window = 16;     // W: recorded queries per request = tokens always kept (<= 256)
  int keep = 0;        // tokens kept per (layer, KV head): budget_blocks * block_size, >= window

  // ---- What to compute (zipage_policy's recipe by default: see policies.hpp).
  score_recipe recipe = default_recipe();
  float scale = 0.0f;   // attention softmax scale; 0 = 1/sqrt(head_dim)
};

// Device scratch the stages need; compress_*() take it together with its size. Contents need no
// initialisation; it is only valid between the stages of one compression.
std::size_t compress_workspace_bytes(const compress_params& p);

// Where the stages leave their results inside the workspace (for tests and debugging).
struct compress_workspace_view {
  float* final_scores = nullptr;  // F: [layers][reqs][kv_heads][max_kv_len]; window/sinks +inf
  std::int32_t* kept = nullptr;   // [layers][reqs][kv_heads][keep] kept slots, ascending (min(keep, kv_len) valid)
};
compress_workspace_view compress_workspace(const compress_params& p, void* workspace);

// Stages 1-2: window attention and global score; writes S into the score cache.
void compress_score(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream);
// Stages 3-6: redundancy, pooling, final score, forced keeps, top-keep selection. Reads S from the workspace.
void compress_select(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream);
// Stage 7: in-place compaction of K, V and the score cache by the kept indices in the workspace.
void compress_compact(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream);
// All of it, in order (up to 6 launches). Stream-capturable once a first call has set the kernels' attributes.
void compress(const compress_params& p, void* workspace, std::size_t workspace_bytes, cuda_stream stream);

}  // namespace zipage::cuda
