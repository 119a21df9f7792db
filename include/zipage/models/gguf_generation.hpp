#pragma once
// A GGUF file's own sampling settings: the `general.sampling.*` keys that llama.cpp's converter writes from a
// checkpoint's generation_config.json and that llama.cpp reads as its defaults. zipage reads them into the
// same generation_defaults as a Hugging Face checkpoint's generation_config.json, so a GGUF file and the
// checkpoint it came from sample alike.
//
//   general.sampling.temp            -> temperature (>= 0)
//   general.sampling.top_k           -> top_k (>= 0; 0 = off)
//   general.sampling.top_p           -> top_p (in (0, 1])
//   general.sampling.min_p           -> min_p (in [0, 1])
//   general.sampling.penalty_repeat  -> repetition_penalty (> 0); zipage applies it over the prompt and the
//                                       output, as transformers and vLLM do, not over llama.cpp's last
//                                       penalty_last_n tokens
// Samplers zipage does not have (mirostat, XTC) are reported in `ignored` when the file turns them on, and
// general.sampling.sequence (llama.cpp's sampler order) is not read: zipage's order is fixed. A key of the
// wrong type or out of range is an error naming the file and the key.
#include <optional>
#include <string>
#include <string_view>

#include "zipage/core/checked.hpp"
#include "zipage/core/error.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/hf_config.hpp"

namespace zipage {

inline generation_defaults generation_defaults_from_gguf(const gguf::file& f) {
  generation_defaults d;
  auto number = [&](std::string_view key, auto in_range, std::string_view range) -> std::optional<double> {
    const gguf::value* v = f.find(key);
    if (v == nullptr) return std::nullopt;
    const auto x = v->as_float();
    check(x.has_value(), f.name(), ": metadata ", key, " must be a number, got ", v->type_name());
    check(in_range(*x), f.name(), ": metadata ", key, " = ", *x, " must be ", range);
    return x;
  };
  // The sampler's fields are floats: checked after narrowing (a float64 1e300 would be an inf temperature).
  auto float_of = [&](std::string_view key, auto in_range, std::string_view range) -> std::optional<float> {
    const auto x = number(key, in_range, range);
    return x ? std::optional<float>(checked_float(*x, detail::concat(f.name(), ": metadata ", key))) : std::nullopt;
  };
  d.temperature = float_of("general.sampling.temp", [](double x) { return x >= 0.0; }, ">= 0 (0 = greedy)");
  d.top_p = float_of("general.sampling.top_p", [](double x) { return x > 0.0 && x <= 1.0; }, "in (0, 1]");
  d.min_p = float_of("general.sampling.min_p", [](double x) { return x >= 0.0 && x <= 1.0; }, "in [0, 1]");
  d.repetition_penalty =
      float_of("general.sampling.penalty_repeat", [](double x) { return x > 0.0; }, "> 0 (1 = off)");
  if (const gguf::value* v = f.find("general.sampling.top_k")) {
    const auto k = v->as_int();
    check(k.has_value(), f.name(), ": metadata general.sampling.top_k must be an integer, got ", v->type_name());
    // llama.cpp treats top_k <= 0 as off, as zipage's 0.
    check(*k <= (1LL << 31) - 1, f.name(), ": metadata general.sampling.top_k = ", *k, " is too large");
    d.top_k = *k <= 0 ? 0 : static_cast<int>(*k);
  }
  if (const auto m = number("general.sampling.mirostat", [](double x) { return x >= 0.0; }, ">= 0"); m && *m != 0.0)
    d.ignored.emplace_back("general.sampling.mirostat (mirostat sampling)");
  if (const auto p = number("general.sampling.xtc_probability", [](double x) { return x >= 0.0 && x <= 1.0; }, "in [0, 1]");
      p && *p > 0.0)
    d.ignored.emplace_back("general.sampling.xtc_probability (XTC sampling)");
  if (d.sets_sampling() || !d.ignored.empty()) d.source = f.name() + " (general.sampling)";
  return d;
}

}  // namespace zipage
