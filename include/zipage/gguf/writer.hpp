#pragma once
// GGUF writer: builds small GGUF v2/v3 files in memory, for tests and for tools that make
// synthetic models. It writes exactly the layout that gguf.hpp documents and reads.
//
//   zipage::gguf::writer w;
//   w.set("general.architecture", "llama");
//   w.set("llama.block_count", 2u);
//   w.add_tensor("token_embd.weight", {64, 512}, zipage::gguf::tensor_type::f16, values);
//   w.write("tiny.gguf");
//
// encoder, the low-level part, is public so tests can hand-craft malformed files field by field.

#include "zipage/core/half.hpp"
#include "zipage/gguf/gguf.hpp"

#include <fstream>
#include <type_traits>

namespace zipage::gguf {

// ---------------------------------------------------------------------------------------------
// fp32 -> half-precision conversions (round to nearest, ties to even)
// ---------------------------------------------------------------------------------------------

// (Defined in zipage/core/half.hpp; kept here as part of the GGUF writer API.)
using zipage::f32_to_bf16;
using zipage::f32_to_fp16;

// ---------------------------------------------------------------------------------------------
// encoder: GGUF primitives appended to a byte buffer
// ---------------------------------------------------------------------------------------------

class encoder {
 public:
  template <class T>
  encoder& put(T x) {  // any integer or float, little-endian
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                  "put<T> takes integers and floats; write a bool as std::uint8_t");
    return put_bytes(std::as_bytes(std::span(&x, 1)));
  }
  encoder& put_bytes(std::span<const std::byte> bytes) {
    // resize + memcpy rather than insert(): GCC 12 warns falsely (-Wstringop-overflow) on that.
    const std::size_t at = bytes_.size();
    bytes_.resize(at + bytes.size());
    if (!bytes.empty()) std::memcpy(bytes_.data() + at, bytes.data(), bytes.size());
    return *this;
  }
  encoder& put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    return put_bytes(std::as_bytes(std::span(s.data(), s.size())));
  }
  // A typed metadata value: u32 type tag, then the payload.
  encoder& put_value(const value& v) {
    put<std::uint32_t>(static_cast<std::uint32_t>(v.type()));
    return put_payload(v);
  }
  // The value without its type tag (also the encoding of an element of an array of arrays).
  encoder& put_payload(const value& v) {
    if (v.is_string()) return put_string(*v.as_string());
    if (!v.is_array()) return put_bytes(v.raw());
    put<std::uint32_t>(static_cast<std::uint32_t>(v.element_type()));
    put<std::uint64_t>(v.size());
    if (v.element_type() == value_type::string) {
      for (const std::string& s : v.strings()) put_string(s);
    } else if (v.element_type() == value_type::array) {
      for (const value& item : v.arrays()) put_payload(item);
    } else {
      put_bytes(v.raw());
    }
    return *this;
  }
  // Zero bytes up to the next multiple of `alignment`.
  encoder& pad_to(std::uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(std::byte{0});
    return *this;
  }

  std::size_t size() const noexcept { return bytes_.size(); }
  std::vector<std::byte>& bytes() noexcept { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// ---------------------------------------------------------------------------------------------
// writer
// ---------------------------------------------------------------------------------------------

class writer {
 public:
  // Metadata. Setting a key again replaces its value and keeps its original position.
  void set(std::string key, value v) {
    check(!key.empty(), "gguf::writer: empty metadata key");
    for (auto& kv : kvs_) {
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    }
    kvs_.emplace_back(std::move(key), std::move(v));
  }
  void set(std::string key, std::string_view s) { set(std::move(key), value::of(s)); }
  void set(std::string key, const char* s) { set(std::move(key), value::of(s)); }
  void set(std::string key, std::int32_t x) { set(std::move(key), value::of(x)); }
  void set(std::string key, std::uint32_t x) { set(std::move(key), value::of(x)); }
  void set(std::string key, std::int64_t x) { set(std::move(key), value::of(x)); }
  void set(std::string key, std::uint64_t x) { set(std::move(key), value::of(x)); }
  void set(std::string key, float x) { set(std::move(key), value::of(x)); }
  void set(std::string key, double x) { set(std::move(key), value::of(x)); }  // float64
  void set(std::string key, bool x) { set(std::move(key), value::of(x)); }
  void set(std::string key, std::vector<std::string> xs) {
    set(std::move(key), value::array_of(std::move(xs)));
  }
  void set(std::string key, const std::vector<float>& xs) {
    set(std::move(key), value::array_of(xs));
  }
  void set(std::string key, const std::vector<std::int32_t>& xs) {
    set(std::move(key), value::array_of(xs));
  }
  // Writes general.alignment (uint32), which places the data section and every tensor.
  void set_alignment(std::uint32_t alignment) {
    check(std::has_single_bit(alignment), "gguf::writer: alignment ", alignment,
          " is not a power of two");
    set("general.alignment", alignment);
  }

  // Adds a tensor from fp32 values, stored as `type` (converted to f16/bf16 if asked).
  // dims are in GGUF order (dims[0] fastest-varying); values.size() must equal their product.
  void add_tensor(std::string name, std::vector<std::int64_t> dims, tensor_type type,
                  std::span<const float> values) {
    check_new_tensor(name, type);
    check(!is_quantized(type), "gguf::writer: tensor '", name, "': add_tensor converts to F32, F16 or BF16; ",
          tensor_type_name(type), " data goes in encoded with add_encoded_tensor");
    check(element_count(name, dims) == values.size(), "gguf::writer: tensor '", name, "' has ",
          values.size(), " values but its dims hold ", element_count(name, dims));
    tensors_.push_back({std::move(name), std::move(dims), type, encode(type, values)});
  }

  // Adds a tensor already encoded as `type` (e.g. blocks that a quantiser made): `data` must be exactly
  // the bytes its dims take, whole blocks per row.
  void add_encoded_tensor(std::string name, std::vector<std::int64_t> dims, tensor_type type,
                          std::span<const std::byte> data) {
    check_new_tensor(name, type);
    const block_format f = format_of(type);
    const std::size_t n = element_count(name, dims);
    check(dims[0] % f.elements == 0, "gguf::writer: tensor '", name, "': ", tensor_type_name(type),
          " rows are whole blocks of ", f.elements, " values, but dimension 0 is ", dims[0]);
    const std::size_t want = n / static_cast<std::size_t>(f.elements) * f.bytes;
    check(data.size() == want, "gguf::writer: tensor '", name, "' has ", data.size(), " bytes but its dims take ",
          want, " as ", tensor_type_name(type));
    tensors_.push_back({std::move(name), std::move(dims), type, {data.begin(), data.end()}});
  }

  // The complete file. No padding follows the last tensor, so every strict prefix of the
  // result is a truncated file (the reader tests rely on this).
  std::vector<std::byte> bytes(std::uint32_t version = 3) const {
    check(version == 2 || version == 3, "gguf::writer: can write GGUF versions 2 and 3, not ",
          version);
    const std::uint64_t align = alignment();
    encoder e;
    e.put_bytes(std::as_bytes(std::span("GGUF", 4)));
    e.put<std::uint32_t>(version)
        .put<std::uint64_t>(tensors_.size())
        .put<std::uint64_t>(kvs_.size());
    for (const auto& [key, v] : kvs_) e.put_string(key).put_value(v);
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      offset = detail::align_up(offset, align);
      e.put_string(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
      for (std::int64_t d : t.dims) e.put<std::uint64_t>(static_cast<std::uint64_t>(d));
      e.put<std::uint32_t>(static_cast<std::uint32_t>(t.type)).put<std::uint64_t>(offset);
      offset += t.data.size();
    }
    for (const auto& t : tensors_) {
      e.pad_to(align);  // the data section start and each tensor are aligned
      e.put_bytes(t.data);
    }
    return e.take();
  }

  void write(const std::filesystem::path& path, std::uint32_t version = 3) const {
    const auto data = bytes(version);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    check(static_cast<bool>(out), "gguf::writer: cannot create '", path.string(), "'");
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
    out.close();
    check(static_cast<bool>(out), "gguf::writer: failed writing '", path.string(), "'");
  }

 private:
  struct pending_tensor {
    std::string name;
    std::vector<std::int64_t> dims;
    tensor_type type;
    std::vector<std::byte> data;
  };

  std::uint64_t alignment() const {
    for (const auto& [key, v] : kvs_) {
      if (key != "general.alignment") continue;
      const auto a = v.as_uint();
      check(a && std::has_single_bit(*a), "gguf::writer: general.alignment must be a power of two");
      return *a;
    }
    return detail::default_alignment;
  }

  static std::size_t element_count(const std::string& name, const std::vector<std::int64_t>& dims) {
    check(!dims.empty() && dims.size() <= detail::max_dims, "gguf::writer: tensor '", name,
          "' needs 1 to 4 dims, has ", dims.size());
    std::size_t n = 1;
    for (std::int64_t d : dims) {
      check(d > 0, "gguf::writer: tensor '", name, "' has dimension ", d);
      check(static_cast<std::uint64_t>(d) <= std::numeric_limits<std::size_t>::max() / n,
            "gguf::writer: tensor '", name, "' element count overflows");
      n *= static_cast<std::size_t>(d);
    }
    return n;
  }

  void check_new_tensor(const std::string& name, tensor_type type) const {
    check(!name.empty(), "gguf::writer: empty tensor name");
    check(is_supported_tensor_type(static_cast<std::uint32_t>(type)),
          "gguf::writer: tensor '", name, "': unsupported type ", static_cast<std::uint32_t>(type));
    for (const auto& t : tensors_) {
      check(t.name != name, "gguf::writer: duplicate tensor '", name, "'");
    }
  }

  static std::vector<std::byte> encode(tensor_type type, std::span<const float> values) {
    encoder e;
    e.bytes().reserve(values.size() * type_size(type));
    for (float x : values) {
      if (type == tensor_type::f32) e.put(x);
      if (type == tensor_type::f16) e.put(f32_to_fp16(x));
      if (type == tensor_type::bf16) e.put(f32_to_bf16(x));
    }
    return e.take();
  }

  std::vector<std::pair<std::string, value>> kvs_;  // in insertion order
  std::vector<pending_tensor> tensors_;
};

}  // namespace zipage::gguf
