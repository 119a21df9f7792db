#pragma once
// Eviction policies decide which cached tokens a request keeps once its cache reaches its budget.
// This header holds the concept and the policy that evicts nothing; the compressing policies build on it.
#include <concepts>
#include <string_view>

namespace zipage {

template <class P>
concept eviction_policy = requires(const P& p) {
  { p.name() } -> std::convertible_to<std::string_view>;
  { P::evicts } -> std::convertible_to<bool>;
};

// Full KV: every token stays cached for the life of the request.
struct full_kv {
  static constexpr bool evicts = false;
  [[nodiscard]] std::string_view name() const { return "full_kv"; }
};

}  // namespace zipage
