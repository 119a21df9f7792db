#pragma once
// The paged KV cache as the CUDA kernels see it: one small copyable value (FlashInfer's paged_kv_t is
// the model) held by the parameters of every kernel that reads or moves the cache — decode, prefill and
// generic attention (attention.hpp), KV append and compaction (ops.hpp) and compression (compression.hpp)
// — instead of each spelling the pointers, the block table and the geometry again.
// It is the device-side counterpart of kv/paged_kv.hpp's paged_kv_layer.
//
// No CUDA header here (device memory as plain pointers); the struct is a plain aggregate, so kernels may
// take it by value inside their parameters.
//
// Layouts (row-major, elements):
//   K, V          [num_blocks][block_size][num_kv_heads][head_dim]  one layer; bf16 / fp32, or E4M3 codes
//   k/v_scale     [num_blocks][block_size][num_kv_heads]            FP8 caches only: a bf16 each, as its 16 bits
//                                                                   (core/kv_scale.hpp, docs/fp8.md)
//   block table   CSR: sequence s owns page_indices[page_indptr[s] .. page_indptr[s + 1]) (block ids, in
//                 order); token j of the sequence is in slot pages[j / block_size] * block_size + j % block_size
//   kv_len        [num_seqs] physical tokens of each sequence (slots [0, kv_len[s]))
// Kernels that take a range of layers (compress) read layer l at k_cache + l * layer_elements() (and the
// scales at k_scale + l * scale_layer_elements()).
#include <cstdint>

namespace zipage::cuda {

struct paged_kv_view {
  // ---- The cache (device memory).
  void* k_cache = nullptr;  // [num_blocks][block_size][num_kv_heads][head_dim]
  void* v_cache = nullptr;  // same layout
  // FP8 KV cache: when both are set, k_cache / v_cache hold E4M3 codes (1 byte each, same layout) and
  // these the bf16 scales [num_blocks][block_size][num_kv_heads] (their bits; core/kv_scale.hpp); the kernels
  // read float(code) * kv_scale_to_f32(s).
  std::uint16_t* k_scale = nullptr;
  std::uint16_t* v_scale = nullptr;

  // ---- The block table (device memory). Kernels over one request (compaction) use page_indices alone.
  const std::int32_t* page_indptr = nullptr;   // [num_seqs + 1]
  const std::int32_t* page_indices = nullptr;  // [page_indptr[num_seqs]] block ids
  // Per-sequence lengths (device memory, [num_seqs]), for kernels that take one length per sequence
  // (decode, compress); null for those that take one per token (prefill, generic attention: their
  // token_kv_len).
  const std::int32_t* kv_len = nullptr;

  // ---- Geometry.
  int num_blocks = 0;  // blocks per layer of the pool: the layer stride, for kernels over several layers
  int block_size = 0;  // tokens per block
  int num_kv_heads = 0;
  int head_dim = 0;

  // ---- Strides, in elements.
  [[nodiscard]] constexpr std::int64_t token_stride() const { return std::int64_t{num_kv_heads} * head_dim; }
  [[nodiscard]] constexpr std::int64_t block_stride() const { return token_stride() * block_size; }
  [[nodiscard]] constexpr std::int64_t layer_elements() const { return block_stride() * num_blocks; }
  [[nodiscard]] constexpr std::int64_t scale_layer_elements() const {
    return std::int64_t{num_blocks} * block_size * num_kv_heads;
  }
  [[nodiscard]] constexpr bool fp8() const { return k_scale != nullptr && v_scale != nullptr; }
  // What the tuned FP8 kernels' tile loaders need of the scales (scale_word in backend/cuda/fp8.cuh): cp.async
  // moves 4, 8 or 16 aligned bytes, and a tile's 2-byte scales are strided by num_kv_heads, so each token's scale
  // comes as the aligned 4-byte word that holds it, and its half is found from the token's position: slot *
  // num_kv_heads and position * num_kv_heads are equal modulo 2 when block_size * num_kv_heads is even, and the
  // arrays are 4-byte aligned. (Any power-of-two block size >= 2 makes the product even; cuda_backend's FP8 pools
  // always satisfy it: allocate_kv requires it.)
  [[nodiscard]] bool fp8_scale_words() const {
    const auto a = reinterpret_cast<std::uintptr_t>(k_scale) | reinterpret_cast<std::uintptr_t>(v_scale);
    return (std::int64_t{block_size} * num_kv_heads) % 2 == 0 && a % 4 == 0;
  }
};

}  // namespace zipage::cuda
