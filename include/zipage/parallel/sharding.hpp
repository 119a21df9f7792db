#pragma once
// Megatron-style sharding of a Llama-family model over N tensor-parallel ranks: which heads, MLP columns
// and vocabulary rows rank r holds, and the host-side slicing of row-major [rows][cols] weights.
//
//   attention: q heads split evenly (rank r: heads [r·q/N, (r+1)·q/N)); KV heads split evenly when there
//              are at least N of them, else each KV head is replicated on N / kv ranks (the ranks of its
//              GQA group), so every rank's q heads find their KV head locally.
//              wq/wk/wv (and their biases) by rows (output features); wo by columns -> partial sums,
//              all-reduced. q_norm / k_norm (per head_dim) are replicated.
//   MLP:       w_gate / w_up by rows, w_down by columns -> partial sums, all-reduced. ffn_size need not
//              divide by N (the ranges differ by at most one column).
//   vocabulary: rows [r·V', (r+1)·V') with V' = ceil(vocab / N); the last shard is padded with zero rows
//              so every rank's logits have V' columns (equal all-gather counts). The embedding shard has
//              one extra zero row that ids outside the shard look up, so the all-reduce of the ranks'
//              rows is exactly the full embedding (x + 0 = x in fp32).
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/model/model_config.hpp"

namespace zipage::parallel {

struct tp_layout {
  int size = 1;           // N, ranks
  int num_q_heads = 0;    // the model's (global) counts
  int num_kv_heads = 0;
  int head_dim = 0;
  int ffn_size = 0;
  int vocab_size = 0;
  int q_heads_per_rank = 0;
  int kv_heads_per_rank = 0;
  int kv_replicas = 1;     // ranks holding each KV head (N / kv when kv < N, else 1)
  int vocab_per_rank = 0;  // V' = ceil(vocab / N)

  // Checks that the model's heads shard over n ranks; the error names the config fields.
  [[nodiscard]] static tp_layout make(const model_config& c, int n) {
    check(n >= 1, "tensor parallel: the tensor-parallel size must be >= 1, got ", n);
    check(c.num_q_heads > 0 && c.num_kv_heads > 0, "tensor parallel: the model has no attention heads");
    check(c.num_q_heads % n == 0, "tensor parallel: num_q_heads (num_attention_heads / llama.attention.head_count) = ",
          c.num_q_heads, " is not divisible by the tensor-parallel size ", n,
          " (each rank takes num_q_heads / N query heads)");
    if (c.num_kv_heads >= n)
      check(c.num_kv_heads % n == 0, "tensor parallel: num_kv_heads (num_key_value_heads / llama.attention.head_count_kv) = ",
            c.num_kv_heads, " is not divisible by the tensor-parallel size ", n,
            " (each rank takes num_kv_heads / N KV heads)");
    else
      check(n % c.num_kv_heads == 0, "tensor parallel: the tensor-parallel size ", n,
            " is not a multiple of num_kv_heads (num_key_value_heads / llama.attention.head_count_kv) = ",
            c.num_kv_heads, " (with fewer KV heads than ranks each KV head is replicated on N / num_kv_heads ranks)");
    tp_layout l;
    l.size = n;
    l.num_q_heads = c.num_q_heads;
    l.num_kv_heads = c.num_kv_heads;
    l.head_dim = c.head_dim;
    l.ffn_size = c.ffn_size;
    l.vocab_size = c.vocab_size;
    l.q_heads_per_rank = c.num_q_heads / n;
    l.kv_replicas = c.num_kv_heads >= n ? 1 : n / c.num_kv_heads;
    l.kv_heads_per_rank = c.num_kv_heads >= n ? c.num_kv_heads / n : 1;
    l.vocab_per_rank = (c.vocab_size + n - 1) / n;
    return l;
  }

  [[nodiscard]] bool replicated() const { return kv_replicas > 1; }
  [[nodiscard]] int q_head_begin(int r) const { return r * q_heads_per_rank; }
  [[nodiscard]] int kv_head_begin(int r) const { return replicated() ? r / kv_replicas : r * kv_heads_per_rank; }
  // The first rank of the group that holds rank r's KV head (r itself without replication).
  [[nodiscard]] int kv_group_first_rank(int r) const { return r - r % kv_replicas; }
  // The rank whose copy of KV head h counts as the owner (the first that holds it).
  [[nodiscard]] int kv_owner(int h) const { return replicated() ? h * kv_replicas : h / kv_heads_per_rank; }
  [[nodiscard]] int ffn_begin(int r) const { return static_cast<int>(static_cast<long long>(ffn_size) * r / size); }
  [[nodiscard]] int ffn_count(int r) const { return ffn_begin(r + 1) - ffn_begin(r); }
  [[nodiscard]] int vocab_begin(int r) const { return std::min(vocab_size, r * vocab_per_rank); }
  [[nodiscard]] int vocab_count(int r) const { return std::min(vocab_size, (r + 1) * vocab_per_rank) - vocab_begin(r); }

  // The config a rank's shard computes with (its local head counts; the rest as the model's).
  [[nodiscard]] model_config rank_config(const model_config& c) const {
    model_config rc = c;
    rc.num_q_heads = q_heads_per_rank;
    rc.num_kv_heads = kv_heads_per_rank;
    return rc;
  }

  // KV memory of one rank relative to the whole model's: block bytes scale with KV heads, query-slot
  // bytes with q heads (the two agree unless KV heads are replicated).
  [[nodiscard]] double block_fraction() const { return double(kv_heads_per_rank) / num_kv_heads; }
  [[nodiscard]] double query_fraction() const { return double(q_heads_per_rank) / num_q_heads; }

  [[nodiscard]] std::string describe() const {
    std::string s = "tensor parallel: " + std::to_string(size) + " ranks x (" + std::to_string(q_heads_per_rank) +
                    " q heads, " + std::to_string(kv_heads_per_rank) + " KV head" + (kv_heads_per_rank == 1 ? "" : "s");
    if (replicated()) s += " replicated on " + std::to_string(kv_replicas) + " ranks";
    s += ", " + std::to_string(ffn_count(0)) + " MLP columns, " + std::to_string(vocab_per_rank) + " vocabulary rows)";
    return s;
  }
};

// Row-major [rows][cols] host matrices: the slices a rank takes and their inverse (for tests and checks).
// `pad_to` pads a row slice with zero rows up to that many rows.
inline std::vector<float> slice_rows(std::span<const float> m, int rows, int cols, int begin, int count, int pad_to = 0) {
  check(static_cast<std::size_t>(rows) * cols == m.size() && begin >= 0 && count >= 0 && begin + count <= rows,
        "tensor parallel: row slice [", begin, ", ", begin + count, ") outside a ", rows, "x", cols, " matrix");
  std::vector<float> out(static_cast<std::size_t>(std::max(count, pad_to)) * cols, 0.0f);
  std::copy_n(m.begin() + static_cast<std::ptrdiff_t>(begin) * cols, static_cast<std::size_t>(count) * cols, out.begin());
  return out;
}

inline std::vector<float> slice_cols(std::span<const float> m, int rows, int cols, int begin, int count) {
  check(static_cast<std::size_t>(rows) * cols == m.size() && begin >= 0 && count >= 0 && begin + count <= cols,
        "tensor parallel: column slice [", begin, ", ", begin + count, ") outside a ", rows, "x", cols, " matrix");
  std::vector<float> out(static_cast<std::size_t>(rows) * count);
  for (int r = 0; r < rows; ++r)
    std::copy_n(m.begin() + static_cast<std::ptrdiff_t>(r) * cols + begin, count,
                out.begin() + static_cast<std::ptrdiff_t>(r) * count);
  return out;
}

// Inverses: row slices stacked, column slices side by side (each [rows][widths[i]]).
inline std::vector<float> concat_rows(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline std::vector<float> concat_cols(const std::vector<std::vector<float>>& parts, int rows) {
  std::vector<float> out;
  for (int r = 0; r < rows; ++r)
    for (const auto& p : parts) {
      const std::size_t w = p.size() / static_cast<std::size_t>(rows);
      out.insert(out.end(), p.begin() + static_cast<std::ptrdiff_t>(r * w), p.begin() + static_cast<std::ptrdiff_t>((r + 1) * w));
    }
  return out;
}

// The all-gathered logits ([N][rows][V'], rank-major) as [rows][vocab], dropping the padding columns.
inline void assemble_vocab_columns(const tp_layout& l, std::span<const float> gathered, int rows, float* out) {
  const auto vp = static_cast<std::size_t>(l.vocab_per_rank);
  check(gathered.size() == static_cast<std::size_t>(l.size) * static_cast<std::size_t>(rows) * vp,
        "tensor parallel: ", gathered.size(), " gathered logits for ", l.size, " ranks x ", rows, " rows x ", vp);
  for (int s = 0; s < l.size; ++s) {
    const int n = l.vocab_count(s), begin = l.vocab_begin(s);
    for (int i = 0; i < rows; ++i)
      std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(s) * rows + i) * vp), n,
                  out + static_cast<std::ptrdiff_t>(i) * l.vocab_size + begin);
  }
}

}  // namespace zipage::parallel
