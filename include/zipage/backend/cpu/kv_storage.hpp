#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "zipage/kv/paged_kv.hpp"

namespace zipage {

namespace cpu {
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vector = Eigen::VectorXf;
}  // namespace cpu

// K and V for every layer: [layers][blocks][block_size][kv_heads][head_dim] each; when compressing,
// the score cache [layers][blocks][block_size][kv_heads] (paged like K/V, so compaction moves it the
// same way) and the query-window cache [layers][slots][W][q_heads][head_dim].
struct cpu_kv_storage {
  kv_cache_shape shape;
  std::vector<float> k;
  std::vector<float> v;
  std::vector<float> scores;
  std::vector<float> queries;

  explicit cpu_kv_storage(const kv_cache_shape& s)
      : shape(s),
        k(static_cast<std::size_t>(s.elements_per_side()), 0.0f),
        v(static_cast<std::size_t>(s.elements_per_side()), 0.0f),
        scores(static_cast<std::size_t>(s.score_elements()), 0.0f),
        queries(static_cast<std::size_t>(s.query_layer_stride() * s.num_layers), 0.0f) {}

  [[nodiscard]] paged_kv_layer<float> layer(int l) {
    const auto off = static_cast<std::size_t>(shape.layer_stride() * l);
    return {k.data() + off, v.data() + off, shape.block_size, shape.num_kv_heads, shape.head_dim};
  }
  [[nodiscard]] paged_kv_layer<const float> layer(int l) const {
    const auto off = static_cast<std::size_t>(shape.layer_stride() * l);
    return {k.data() + off, v.data() + off, shape.block_size, shape.num_kv_heads, shape.head_dim};
  }
  [[nodiscard]] std::size_t bytes() const {
    return (k.size() + v.size() + scores.size() + queries.size()) * sizeof(float);
  }
  [[nodiscard]] float* query_rows(int l) {
    return queries.data() + static_cast<std::size_t>(shape.query_layer_stride() * l);
  }
  [[nodiscard]] float* layer_scores(int l) {
    return scores.data() + static_cast<std::size_t>(std::int64_t{shape.num_blocks} * shape.block_size * shape.num_kv_heads * l);
  }
};

}  // namespace zipage
