#pragma once
// safetensors writer: builds small .safetensors files in memory, for tests and tools that make synthetic
// checkpoints. It writes the layout safetensors.hpp reads (header padded with spaces to a multiple of 8).
//
//   zipage::safetensors::writer w;
//   w.add("model.norm.weight", {64}, values);                        // F32
//   w.add("model.embed_tokens.weight", {512, 64}, values, dtype::bf16);
//   w.write("model.safetensors");
//
// encode() is public so tests can hand-craft malformed files (any header text, any data bytes).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/core/half.hpp"
#include "zipage/safetensors/safetensors.hpp"

namespace zipage::safetensors {

class writer {
 public:
  // Adds a tensor from fp32 values, stored as `type` (F32, F16 or BF16).
  void add(const std::string& name, std::vector<std::int64_t> shape, std::span<const float> values,
           dtype type = dtype::f32) {
    check(is_loadable(type), "safetensors::writer: add() converts to F32/F16/BF16 only, not ", dtype_name(type));
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    check(n == static_cast<std::int64_t>(values.size()), "safetensors::writer: tensor '", name, "' has ",
          values.size(), " values for ", n, " elements");
    std::vector<std::byte> bytes(values.size() * dtype_size(type));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (type == dtype::f32) {
        std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      } else {
        const std::uint16_t h = type == dtype::f16 ? zipage::f32_to_fp16(values[i]) : zipage::f32_to_bf16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    add_raw(name, dtype_name(type), std::move(shape), std::move(bytes));
  }

  // Adds a tensor with any dtype name and raw bytes (not checked against the shape).
  void add_raw(const std::string& name, std::string_view dtype_text, std::vector<std::int64_t> shape,
               std::vector<std::byte> bytes) {
    entries_.push_back({name, std::string(dtype_text), std::move(shape), std::move(bytes)});
  }

  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  // The header JSON this writer would produce (tensors laid out in the order added).
  [[nodiscard]] std::string header() const {
    json::value h = json::value::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    std::uint64_t offset = 0;
    for (const auto& e : entries_) {
      h[e.name] = {{"dtype", e.dtype_text}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
      offset += e.bytes.size();
    }
    return h.dump();
  }

  [[nodiscard]] std::vector<std::byte> bytes() const {
    std::vector<std::byte> data;
    for (const auto& e : entries_) data.insert(data.end(), e.bytes.begin(), e.bytes.end());
    return encode(header(), data);
  }

  void write(const std::filesystem::path& path) const { write_bytes(path, bytes()); }

  // u64 header length | header (space-padded to a multiple of 8 when `pad`) | data.
  [[nodiscard]] static std::vector<std::byte> encode(std::string header_text, std::span<const std::byte> data,
                                                     bool pad = true) {
    if (pad)
      while (header_text.size() % 8 != 0) header_text.push_back(' ');
    std::vector<std::byte> out(8 + header_text.size() + data.size());
    const std::uint64_t n = header_text.size();
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, header_text.data(), header_text.size());
    if (!data.empty()) std::memcpy(out.data() + 8 + header_text.size(), data.data(), data.size());
    return out;
  }

  static void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    check(out.good(), "safetensors::writer: cannot create '", path.string(), "'");
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    check(out.good(), "safetensors::writer: cannot write '", path.string(), "'");
  }

 private:
  struct entry {
    std::string name;
    std::string dtype_text;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zipage::safetensors
