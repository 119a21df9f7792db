#pragma once
// Strict JSON for the Hugging Face file readers (safetensors headers, config.json, tokenizer.json):
// nlohmann-json underneath, plus what a reader of untrusted files needs on top of it —
//   * syntax errors, duplicate object keys (nlohmann would silently keep the last) and nesting deeper
//     than a limit become zipage::error naming the file;
//   * typed field accessors whose errors name the file and the field;
//   * read_document() / read_document_file(): parse, then run a reader over the document under interpret(), so
//     that a nlohmann type or range error its named checks missed is still a zipage::error naming the file, not
//     an exception the caller does not expect.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/printable.hpp"

namespace zipage::json {

using value = nlohmann::json;

inline constexpr int default_max_depth = 64;

// Cuts an untrusted string to a readable length for error messages.
// (Valid UTF-8 stays readable, other bytes read as \xNN: core/printable.hpp.)
inline std::string printable(std::string_view s, std::size_t max_chars = 96) {
  return zipage::detail::printable_text(s, max_chars);
}

// Parses `text` into a Json (nlohmann::json, or nlohmann::ordered_json where the order of keys matters);
// `source` names it in errors ("config.json", "model.safetensors header").
template <class Json>
Json parse_as(std::string_view text, std::string_view source, int max_depth = default_max_depth) {
  std::vector<std::unordered_set<std::string>> open_objects;  // keys seen in each enclosing object
  std::string problem;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, Json& parsed) -> bool {
    using ev = nlohmann::json::parse_event_t;
    if ((event == ev::object_start || event == ev::array_start) && depth >= max_depth) {
      problem = "nested more than " + std::to_string(max_depth) + " levels deep";
      throw error(problem);
    }
    if (event == ev::object_start) open_objects.emplace_back();
    if (event == ev::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == ev::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.template get_ref<const std::string&>()).second) {
        problem = "duplicate key '" + printable(parsed.template get_ref<const std::string&>()) + "'";
        throw error(problem);
      }
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": invalid JSON: ", e.what());
  } catch (const error&) {
    fail(source, ": invalid JSON: ", problem);
  }
}
inline value parse(std::string_view text, std::string_view source, int max_depth = default_max_depth) {
  return parse_as<value>(text, source, max_depth);
}

inline std::string read_text_file(const std::filesystem::path& path, std::string_view what,
                                  std::uintmax_t max_bytes = std::uintmax_t{1} << 30) {
  std::error_code ec;
  check(std::filesystem::is_regular_file(path, ec), "cannot read ", what, " '", path.string(), "': ",
        std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec, "cannot read ", what, " '", path.string(), "': ", ec.message());
  check(size <= max_bytes, what, " '", path.string(), "' is ", size, " bytes, more than the ", max_bytes, " allowed");
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open ", what, " '", path.string(), "'");
  std::ostringstream os;
  os << in.rdbuf();
  check(!in.bad(), "cannot read ", what, " '", path.string(), "'");
  return std::move(os).str();
}

inline value parse_file(const std::filesystem::path& path, std::string_view what) {
  return parse(read_text_file(path, what), path.string());
}

// read() (a reader of a parsed document) with any nlohmann::json::exception it lets out turned into a
// zipage::error naming `source`. Readers check each field's type and name it in their own errors; this is the
// net under them: nlohmann throws type_error from get<>() or value() on a member of another type, and one such
// call slipped past the checks once (bpe_tokenizer's value("type", ""), found by fuzzing, docs/robustness.md).
// Its own type, so that the fuzz harnesses can count it as a finding (the net caught what a named check should
// have) while callers catch it as any zipage::error.
class unexpected_json : public error {
 public:
  using error::error;
};
template <class Read>
decltype(auto) interpret(std::string_view source, Read&& read) {
  try {
    return std::forward<Read>(read)();
  } catch (const nlohmann::json::exception& e) {
    throw unexpected_json(zipage::detail::concat(source, ": unexpected JSON content: ", e.what()));
  }
}

// read(document) of `text` (parse's errors, then interpret's net): how the file readers take their documents.
template <class Read>
auto read_document(std::string_view text, std::string_view source, Read&& read) {
  const value doc = parse(text, source);
  return interpret(source, [&] { return read(doc); });
}
template <class Read>
auto read_document_file(const std::filesystem::path& path, std::string_view what, Read&& read) {
  return read_document(read_text_file(path, what), path.string(), std::forward<Read>(read));
}

// "string", "number", "object", ... as nlohmann names them.
inline std::string type_name(const value& v) { return v.type_name(); }

// The member `key` of object `obj`, or nullptr when it is absent or null.
inline const value* find(const value& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline const value& require(const value& obj, std::string_view key, std::string_view source) {
  const value* v = find(obj, key);
  check(v != nullptr, source, ": missing field '", key, "'");
  return *v;
}

// An integer value in [lo, hi]; a float such as 4096.0 or 1e3 is refused (it is not an integer in JSON's
// own terms for these files, and accepting it would hide a broken writer).
inline std::int64_t as_int(const value& v, std::string_view source, std::string_view field,
                           std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                           std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    check(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), source, ": field '", field,
          "' = ", u, " is out of range [", lo, ", ", hi, "]");
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else {
    fail(source, ": field '", field, "' must be an integer, got ", v.is_number() ? v.dump() : type_name(v));
  }
  check(x >= lo && x <= hi, source, ": field '", field, "' = ", x, " is out of range [", lo, ", ", hi, "]");
  return x;
}

inline double as_number(const value& v, std::string_view source, std::string_view field) {
  check(v.is_number(), source, ": field '", field, "' must be a number, got ", type_name(v));
  const double x = v.get<double>();
  check(std::isfinite(x), source, ": field '", field, "' must be finite, got ", x);
  return x;
}

inline bool as_bool(const value& v, std::string_view source, std::string_view field) {
  check(v.is_boolean(), source, ": field '", field, "' must be true or false, got ", type_name(v));
  return v.get<bool>();
}

inline const std::string& as_string(const value& v, std::string_view source, std::string_view field) {
  check(v.is_string(), source, ": field '", field, "' must be a string, got ", type_name(v));
  return v.get_ref<const std::string&>();
}

// Optional fields: the default when absent or null, else the checked value.
inline std::int64_t get_int(const value& obj, std::string_view key, std::string_view source, std::int64_t fallback,
                            std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  const value* v = find(obj, key);
  return v ? as_int(*v, source, key, lo, hi) : fallback;
}
inline double get_number(const value& obj, std::string_view key, std::string_view source, double fallback) {
  const value* v = find(obj, key);
  return v ? as_number(*v, source, key) : fallback;
}
inline bool get_bool(const value& obj, std::string_view key, std::string_view source, bool fallback) {
  const value* v = find(obj, key);
  return v ? as_bool(*v, source, key) : fallback;
}

// For "is this the kind we support?" checks, whose caller names the whole value when the answer is no: the string
// member `key` of `obj`, or "" when `obj` is not an object or the member is absent or not a string. (nlohmann's
// value() throws its own type_error for a member of another type, which would escape as a crash.)
inline std::string_view string_or_empty(const value& obj, std::string_view key) {
  const value* v = find(obj, key);
  return v != nullptr && v->is_string() ? std::string_view(v->get_ref<const std::string&>()) : std::string_view{};
}
// The same for a boolean member: `fallback` when absent, nullopt when present but not a boolean.
inline std::optional<bool> bool_or(const value& obj, std::string_view key, bool fallback) {
  const value* v = find(obj, key);
  if (v == nullptr) return fallback;
  return v->is_boolean() ? std::optional<bool>(v->get<bool>()) : std::nullopt;
}

}  // namespace zipage::json
