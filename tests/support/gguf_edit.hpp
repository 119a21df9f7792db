#pragma once
// Variants of a real GGUF file for tests: its metadata and tensors (as F32) copied into a writer, edited (a key
// changed, a tensor added), and read back from memory.
#include <functional>
#include <string>

#include "zipage/gguf/gguf.hpp"
#include "zipage/gguf/writer.hpp"

namespace zipage::testing {

// A writer holding every key of `f` and every tensor as F32.
inline gguf::writer gguf_copy(const gguf::file& f) {
  gguf::writer w;
  for (const std::string& key : f.keys()) w.set(key, *f.find(key));
  for (const gguf::tensor_info& t : f.tensors()) w.add_tensor(t.name, t.dims, gguf::tensor_type::f32, f.to_f32(t));
  return w;
}

// `f` with `edit` applied to its copy, as a file in memory named `name` (the name its errors carry).
inline gguf::file gguf_edited(const gguf::file& f, const std::function<void(gguf::writer&)>& edit,
                              const std::string& name = "edited.gguf") {
  gguf::writer w = gguf_copy(f);
  edit(w);
  return gguf::file::from_bytes(w.bytes(), name);
}

}  // namespace zipage::testing
