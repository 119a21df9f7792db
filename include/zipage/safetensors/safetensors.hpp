#pragma once
// safetensors reader: memory-maps .safetensors files (one, or the shards of a sharded checkpoint listed
// by model.safetensors.index.json), validates every header field, and exposes the tensors. Any malformed
// input becomes a zipage::error naming the file (and the tensor); nothing is read outside the file.
//
// Layout of one file:
//   u64 N (little-endian) | N bytes of UTF-8 JSON header | data section
//   header: { "__metadata__": {str: str} (optional),
//             "<name>": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ... }
// Offsets are relative to the data section. As the format requires, the tensors cover the data section
// exactly: no overlaps, no holes, nothing after the last one.
//
// Every dtype the format names is accepted in the header (so a checkpoint carrying, say, an I64 buffer
// opens), but only F32, F16 and BF16 convert to floats: to_f32 refuses the others, naming the dtype.
// F8_E4M3 tensors (FP8 checkpoints: codes that mean nothing without their block scales) are read as raw
// codes by fp8_e4m3_codes(), with the same bounds checks; models/hf_fp8.hpp dequantises them.
// Sub-byte dtypes (F4, F6_*) and unknown names are refused on open.
//
//   auto ckpt = zipage::safetensors::checkpoint::open("Qwen3-0.6B/");   // dir, index.json or .safetensors
//   const auto& t = ckpt.tensor("model.embed_tokens.weight");           // throws naming it if absent
//   std::vector<float> w = ckpt.to_f32(t);
//
// Header-only and CUDA-free.
#include <algorithm>
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
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/core/half.hpp"
#include "zipage/core/mapped_file.hpp"


namespace zipage::safetensors {

static_assert(std::endian::native == std::endian::little, "zipage::safetensors supports little-endian hosts only");

// ---------------------------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------------------------

enum class dtype : std::uint8_t {
  boolean, u8, i8, f8_e5m2, f8_e4m3, f8_e8m0, i16, u16, f16, bf16, i32, u32, f32, c64, f64, i64, u64
};

struct dtype_desc {
  std::string_view name;
  dtype type;
  std::size_t size;  // bytes per element
};

inline constexpr std::array<dtype_desc, 17> dtypes = {{
    {"BOOL", dtype::boolean, 1}, {"U8", dtype::u8, 1},         {"I8", dtype::i8, 1},
    {"F8_E5M2", dtype::f8_e5m2, 1}, {"F8_E4M3", dtype::f8_e4m3, 1}, {"F8_E8M0", dtype::f8_e8m0, 1},
    {"I16", dtype::i16, 2},      {"U16", dtype::u16, 2},       {"F16", dtype::f16, 2},
    {"BF16", dtype::bf16, 2},    {"I32", dtype::i32, 4},       {"U32", dtype::u32, 4},
    {"F32", dtype::f32, 4},      {"C64", dtype::c64, 8},       {"F64", dtype::f64, 8},
    {"I64", dtype::i64, 8},      {"U64", dtype::u64, 8},
}};

inline const dtype_desc& describe(dtype t) noexcept { return dtypes[static_cast<std::size_t>(t)]; }
inline std::string_view dtype_name(dtype t) noexcept { return describe(t).name; }
inline std::size_t dtype_size(dtype t) noexcept { return describe(t).size; }
// The dtypes to_f32 converts.
inline bool is_loadable(dtype t) noexcept { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

// ---------------------------------------------------------------------------------------------
// tensor_info
// ---------------------------------------------------------------------------------------------

struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;   // outermost first (row-major, as PyTorch)
  std::uint64_t offset = 0;          // start, relative to the data section
  std::size_t nbytes = 0;
  const std::byte* data = nullptr;   // into the mapped file
  const std::string* file = nullptr; // name of the file holding it (owned by that file)

  [[nodiscard]] std::int64_t num_elements() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;  // validated not to overflow on open
    return n;
  }
  [[nodiscard]] std::string shape_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

namespace detail {

using json::printable;

inline constexpr std::uint64_t max_header_bytes = 100'000'000;  // the format's own limit
inline constexpr std::size_t max_dims = 8;

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// file: one .safetensors file
// ---------------------------------------------------------------------------------------------

class file {
 public:
  static file open(const std::filesystem::path& path) {
    file f;
    f.name_ = std::make_unique<std::string>(path.string());
    f.bytes_ = zipage::map_file(path, "safetensors file");
    f.parse();
    return f;
  }
  // For tests and in-memory data; `name` is used in error messages.
  static file from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
    file f;
    f.name_ = std::make_unique<std::string>(std::move(name));
    f.bytes_ = std::make_unique<zipage::file_bytes>(std::move(bytes));
    f.parse();
    return f;
  }

  [[nodiscard]] const std::string& name() const noexcept { return *name_; }
  // In data-section order.
  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }

  [[nodiscard]] const tensor_info* find(std::string_view tensor_name) const {
    const auto it = index_.find(std::string(tensor_name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  [[nodiscard]] const tensor_info& tensor(std::string_view tensor_name) const {
    const tensor_info* t = find(tensor_name);
    check(t != nullptr, name(), ": no tensor named '", printable(tensor_name), "'");
    return *t;
  }

  // True when t's data lies inside this file's bytes.
  [[nodiscard]] bool owns(const tensor_info& t) const noexcept {
    if (!bytes_ || t.data == nullptr) return t.nbytes == 0 && t.file == name_.get();
    const std::less<const std::byte*> before;
    const std::byte* begin = bytes_->data();
    const std::byte* end = begin + bytes_->size();
    if (before(t.data, begin) || before(end, t.data)) return false;
    return t.nbytes <= static_cast<std::size_t>(end - t.data);
  }

  // The tensor's values as fp32, written to `out` (which must hold exactly num_elements() floats).
  void to_f32(const tensor_info& t, std::span<float> out) const {
    check(owns(t), name(), ": tensor '", printable(t.name), "' does not point into this file's data");
    check(is_loadable(t.type), name(), ": tensor '", printable(t.name), "' has dtype ", dtype_name(t.type),
          ", which zipage cannot load (supported: F32, F16, BF16",
          t.type == dtype::f8_e4m3 ? "; F8_E4M3 weights load with their _scale_inv in an FP8 checkpoint)" : ")");
    const std::size_t n = t.nbytes / dtype_size(t.type);
    check(static_cast<std::size_t>(t.num_elements()) == n && out.size() == n, name(), ": tensor '", printable(t.name),
          "': ", out.size(), " output floats for ", n, " elements");
    if (n == 0) return;
    switch (t.type) {
      case dtype::f32: std::memcpy(out.data(), t.data, t.nbytes); break;  // memcpy: data may be unaligned
      case dtype::f16:
        for (std::size_t i = 0; i < n; ++i) out[i] = zipage::fp16_to_f32(load_u16(t.data + 2 * i));
        break;
      default:  // bf16
        for (std::size_t i = 0; i < n; ++i) out[i] = zipage::bf16_to_f32(load_u16(t.data + 2 * i));
        break;
    }
  }
  // The E4M3 codes of an F8_E4M3 tensor (1 byte each, num_elements() of them), pointing into the file.
  [[nodiscard]] std::span<const std::uint8_t> fp8_e4m3_codes(const tensor_info& t) const {
    check(owns(t), name(), ": tensor '", printable(t.name), "' does not point into this file's data");
    check(t.type == dtype::f8_e4m3, name(), ": tensor '", printable(t.name), "' has dtype ", dtype_name(t.type),
          ", not F8_E4M3");
    check(static_cast<std::size_t>(t.num_elements()) == t.nbytes, name(), ": tensor '", printable(t.name), "': ",
          t.nbytes, " bytes for ", t.num_elements(), " F8_E4M3 elements");
    return {reinterpret_cast<const std::uint8_t*>(t.data), t.nbytes};
  }
  [[nodiscard]] std::vector<float> to_f32(const tensor_info& t) const {
    check(owns(t), name(), ": tensor '", printable(t.name), "' does not point into this file's data");
    std::vector<float> out(is_loadable(t.type) ? t.nbytes / dtype_size(t.type) : 0);
    to_f32(t, out);
    return out;
  }

 private:
  using json_value = json::value;
  static std::string printable(std::string_view s) { return detail::printable(s); }
  static std::uint16_t load_u16(const std::byte* p) noexcept {
    std::uint16_t x;
    std::memcpy(&x, p, 2);
    return x;
  }

  void parse() {
    const std::uint64_t size = bytes_->size();
    check(size >= 8, name(), ": ", size, " bytes is too small for a safetensors file (it starts with an 8-byte header length)");
    std::uint64_t header_len = 0;
    std::memcpy(&header_len, bytes_->data(), 8);
    check(header_len <= size - 8, name(), ": header length ", header_len, " runs past the end of the file (",
          size, " bytes)");
    check(header_len <= detail::max_header_bytes, name(), ": header length ", header_len, " exceeds the limit of ",
          detail::max_header_bytes, " bytes");
    check(header_len >= 2, name(), ": header length ", header_len, " is too small for a JSON object");
    data_offset_ = 8 + header_len;
    const std::string_view text(reinterpret_cast<const char*>(bytes_->data()) + 8, static_cast<std::size_t>(header_len));
    const std::uint64_t data_size = size - data_offset_;
    json::read_document(text, name() + " header", [&](const json_value& header) {
      check(header.is_object(), name(), ": the header must be a JSON object, got ", json::type_name(header));
      tensors_.reserve(header.size());
      for (const auto& [key, entry] : header.items()) {
        if (key == "__metadata__") {
          read_metadata(entry);
          continue;
        }
        tensors_.push_back(read_tensor(key, entry, data_size));
      }
    });
    check_coverage(data_size);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      index_.emplace(tensors_[i].name, i);  // names are unique: JSON keys, duplicates refused by json::parse
      tensor_info& t = tensors_[i];
      t.file = name_.get();
      t.data = t.nbytes == 0 ? nullptr : bytes_->data() + data_offset_ + t.offset;
    }
  }

  void read_metadata(const json_value& m) {
    check(m.is_object(), name(), ": __metadata__ must be an object of strings, got ", json::type_name(m));
    for (const auto& [k, v] : m.items()) {
      check(v.is_string(), name(), ": __metadata__ entry '", printable(k), "' must be a string, got ",
            json::type_name(v));
      metadata_.emplace(k, v.get<std::string>());
    }
  }

  tensor_info read_tensor(const std::string& key, const json_value& entry, std::uint64_t data_size) const {
    const std::string where = name() + ": tensor '" + printable(key) + "'";
    check(!key.empty(), name(), ": empty tensor name");
    check(entry.is_object(), where, " must be an object, got ", json::type_name(entry));
    for (const auto& [field, v] : entry.items()) {
      check(field == "dtype" || field == "shape" || field == "data_offsets", where, ": unknown field '",
            printable(field), "'");
    }
    tensor_info t;
    t.name = key;
    t.type = read_dtype(entry, where);
    read_shape(entry, where, t);
    const auto offsets = entry.find("data_offsets");
    check(offsets != entry.end(), where, ": missing field 'data_offsets'");
    check(offsets->is_array() && offsets->size() == 2, where, ": data_offsets must be [begin, end], got ",
          printable(offsets->dump()));
    const auto begin = json::as_int((*offsets)[0], where, "data_offsets[0]", 0);
    const auto end = json::as_int((*offsets)[1], where, "data_offsets[1]", 0);
    check(begin <= end, where, ": data_offsets [", begin, ", ", end, "] end before they begin");
    check(static_cast<std::uint64_t>(end) <= data_size, where, ": data_offsets [", begin, ", ", end,
          "] run past the data section of ", data_size, " bytes");
    t.offset = static_cast<std::uint64_t>(begin);
    t.nbytes = static_cast<std::size_t>(end - begin);
    const std::uint64_t expected = static_cast<std::uint64_t>(t.num_elements()) * dtype_size(t.type);
    check(expected == t.nbytes, where, ": data_offsets [", begin, ", ", end, "] hold ", t.nbytes,
          " bytes, but shape ", t.shape_string(), " of ", dtype_name(t.type), " needs ", expected);
    return t;
  }

  static dtype read_dtype(const json_value& entry, const std::string& where) {
    const auto it = entry.find("dtype");
    check(it != entry.end(), where, ": missing field 'dtype'");
    check(it->is_string(), where, ": dtype must be a string, got ", json::type_name(*it));
    const auto& s = it->get_ref<const std::string&>();
    for (const auto& d : dtypes)
      if (d.name == s) return d.type;
    if (s == "F4" || s.starts_with("F6_"))
      fail(where, ": dtype ", printable(s), " (sub-byte) is not supported (zipage loads F32, F16, BF16)");
    fail(where, ": unknown dtype '", printable(s), "'");
  }

  static void read_shape(const json_value& entry, const std::string& where, tensor_info& t) {
    const auto it = entry.find("shape");
    check(it != entry.end(), where, ": missing field 'shape'");
    check(it->is_array(), where, ": shape must be an array, got ", json::type_name(*it));
    check(it->size() <= detail::max_dims, where, ": shape has ", it->size(), " dimensions (at most ",
          detail::max_dims, ")");
    // Element count and byte size checked against overflow: at most the file size is plausible anyway.
    constexpr auto limit = std::numeric_limits<std::int64_t>::max() / 8;
    std::int64_t n = 1;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto d = json::as_int((*it)[i], where, "shape[" + std::to_string(i) + "]", 0);
      t.shape.push_back(d);
      check(d == 0 || n <= limit / d, where, ": shape ", printable((*it).dump()), " has too many elements");
      n *= d;
    }
  }

  // The tensors must tile the data section: sorted by offset, each starts where the previous ends.
  void check_coverage(std::uint64_t data_size) const {
    std::vector<const tensor_info*> order;
    order.reserve(tensors_.size());
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const tensor_info* a, const tensor_info* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
    });
    std::uint64_t covered = 0;
    const tensor_info* prev = nullptr;
    for (const tensor_info* t : order) {
      check(t->offset >= covered, name(), ": tensor '", printable(t->name), "' (bytes [", t->offset, ", ",
            t->offset + t->nbytes, ")) overlaps tensor '", prev ? printable(prev->name) : std::string(), "'");
      check(t->offset == covered, name(), ": bytes [", covered, ", ", t->offset,
            ") of the data section belong to no tensor");
      covered = t->offset + t->nbytes;
      if (t->nbytes > 0) prev = t;
    }
    check(covered == data_size, name(), ": the data section has ", data_size - covered,
          " bytes after the last tensor (", data_size, " bytes, tensors cover ", covered, ")");
  }

  std::unique_ptr<std::string> name_;  // stable address: tensor_info::file points at it
  std::unique_ptr<zipage::file_bytes> bytes_;
  std::uint64_t data_offset_ = 0;
  std::vector<tensor_info> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// ---------------------------------------------------------------------------------------------
// checkpoint: a model's tensors, in one file or sharded
// ---------------------------------------------------------------------------------------------

class checkpoint {
 public:
  static constexpr std::string_view index_name = "model.safetensors.index.json";
  static constexpr std::string_view single_name = "model.safetensors";

  // `path` is a directory (holding model.safetensors.index.json or model.safetensors), an index .json
  // file, or a .safetensors file.
  static checkpoint open(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      if (std::filesystem::exists(path / index_name, ec)) return open_index(path / index_name);
      if (std::filesystem::exists(path / single_name, ec)) return from_file(file::open(path / single_name));
      fail("'", path.string(), "' holds neither ", index_name, " nor ", single_name);
    }
    check(std::filesystem::exists(path, ec), "cannot open checkpoint '", path.string(), "': no such file or directory");
    if (path.extension() == ".json") return open_index(path);
    return from_file(file::open(path));
  }

  // Reads a sharded checkpoint's index: {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}}.
  // Every shard named is opened once; every tensor named must be in its shard; a tensor may not be in two
  // shards. Shards are named relative to the index and may not leave its directory.
  static checkpoint open_index(const std::filesystem::path& index_path) {
    const std::string where = index_path.string();
    const json::value index = json::parse_file(index_path, "safetensors index");
    check(index.is_object(), where, ": must be a JSON object, got ", json::type_name(index));
    const json::value& map = json::require(index, "weight_map", where);
    check(map.is_object(), where, ": weight_map must be an object, got ", json::type_name(map));
    check(!map.empty(), where, ": weight_map is empty");
    std::vector<std::string> shard_names;
    std::map<std::string, std::size_t> shard_of_name;
    std::vector<std::pair<std::string, std::size_t>> expected;  // tensor, shard
    for (const auto& [tensor_name, shard] : map.items()) {
      check(shard.is_string(), where, ": weight_map['", detail::printable(tensor_name), "'] must be a file name, got ",
            json::type_name(shard));
      const auto& s = shard.get_ref<const std::string&>();
      check(valid_shard_name(s), where, ": weight_map['", detail::printable(tensor_name), "'] = '",
            detail::printable(s), "' is not a file name in the index's directory");
      auto [it, inserted] = shard_of_name.try_emplace(s, shard_names.size());
      if (inserted) shard_names.push_back(s);
      expected.emplace_back(tensor_name, it->second);
    }
    std::vector<file> shards;
    shards.reserve(shard_names.size());
    for (const auto& s : shard_names) shards.push_back(file::open(index_path.parent_path() / s));
    checkpoint c = from_files(std::move(shards));
    for (const auto& [tensor_name, shard] : expected) {
      check(c.files_[shard].find(tensor_name) != nullptr, where, ": weight_map puts tensor '",
            detail::printable(tensor_name), "' in ", c.files_[shard].name(), ", which has no such tensor");
    }
    return c;
  }

  static checkpoint from_file(file f) {
    std::vector<file> files;
    files.push_back(std::move(f));
    return from_files(std::move(files));
  }

  // Joins already opened files; a tensor name may appear in one of them only.
  static checkpoint from_files(std::vector<file> files) {
    checkpoint c;
    c.files_ = std::move(files);
    for (std::size_t f = 0; f < c.files_.size(); ++f) {
      for (const tensor_info& t : c.files_[f].tensors()) {
        const auto [it, inserted] = c.index_.try_emplace(t.name, &t);
        check(inserted, "tensor '", detail::printable(t.name), "' is in both ", *it->second->file, " and ",
              c.files_[f].name());
      }
    }
    return c;
  }

  [[nodiscard]] const std::vector<file>& files() const noexcept { return files_; }
  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }

  // Every tensor, sorted by name.
  [[nodiscard]] std::vector<const tensor_info*> tensors() const {
    std::vector<const tensor_info*> out;
    out.reserve(index_.size());
    for (const auto& [name, t] : index_) out.push_back(t);
    return out;
  }
  [[nodiscard]] const tensor_info* find(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second;
  }
  [[nodiscard]] const tensor_info& tensor(std::string_view name) const {
    const tensor_info* t = find(name);
    check(t != nullptr, describe(), ": no tensor named '", detail::printable(name), "'");
    return *t;
  }
  void to_f32(const tensor_info& t, std::span<float> out) const { owner(t).to_f32(t, out); }
  [[nodiscard]] std::span<const std::uint8_t> fp8_e4m3_codes(const tensor_info& t) const {
    return owner(t).fp8_e4m3_codes(t);
  }
  [[nodiscard]] std::vector<float> to_f32(const tensor_info& t) const { return owner(t).to_f32(t); }

  // "model.safetensors" or "model-00001-of-00002.safetensors (+1 more)" for messages.
  [[nodiscard]] std::string describe() const {
    if (files_.empty()) return "<empty checkpoint>";
    std::string s = files_.front().name();
    if (files_.size() > 1) s += " (+" + std::to_string(files_.size() - 1) + " more shards)";
    return s;
  }

 private:
  static bool valid_shard_name(std::string_view s) {
    if (s.empty() || s.front() == '/' || s.find('\\') != std::string_view::npos) return false;
    const std::filesystem::path p{std::string(s)};
    for (const auto& part : p)
      if (part == ".." || part == ".") return false;
    return !p.has_root_path();
  }

  const file& owner(const tensor_info& t) const {
    for (const file& f : files_)
      if (t.file == &f.name() && f.owns(t)) return f;
    fail(describe(), ": tensor '", detail::printable(t.name), "' does not belong to this checkpoint");
  }

  std::vector<file> files_;
  std::map<std::string, const tensor_info*, std::less<>> index_;
};

}  // namespace zipage::safetensors
