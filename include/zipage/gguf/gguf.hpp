#pragma once
// GGUF reader: memory-maps a .gguf file, validates its whole header, and exposes the metadata and
// the tensors. Any malformed input becomes a zipage::error that names the file and the problem;
// nothing is ever read outside the file and no allocation is sized by an unchecked count.
//
// Layout (versions 2 and 3 are identical on little-endian hosts; v3 only added big-endian files):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count     x (string key, u32 value_type, value)
//   tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 tensor_type, u64 offset)
//   zero padding up to general.alignment (default 32)
//   tensor data; every tensor's offset is relative to here and a multiple of the alignment.
// A string is a u64 byte length followed by the bytes (no terminator). An array is a u32 element
// type, a u64 count and the elements; an element that is itself an array repeats that header.
//
// Header-only and CUDA-free, so host tools and tests can include it anywhere.

#include "zipage/core/error.hpp"
#include "zipage/core/half.hpp"
#include "zipage/core/mapped_file.hpp"
#include "zipage/core/printable.hpp"
#include "zipage/gguf/quants.hpp"

#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>


namespace zipage::gguf {

// Values are decoded with memcpy in host order, which is only right on little-endian hosts.
static_assert(std::endian::native == std::endian::little,
              "zipage::gguf supports little-endian hosts only");

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

// The tensor types zipage can load (F32, F16, BF16 and the block-quantised types of quants.hpp) are
// `tensor_type`, declared in quants.hpp. Other ggml types (integer, lattice-coded IQ*) are rejected on open.

enum class value_type : std::uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6,
  boolean = 7, string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12
};

inline constexpr std::uint32_t max_value_type = 12;

// Name of a ggml tensor type id as llama.cpp spells it ("F32", "Q4_K", ...), "unknown" otherwise.
inline std::string_view tensor_type_name(std::uint32_t raw) noexcept {
  static constexpr std::array<std::string_view, 40> names = {
      "F32",     "F16",     "Q4_0",     "Q4_1",       "Q4_2",       "Q4_3",    "Q5_0",
      "Q5_1",    "Q8_0",    "Q8_1",     "Q2_K",       "Q3_K",       "Q4_K",    "Q5_K",
      "Q6_K",    "Q8_K",    "IQ2_XXS",  "IQ2_XS",     "IQ3_XXS",    "IQ1_S",   "IQ4_NL",
      "IQ3_S",   "IQ2_S",   "IQ4_XS",   "I8",         "I16",        "I32",     "I64",
      "F64",     "IQ1_M",   "BF16",     "Q4_0_4_4",   "Q4_0_4_8",   "Q4_0_8_8", "TQ1_0",
      "TQ2_0",   "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  return raw < names.size() ? names[raw] : std::string_view("unknown");
}
inline std::string_view tensor_type_name(tensor_type t) noexcept {
  return tensor_type_name(static_cast<std::uint32_t>(t));
}

inline bool is_supported_tensor_type(std::uint32_t raw) noexcept { return format_of(raw).has_value(); }

// Bytes per element of a float tensor type (F32, F16, BF16); quantised types store blocks (format_of).
inline std::size_t type_size(tensor_type t) noexcept { return t == tensor_type::f32 ? 4 : 2; }

inline std::string_view value_type_name(value_type t) noexcept {
  static constexpr std::array<std::string_view, 13> names = {
      "uint8", "int8",   "uint16", "int16",  "uint32", "int32", "float32",
      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < names.size() ? names[i] : std::string_view("unknown");
}

// Encoded size of a fixed-size value type; 0 for string and array.
inline std::size_t scalar_size(value_type t) noexcept {
  switch (t) {
    case value_type::uint8: case value_type::int8: case value_type::boolean: return 1;
    case value_type::uint16: case value_type::int16: return 2;
    case value_type::uint32: case value_type::int32: case value_type::float32: return 4;
    case value_type::uint64: case value_type::int64: case value_type::float64: return 8;
    default: return 0;
  }
}

inline bool is_integer_type(value_type t) noexcept {
  return scalar_size(t) != 0 && t != value_type::boolean && t != value_type::float32 &&
         t != value_type::float64;
}
inline bool is_float_type(value_type t) noexcept {
  return t == value_type::float32 || t == value_type::float64;
}

// ---------------------------------------------------------------------------------------------
// Half-precision conversions
// ---------------------------------------------------------------------------------------------

// (Defined in zipage/core/half.hpp; kept here as part of the GGUF API.)
using zipage::bf16_to_f32;
using zipage::fp16_to_f32;

// ---------------------------------------------------------------------------------------------
// value: one metadata value
// ---------------------------------------------------------------------------------------------

namespace detail {
class parser;
using zipage::detail::concat;  // error.hpp's message builder

template <class T> struct scalar_type_of;  // maps a C++ type to its GGUF value_type
template <> struct scalar_type_of<std::uint8_t> { static constexpr auto type = value_type::uint8; };
template <> struct scalar_type_of<std::int8_t> { static constexpr auto type = value_type::int8; };
template <> struct scalar_type_of<std::uint16_t> { static constexpr auto type = value_type::uint16; };
template <> struct scalar_type_of<std::int16_t> { static constexpr auto type = value_type::int16; };
template <> struct scalar_type_of<std::uint32_t> { static constexpr auto type = value_type::uint32; };
template <> struct scalar_type_of<std::int32_t> { static constexpr auto type = value_type::int32; };
template <> struct scalar_type_of<std::uint64_t> { static constexpr auto type = value_type::uint64; };
template <> struct scalar_type_of<std::int64_t> { static constexpr auto type = value_type::int64; };
template <> struct scalar_type_of<float> { static constexpr auto type = value_type::float32; };
template <> struct scalar_type_of<double> { static constexpr auto type = value_type::float64; };
template <> struct scalar_type_of<bool> { static constexpr auto type = value_type::boolean; };

template <class T>
T load(const std::byte* p) noexcept {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

// Reads an integer scalar of type t; nullopt for non-integers and for uint64 above INT64_MAX.
inline std::optional<std::int64_t> load_int(value_type t, const std::byte* p) noexcept {
  switch (t) {
    case value_type::uint8: return load<std::uint8_t>(p);
    case value_type::int8: return load<std::int8_t>(p);
    case value_type::uint16: return load<std::uint16_t>(p);
    case value_type::int16: return load<std::int16_t>(p);
    case value_type::uint32: return load<std::uint32_t>(p);
    case value_type::int32: return load<std::int32_t>(p);
    case value_type::int64: return load<std::int64_t>(p);
    case value_type::uint64: {
      const auto u = load<std::uint64_t>(p);
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return {};
      return static_cast<std::int64_t>(u);
    }
    default: return {};
  }
}

// Reads a float or integer scalar of type t as a double; nullopt for other types.
inline std::optional<double> load_float(value_type t, const std::byte* p) noexcept {
  if (t == value_type::float32) return load<float>(p);
  if (t == value_type::float64) return load<double>(p);
  if (t == value_type::uint64) return static_cast<double>(load<std::uint64_t>(p));
  if (auto i = load_int(t, p)) return static_cast<double>(*i);
  return {};
}

// Cuts an untrusted name to a readable length for error messages.
// (Valid UTF-8 stays readable, other bytes read as \xNN: core/printable.hpp.)
inline std::string printable(std::string_view s, std::size_t max_chars = 96) {
  return zipage::detail::printable_text(s, max_chars);
}
}  // namespace detail

// Any GGUF metadata value: a scalar, a string, or an array (of scalars, strings or arrays).
// Scalars and scalar arrays keep their packed little-endian encoding, so a large array costs
// exactly its size in the file.
class value {
 public:
  // ---- construction (used by the writer and by tests) ----
  template <class T>
  static value of(T x) {
    value v(detail::scalar_type_of<T>::type);
    v.raw_.resize(sizeof(T));
    if constexpr (std::is_same_v<T, bool>) {
      v.raw_[0] = std::byte{x ? std::uint8_t{1} : std::uint8_t{0}};
    } else {
      std::memcpy(v.raw_.data(), &x, sizeof(T));
    }
    return v;
  }
  static value of(std::string s) {
    value v(value_type::string);
    v.string_ = std::move(s);
    return v;
  }
  static value of(std::string_view s) { return of(std::string(s)); }
  static value of(const char* s) { return of(std::string(s)); }

  template <class T>
  static value array_of(const std::vector<T>& xs) {
    value v = empty_array(detail::scalar_type_of<T>::type, xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const value e = of(static_cast<T>(xs[i]));
      std::memcpy(v.raw_.data() + i * sizeof(T), e.raw_.data(), sizeof(T));
    }
    return v;
  }
  static value array_of(std::vector<std::string> xs) {
    value v = empty_array(value_type::string, xs.size());
    v.strings_ = std::move(xs);
    return v;
  }
  // An array whose elements are arrays (each may have its own element type).
  static value array_of_arrays(std::vector<value> items) {
    for (const value& item : items) {
      check(item.is_array(), "gguf::value::array_of_arrays: element is a ",
            item.type_name(), ", not an array");
    }
    value v = empty_array(value_type::array, items.size());
    v.arrays_ = std::move(items);
    return v;
  }

  // ---- inspection ----
  value_type type() const noexcept { return type_; }
  bool is_array() const noexcept { return type_ == value_type::array; }
  bool is_string() const noexcept { return type_ == value_type::string; }
  bool is_integer() const noexcept { return is_integer_type(type_); }
  bool is_float() const noexcept { return is_float_type(type_); }
  bool is_bool() const noexcept { return type_ == value_type::boolean; }

  // "uint32", "string", "array[float32]", "array[array]".
  std::string type_name() const {
    if (!is_array()) return std::string(value_type_name(type_));
    return detail::concat("array[", value_type_name(element_type_), "]");
  }

  // Scalar accessors; they return nullopt / nullptr when the value holds another type.
  std::optional<std::int64_t> as_int() const noexcept {  // any integer type that fits int64
    return is_integer() ? detail::load_int(type_, raw_.data()) : std::nullopt;
  }
  std::optional<std::uint64_t> as_uint() const noexcept {  // any non-negative integer
    if (type_ == value_type::uint64) return detail::load<std::uint64_t>(raw_.data());
    const auto i = as_int();
    if (!i || *i < 0) return {};
    return static_cast<std::uint64_t>(*i);
  }
  std::optional<double> as_float() const noexcept {  // floats and integers
    return (is_float() || is_integer()) ? detail::load_float(type_, raw_.data()) : std::nullopt;
  }
  std::optional<bool> as_bool() const noexcept {
    if (!is_bool()) return {};
    return raw_[0] != std::byte{0};
  }
  const std::string* as_string() const noexcept { return is_string() ? &string_ : nullptr; }

  // ---- arrays ----
  value_type element_type() const {
    check(is_array(), "gguf::value: element_type() on a ", type_name(), ", not an array");
    return element_type_;
  }
  std::size_t size() const noexcept { return count_; }  // element count; 0 for non-arrays

  // Element i as a standalone value (a copy).
  value at(std::size_t i) const {
    check(is_array(), "gguf::value: at() on a ", type_name(), ", not an array");
    check(i < count_, "gguf::value: index ", i, " out of range for an array of ", count_);
    if (element_type_ == value_type::string) return of(strings_[i]);
    if (element_type_ == value_type::array) return arrays_[i];
    const std::size_t n = scalar_size(element_type_);
    value v(element_type_);
    v.raw_.assign(raw_.begin() + static_cast<std::ptrdiff_t>(i * n),
                  raw_.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
    return v;
  }
  // The elements of an array of strings / of arrays; throws for other values.
  const std::vector<std::string>& strings() const {
    check(is_array() && element_type_ == value_type::string, "gguf::value: strings() on a ",
          type_name());
    return strings_;
  }
  const std::vector<value>& arrays() const {
    check(is_array() && element_type_ == value_type::array, "gguf::value: arrays() on a ",
          type_name());
    return arrays_;
  }
  // Integer arrays as int64 (nullopt if not an integer array or an element exceeds int64).
  std::optional<std::vector<std::int64_t>> to_int_array() const {
    if (!is_array() || !is_integer_type(element_type_)) return {};
    std::vector<std::int64_t> out(count_);
    const std::size_t n = scalar_size(element_type_);
    for (std::size_t i = 0; i < count_; ++i) {
      const auto x = detail::load_int(element_type_, raw_.data() + i * n);
      if (!x) return {};
      out[i] = *x;
    }
    return out;
  }
  // Float or integer arrays as double (nullopt for other values).
  std::optional<std::vector<double>> to_float_array() const {
    const bool numeric = is_float_type(element_type_) || is_integer_type(element_type_);
    if (!is_array() || !numeric) return {};
    std::vector<double> out(count_);
    const std::size_t n = scalar_size(element_type_);
    for (std::size_t i = 0; i < count_; ++i) {
      out[i] = *detail::load_float(element_type_, raw_.data() + i * n);
    }
    return out;
  }

  // The packed little-endian bytes of a scalar or a scalar array (empty otherwise); the writer
  // copies them verbatim.
  std::span<const std::byte> raw() const noexcept { return raw_; }

  // Human-readable rendering for logs and tools; long arrays show their first elements.
  std::string to_string(std::size_t max_elements = 8) const {
    if (is_string()) return detail::concat('"', detail::printable(string_, 64), '"');
    if (is_bool()) return *as_bool() ? "true" : "false";
    if (is_float()) return detail::concat(*as_float());
    if (type_ == value_type::uint64) return detail::concat(*as_uint());
    if (is_integer()) return detail::concat(*as_int());
    std::string out = "[";
    for (std::size_t i = 0; i < count_ && i < max_elements; ++i) {
      if (i > 0) out += ", ";
      out += at(i).to_string(max_elements);
    }
    if (count_ > max_elements) out += detail::concat(", ... (", count_, " elements)");
    out += ']';
    return out;
  }

 private:
  friend class detail::parser;
  explicit value(value_type t) : type_(t) {}

  static value empty_array(value_type element, std::size_t count) {
    value v(value_type::array);
    v.element_type_ = element;
    v.count_ = count;
    v.raw_.resize(scalar_size(element) * count);
    return v;
  }

  value_type type_;
  value_type element_type_ = value_type::uint8;  // arrays only
  std::size_t count_ = 0;                        // arrays only
  std::vector<std::byte> raw_;                   // scalar, or packed scalar-array elements
  std::string string_;                           // string
  std::vector<std::string> strings_;             // array of strings
  std::vector<value> arrays_;                    // array of arrays
};

// ---------------------------------------------------------------------------------------------
// tensor_info and file
// ---------------------------------------------------------------------------------------------

struct tensor_info {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<std::int64_t> dims;  // GGUF order: dims[0] is the fastest-varying (ne0)
  std::uint64_t offset = 0;        // relative to the data section
  const std::byte* data = nullptr; // into the file's bytes; valid while the file lives
  std::size_t nbytes = 0;

  std::int64_t num_elements() const noexcept {
    // Unsigned so a hand-made tensor_info with absurd dims wraps instead of hitting UB; the
    // reader has already rejected dims whose product overflows.
    std::uint64_t n = 1;
    for (std::int64_t d : dims) n *= static_cast<std::uint64_t>(d);
    return static_cast<std::int64_t>(n);
  }
};

class file {
 public:
  // Memory-maps `path` read-only and validates it. Throws zipage::error naming the path.
  static file open(const std::filesystem::path& path);
  // Parses a GGUF image held in memory (tests, embedded models).
  static file from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>");

  file(file&&) noexcept = default;
  file& operator=(file&&) noexcept = default;
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() = default;

  std::uint32_t version() const noexcept { return version_; }
  const std::string& name() const noexcept { return name_; }
  std::uint64_t alignment() const noexcept { return alignment_; }
  std::uint64_t data_offset() const noexcept { return data_offset_; }  // start of tensor data
  std::size_t size_bytes() const noexcept { return bytes_ ? bytes_->size() : 0; }

  // ---- metadata ----
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const value* find(std::string_view key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
  }
  std::vector<std::string> keys() const {  // in file order
    std::vector<std::string> out;
    out.reserve(kvs_.size());
    for (const auto& kv : kvs_) out.push_back(kv.first);
    return out;
  }

  // Typed getters: throw if the key is missing or holds an incompatible type.
  std::string get_string(std::string_view key) const {
    const value& v = require(key);
    if (!v.is_string()) type_error(key, v, "a string");
    return *v.as_string();
  }
  std::int64_t get_int(std::string_view key) const { return int_of(key, require(key)); }
  std::int64_t get_int(std::string_view key, std::int64_t fallback) const {
    const value* v = find(key);
    return v ? int_of(key, *v) : fallback;
  }
  double get_float(std::string_view key) const { return float_of(key, require(key)); }
  double get_float(std::string_view key, double fallback) const {
    const value* v = find(key);
    return v ? float_of(key, *v) : fallback;
  }
  bool get_bool(std::string_view key) const { return bool_of(key, require(key)); }
  bool get_bool(std::string_view key, bool fallback) const {
    const value* v = find(key);
    return v ? bool_of(key, *v) : fallback;
  }
  std::vector<std::string> get_string_array(std::string_view key) const {
    const value& v = require(key);
    if (!v.is_array() || v.element_type() != value_type::string) {
      type_error(key, v, "an array of strings");
    }
    return v.strings();
  }
  std::vector<float> get_float_array(std::string_view key) const {
    const value& v = require(key);
    const auto xs = v.to_float_array();
    if (!xs) type_error(key, v, "an array of numbers");
    return std::vector<float>(xs->begin(), xs->end());
  }
  std::vector<std::int64_t> get_int_array(std::string_view key) const {
    const value& v = require(key);
    if (!v.is_array() || !is_integer_type(v.element_type())) {
      type_error(key, v, "an array of integers");
    }
    auto xs = v.to_int_array();
    check(xs.has_value(), name_, ": metadata '", detail::printable(key),
          "' has a uint64 element too large for int64");
    return std::move(*xs);
  }

  // ---- tensors ----
  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  const tensor_info* find_tensor(std::string_view tensor_name) const {
    const auto it = tensor_index_.find(tensor_name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  const tensor_info& tensor(std::string_view tensor_name) const {
    const tensor_info* t = find_tensor(tensor_name);
    if (t == nullptr) {
      fail(name_, ": missing tensor '", detail::printable(tensor_name), "' (file has ",
           tensors_.size(), " tensors)");
    }
    return *t;
  }
  // Converts an F32 / F16 / BF16 tensor of this file to fp32.
  std::vector<float> to_f32(const tensor_info& t) const;

 private:
  friend class detail::parser;
  file() = default;

  const value& require(std::string_view key) const {
    const value* v = find(key);
    if (v == nullptr) fail(name_, ": missing metadata key '", detail::printable(key), "'");
    return *v;
  }
  [[noreturn]] void type_error(std::string_view key, const value& v, const char* expected) const {
    fail(name_, ": metadata '", detail::printable(key), "' is ", v.type_name(), ", expected ",
         expected);
  }
  std::int64_t int_of(std::string_view key, const value& v) const {
    if (!v.is_integer()) type_error(key, v, "an integer");
    const auto i = v.as_int();
    check(i.has_value(), name_, ": metadata '", detail::printable(key), "' = ", v.to_string(),
          " does not fit in int64");
    return *i;
  }
  double float_of(std::string_view key, const value& v) const {
    const auto x = v.as_float();
    if (!x) type_error(key, v, "a number");
    return *x;
  }
  bool bool_of(std::string_view key, const value& v) const {
    const auto b = v.as_bool();
    if (!b) type_error(key, v, "a bool");
    return *b;
  }
  bool owns(const tensor_info& t) const noexcept;

  std::unique_ptr<zipage::file_bytes> bytes_;
  std::string name_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, value>> kvs_;  // file order
  std::map<std::string, std::size_t, std::less<>> kv_index_;
  std::vector<tensor_info> tensors_;  // file order
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

namespace detail {

inline constexpr std::uint64_t default_alignment = 32;
inline constexpr int max_array_depth = 8;  // real files nest at most 2; this bounds recursion
inline constexpr std::uint32_t max_dims = 4;
// The smallest possible encodings, used to reject impossible counts before allocating:
// a kv is key length + 1-byte key + type + 1-byte value; a tensor info is name length +
// 1-byte name + n_dims + one dim + type + offset.
inline constexpr std::uint64_t min_kv_bytes = 8 + 1 + 4 + 1;
inline constexpr std::uint64_t min_tensor_info_bytes = 8 + 1 + 4 + 8 + 4 + 8;
inline constexpr std::uint64_t min_array_header_bytes = 4 + 8;
inline constexpr std::uint64_t min_string_bytes = 8;

// A bounds-checked read position. `context` ("metadata 'general.name'", "tensor 'x'") is put in
// front of every error so messages say where in the file the problem is.
class cursor {
 public:
  cursor(const std::byte* data, std::size_t size, const std::string& file_name)
      : data_(data), size_(size), file_(file_name) {}

  std::size_t offset() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return size_ - pos_; }
  void set_context(std::string context) { context_ = std::move(context); }

  template <class... Args>
  [[noreturn]] void fail_here(Args&&... args) const {
    if (context_.empty()) fail(file_, ": ", std::forward<Args>(args)...);
    fail(file_, ": ", context_, ": ", std::forward<Args>(args)...);
  }

  void need(std::uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail_here("unexpected end of file at offset ", pos_, " reading ", what, " (need ", n,
                " bytes, ", remaining(), " left; file truncated?)");
    }
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    const T x = load<T>(data_ + pos_);
    pos_ += sizeof(T);
    return x;
  }
  std::span<const std::byte> take(std::uint64_t n, const char* what) {
    need(n, what);
    const std::span<const std::byte> s(data_ + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::string read_string(const char* what) {
    const std::size_t at = pos_;
    const auto length = read<std::uint64_t>(what);
    if (length > remaining()) {
      fail_here(what, " at offset ", at, " claims ", length, " bytes but only ", remaining(),
                " remain in the file");
    }
    const auto bytes = take(length, what);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

 private:
  const std::byte* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& file_;
  std::string context_;
};

inline std::uint64_t align_up(std::uint64_t x, std::uint64_t alignment) noexcept {
  return (x + alignment - 1) / alignment * alignment;
}

// Builds a file from raw bytes; every check lives here.
class parser {
 public:
  parser(file& f) : f_(f), c_(f.bytes_->data(), f.bytes_->size(), f.name_) {}

  void run() {
    const auto [tensor_count, kv_count] = read_header();
    read_metadata(kv_count);
    f_.alignment_ = read_alignment();
    read_tensor_infos(tensor_count);
    f_.data_offset_ = align_up(c_.offset(), f_.alignment_);
    locate_tensor_data();
  }

 private:
  std::pair<std::uint64_t, std::uint64_t> read_header() {
    c_.set_context("header");
    if (c_.remaining() < 4) {
      c_.fail_here("file is too small to be GGUF (", c_.remaining(), " bytes)");
    }
    const auto magic = c_.take(4, "magic");
    if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
      c_.fail_here("not a GGUF file (magic is '",
                   printable(std::string_view(reinterpret_cast<const char*>(magic.data()), 4)),
                   "', expected 'GGUF')");
    }
    f_.version_ = read_version();
    const auto tensor_count = c_.read<std::uint64_t>("tensor count");
    const auto kv_count = c_.read<std::uint64_t>("metadata count");
    // Each count alone is checked first so the sum below cannot overflow.
    const std::uint64_t left = c_.remaining();
    const bool fits = kv_count <= left / min_kv_bytes &&
                      tensor_count <= left / min_tensor_info_bytes &&
                      kv_count * min_kv_bytes + tensor_count * min_tensor_info_bytes <= left;
    if (!fits) {
      c_.fail_here("claims ", tensor_count, " tensors and ", kv_count,
                   " metadata entries, which cannot fit in the ", left,
                   " bytes that follow (file truncated or corrupt)");
    }
    return {tensor_count, kv_count};
  }

  std::uint32_t read_version() {
    const auto version = c_.read<std::uint32_t>("version");
    if (version == 2 || version == 3) return version;
    if (version == 1) {
      c_.fail_here("GGUF version 1 is not supported (only versions 2 and 3; v1 used 32-bit "
                   "counts); re-convert the model with a current llama.cpp");
    }
    // A big-endian file stores 3 as 0x03000000: the low 16 bits are zero.
    if ((version & 0xffffu) == 0 && version != 0) {
      c_.fail_here("looks like a big-endian GGUF file (version field ", version,
                   "), which is not supported");
    }
    c_.fail_here("unsupported GGUF version ", version, " (supported: 2 and 3)");
  }

  void read_metadata(std::uint64_t count) {
    f_.kvs_.reserve(static_cast<std::size_t>(count));  // bounded by the file size above
    for (std::uint64_t i = 0; i < count; ++i) {
      c_.set_context(concat("metadata entry ", i));
      std::string key = c_.read_string("key");
      if (key.empty()) c_.fail_here("empty key");
      c_.set_context(concat("metadata '", printable(key), "'"));
      if (!f_.kv_index_.try_emplace(key, f_.kvs_.size()).second) c_.fail_here("duplicate key");
      const value_type type = read_value_type("value type");
      f_.kvs_.emplace_back(std::move(key), read_value(type, 0));
    }
  }

  value_type read_value_type(const char* what) {
    const auto raw = c_.read<std::uint32_t>(what);
    if (raw > max_value_type) c_.fail_here("invalid ", what, " ", raw);
    return static_cast<value_type>(raw);
  }

  // `depth` counts the arrays enclosing this value.
  value read_value(value_type type, int depth) {
    if (type == value_type::string) return value::of(c_.read_string("string value"));
    if (type == value_type::array) return read_array(depth + 1);
    value v(type);
    const auto bytes = c_.take(scalar_size(type), "value");
    v.raw_.assign(bytes.begin(), bytes.end());
    check_bools(v);
    return v;
  }

  value read_array(int depth) {
    if (depth > max_array_depth) c_.fail_here("arrays nested more than ", max_array_depth, " deep");
    const value_type element = read_value_type("array element type");
    const auto count = c_.read<std::uint64_t>("array length");
    const std::uint64_t min_element_bytes = element == value_type::string  ? min_string_bytes
                                            : element == value_type::array ? min_array_header_bytes
                                                                           : scalar_size(element);
    // Checked before anything is allocated, so a forged count cannot exhaust memory.
    if (count > c_.remaining() / min_element_bytes) {
      c_.fail_here("array of ", count, " ", value_type_name(element),
                   " elements cannot fit in the ", c_.remaining(), " bytes left in the file");
    }
    value v = value::empty_array(element, static_cast<std::size_t>(count));
    if (element == value_type::string) {
      v.strings_.reserve(static_cast<std::size_t>(count));
      for (std::uint64_t i = 0; i < count; ++i) {
        v.strings_.push_back(c_.read_string("array string"));
      }
    } else if (element == value_type::array) {
      // No reserve: a nested value is far larger than its 12-byte minimum encoding.
      for (std::uint64_t i = 0; i < count; ++i) v.arrays_.push_back(read_array(depth + 1));
    } else {
      const auto bytes = c_.take(count * scalar_size(element), "array elements");
      // Skipped when empty: memcpy must not be given the null data() of an empty vector.
      if (!bytes.empty()) std::memcpy(v.raw_.data(), bytes.data(), bytes.size());
      check_bools(v);
    }
    return v;
  }

  // A GGUF bool is one byte; anything but 0 or 1 means the file is corrupt.
  void check_bools(const value& v) const {
    const bool is_bool = v.type_ == value_type::boolean ||
                         (v.type_ == value_type::array && v.element_type_ == value_type::boolean);
    if (!is_bool) return;
    for (std::byte b : v.raw_) {
      if (b != std::byte{0} && b != std::byte{1}) {
        c_.fail_here("bool value ", static_cast<int>(b), " is neither 0 nor 1");
      }
    }
  }

  std::uint64_t read_alignment() {
    c_.set_context("metadata 'general.alignment'");
    const value* v = f_.find("general.alignment");
    if (v == nullptr) return default_alignment;
    if (!v->is_integer()) c_.fail_here("must be an integer, not ", v->type_name());
    const auto a = v->as_uint();
    // The limit keeps align_up() far from overflow; real files use 32.
    if (!a || !std::has_single_bit(*a) || *a > (std::uint64_t{1} << 30)) {
      c_.fail_here("must be a power of two between 1 and 2^30, got ", v->to_string());
    }
    return *a;
  }

  void read_tensor_infos(std::uint64_t count) {
    f_.tensors_.reserve(static_cast<std::size_t>(count));  // bounded by the file size above
    for (std::uint64_t i = 0; i < count; ++i) {
      c_.set_context(concat("tensor info ", i));
      tensor_info t;
      t.name = c_.read_string("tensor name");
      if (t.name.empty()) c_.fail_here("empty tensor name");
      c_.set_context(concat("tensor '", printable(t.name), "'"));
      read_dims(t);
      t.type = read_tensor_type();
      t.offset = c_.read<std::uint64_t>("data offset");
      t.nbytes = checked_nbytes(t);
      if (!f_.tensor_index_.try_emplace(t.name, f_.tensors_.size()).second) {
        c_.fail_here("duplicate tensor name");
      }
      f_.tensors_.push_back(std::move(t));
    }
  }

  void read_dims(tensor_info& t) {
    const auto n_dims = c_.read<std::uint32_t>("dimension count");
    if (n_dims == 0 || n_dims > max_dims) {
      c_.fail_here("has ", n_dims, " dimensions (must be 1 to ", max_dims, ")");
    }
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto raw = c_.read<std::uint64_t>("dimension");
      // Printed as signed so a forged 2^64-1 shows as -1.
      const auto dim = static_cast<std::int64_t>(raw);
      if (dim <= 0) c_.fail_here("dimension ", d, " is ", dim, " (must be positive)");
      t.dims.push_back(dim);
    }
  }

  tensor_type read_tensor_type() {
    const auto raw = c_.read<std::uint32_t>("tensor type");
    if (!is_supported_tensor_type(raw)) {
      c_.fail_here("type ", tensor_type_name(raw), " (", raw,
                   ") is not supported (zipage loads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                   "Q2_K-Q6_K, IQ4_NL and IQ4_XS; re-quantise the model to one of them, or convert it "
                   "with --outtype f16)");
    }
    return static_cast<tensor_type>(raw);
  }

  std::size_t checked_nbytes(const tensor_info& t) const {
    constexpr auto max_elements = std::numeric_limits<std::int64_t>::max();
    std::int64_t n = 1;
    for (std::int64_t d : t.dims) {
      if (n > max_elements / d) {
        c_.fail_here("element count of dims ", dims_string(t), " overflows");
      }
      n *= d;
    }
    // A quantised row is whole blocks, as in ggml: its length (dims[0]) is a multiple of the block.
    const block_format f = format_of(t.type);
    if (t.dims[0] % f.elements != 0) {
      c_.fail_here("type ", tensor_type_name(t.type), " stores rows in blocks of ", f.elements,
                   " values, but its rows (dimension 0) are ", t.dims[0], " long");
    }
    const auto blocks = static_cast<std::uint64_t>(n / f.elements);
    if (blocks > std::numeric_limits<std::size_t>::max() / f.bytes) {
      c_.fail_here("byte size of ", blocks, f.elements == 1 ? " elements" : " blocks", " x ", f.bytes,
                   " bytes overflows");
    }
    return static_cast<std::size_t>(blocks) * f.bytes;
  }

  static std::string dims_string(const tensor_info& t) {
    std::string s = "{";
    for (std::size_t i = 0; i < t.dims.size(); ++i) {
      if (i > 0) s += ", ";
      s += std::to_string(t.dims[i]);
    }
    s += '}';
    return s;
  }

  // Points every tensor into the data section after checking alignment and bounds.
  void locate_tensor_data() {
    const std::uint64_t size = f_.bytes_->size();
    const std::uint64_t start = f_.data_offset_;
    const std::uint64_t available = start <= size ? size - start : 0;
    for (tensor_info& t : f_.tensors_) {
      c_.set_context(concat("tensor '", printable(t.name), "'"));
      if (t.offset % f_.alignment_ != 0) {
        c_.fail_here("data offset ", t.offset, " is not a multiple of the alignment (",
                     f_.alignment_, ")");
      }
      if (t.offset > available || t.nbytes > available - t.offset) {
        c_.fail_here("data [offset ", t.offset, ", ", t.nbytes,
                     " bytes] runs past the end of the file (data section starts at ", start,
                     ", file size ", size, ")");
      }
      t.data = f_.bytes_->data() + start + t.offset;
    }
  }

  file& f_;
  cursor c_;
};


}  // namespace detail

inline file file::open(const std::filesystem::path& path) {
  file f;
  f.name_ = path.string();
  f.bytes_ = zipage::map_file(path, "GGUF file");
  detail::parser(f).run();
  return f;
}

inline file file::from_bytes(std::vector<std::byte> bytes, std::string name) {
  file f;
  f.name_ = std::move(name);
  f.bytes_ = std::make_unique<zipage::file_bytes>(std::move(bytes));
  detail::parser(f).run();
  return f;
}

// True when t's data lies inside this file's bytes (a tensor_info from another file does not).
inline bool file::owns(const tensor_info& t) const noexcept {
  if (!bytes_ || t.data == nullptr) return false;
  // std::less gives a total order even for pointers into different objects.
  const std::less<const std::byte*> before;
  const std::byte* begin = bytes_->data();
  const std::byte* end = begin + bytes_->size();
  if (before(t.data, begin) || before(end, t.data)) return false;
  return t.nbytes <= static_cast<std::size_t>(end - t.data);
}

inline std::vector<float> file::to_f32(const tensor_info& t) const {
  check(owns(t), name_, ": tensor '", detail::printable(t.name),
        "' does not point into this file's data");
  const std::optional<block_format> f = format_of(static_cast<std::uint32_t>(t.type));
  check(f.has_value(), name_, ": tensor '", detail::printable(t.name), "' has unsupported type ",
        static_cast<std::uint32_t>(t.type));
  const std::size_t blocks = t.nbytes / f->bytes;
  const std::size_t n = blocks * static_cast<std::size_t>(f->elements);
  check(t.num_elements() >= 0 && static_cast<std::size_t>(t.num_elements()) == n &&
            blocks * f->bytes == t.nbytes,
        name_, ": tensor '", detail::printable(t.name), "' byte size ", t.nbytes,
        " does not match its dims and type");
  std::vector<float> out(n);
  if (is_quantized(t.type)) {
    dequantize_blocks(t.type, t.data, static_cast<std::int64_t>(blocks), out.data());
    return out;
  }
  switch (t.type) {
    case tensor_type::f32:
      std::memcpy(out.data(), t.data, t.nbytes);  // memcpy: data may be unaligned (alignment 1)
      break;
    case tensor_type::f16:
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = fp16_to_f32(detail::load<std::uint16_t>(t.data + 2 * i));
      }
      break;
    case tensor_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = bf16_to_f32(detail::load<std::uint16_t>(t.data + 2 * i));
      }
      break;
    default:
      fail(name_, ": tensor '", detail::printable(t.name), "' has unsupported type ",
           static_cast<std::uint32_t>(t.type));
  }
  return out;
}

}  // namespace zipage::gguf

namespace zipage {

// True when a GGUF file's vocabulary is byte-level BPE (tokenizer.ggml.model = gpt2: Qwen, Llama 3), read by
// bpe_tokenizer::from_gguf; false for SentencePiece (llama), read by spm_tokenizer::from_gguf.
inline bool gguf_has_bpe_vocab(const gguf::file& f) {
  return f.has("tokenizer.ggml.model") && f.get_string("tokenizer.ggml.model") == "gpt2";
}

}  // namespace zipage
