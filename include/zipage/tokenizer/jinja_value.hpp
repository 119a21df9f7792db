#pragma once
// The values of zipage's Jinja interpreter (jinja.hpp) and the Python behaviour they copy: str() and repr()
// of None/bools/ints/floats/lists/dicts, Python's truth, equality and ordering, json.dumps as transformers'
// `tojson` filter calls it, and conversion from JSON documents (the conversation, the tools).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/tokenizer/utf8.hpp"

namespace zipage::jinja {

class value;
struct call_args;
using value_list = std::vector<value>;
using native_function = std::function<value(call_args&)>;

// A Python dict: insertion order kept, as json.dumps and iteration see it; keys are strings, numbers,
// booleans or None.
struct value_dict {
  std::vector<std::pair<value, value>> items;
  [[nodiscard]] const value* find(std::string_view key) const;
  [[nodiscard]] const value* find(const std::string& key) const { return find(std::string_view(key)); }
  [[nodiscard]] const value* find(const char* key) const { return find(std::string_view(key)); }
  [[nodiscard]] const value* find(const value& key) const;
  void set(value key, value v);
};

// What Python type a sequence value stands for: what len(), indexing, truth and json.dumps allow.
//   generator: what Jinja's map/select/reject/unique/batch/items/reverse filters return (no len, no
//              indexing, always true, not JSON); view: dict.items()/keys()/values() (no indexing, not JSON).
enum class seq_kind : std::uint8_t { list, tuple, generator, view };

class value {
 public:
  enum class kind : std::uint8_t { undefined, none, boolean, integer, number, string, list, dict, function };

  value() = default;  // undefined
  static value none() { return value(kind::none); }
  static value undefined(std::string name = {}) {
    value v;
    if (!name.empty()) v.str_ = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  value(bool b) : kind_(kind::boolean), int_(b) {}
  value(int i) : kind_(kind::integer), int_(i) {}
  value(std::int64_t i) : kind_(kind::integer), int_(i) {}
  value(std::size_t i) : kind_(kind::integer), int_(static_cast<std::int64_t>(i)) {}
  value(double d) : kind_(kind::number), num_(d) {}
  value(std::string s) : kind_(kind::string), str_(std::make_shared<const std::string>(std::move(s))) {}
  value(std::string_view s) : value(std::string(s)) {}
  value(const char* s) : value(std::string(s)) {}
  // A string marked safe (MarkupSafe's Markup: what the safe and escape filters return); `+` with a plain
  // string HTML-escapes the plain one.
  static value markup(std::string s) {
    value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  static value list(value_list items, seq_kind s = seq_kind::list) {
    value v(kind::list);
    v.list_ = std::make_shared<value_list>(std::move(items));
    v.seq_ = s;
    return v;
  }
  // dict.items() / keys() / values(): `type_name` is Python's (dict_items, dict_keys, dict_values).
  static value view(value_list items, std::string type_name) {
    value v = list(std::move(items), seq_kind::view);
    v.str_ = std::make_shared<const std::string>(std::move(type_name));
    return v;
  }
  // A generator whose iteration fails (jinja2's filters are lazy: `true|map(...)` only fails when iterated).
  static value failed_generator(std::string why) {
    value v = list({}, seq_kind::generator);
    v.str_ = std::make_shared<const std::string>(std::move(why));
    return v;
  }
  static value dict(value_dict d = {}, bool is_namespace = false) {
    value v(kind::dict);
    v.dict_ = std::make_shared<value_dict>(std::move(d));
    v.namespace_ = is_namespace;
    return v;
  }
  static value function(native_function f) {
    value v(kind::function);
    v.fn_ = std::make_shared<native_function>(std::move(f));
    return v;
  }
  static value from_json(const nlohmann::json& j);
  static value from_json(const nlohmann::ordered_json& j);

  [[nodiscard]] kind type() const noexcept { return kind_; }
  [[nodiscard]] bool is_undefined() const noexcept { return kind_ == kind::undefined; }
  [[nodiscard]] bool is_none() const noexcept { return kind_ == kind::none; }
  [[nodiscard]] bool is_bool() const noexcept { return kind_ == kind::boolean; }
  [[nodiscard]] bool is_int() const noexcept { return kind_ == kind::integer || kind_ == kind::boolean; }
  [[nodiscard]] bool is_number() const noexcept { return is_int() || kind_ == kind::number; }
  [[nodiscard]] bool is_string() const noexcept { return kind_ == kind::string; }
  [[nodiscard]] bool is_markup() const noexcept { return kind_ == kind::string && markup_; }
  [[nodiscard]] bool is_list() const noexcept { return kind_ == kind::list; }
  [[nodiscard]] bool is_tuple() const noexcept { return kind_ == kind::list && seq_ == seq_kind::tuple; }
  [[nodiscard]] bool is_generator() const noexcept { return kind_ == kind::list && seq_ == seq_kind::generator; }
  [[nodiscard]] bool is_view() const noexcept { return kind_ == kind::list && seq_ == seq_kind::view; }
  // A list or tuple: len() and indexing work (generators and dict views have neither or only len()).
  [[nodiscard]] bool is_indexable() const noexcept { return kind_ == kind::list && seq_ <= seq_kind::tuple; }
  [[nodiscard]] seq_kind seq() const noexcept { return seq_; }
  [[nodiscard]] bool is_dict() const noexcept { return kind_ == kind::dict; }
  [[nodiscard]] bool is_namespace() const noexcept { return kind_ == kind::dict && namespace_; }
  [[nodiscard]] bool is_function() const noexcept { return kind_ == kind::function; }

  [[nodiscard]] std::int64_t as_int() const noexcept { return int_; }
  [[nodiscard]] double as_double() const noexcept { return kind_ == kind::number ? num_ : static_cast<double>(int_); }
  [[nodiscard]] const std::string& as_string() const { return *str_; }
  [[nodiscard]] const value_list& as_list() const { return *list_; }
  [[nodiscard]] const value_dict& as_dict() const { return *dict_; }
  [[nodiscard]] value_dict& mutable_dict() const { return *dict_; }  // namespaces only (set ns.attr = ...)
  [[nodiscard]] const native_function& as_function() const { return *fn_; }
  // The name an undefined value was looked up by, for error messages; a dict view's type name.
  [[nodiscard]] std::string undefined_name() const { return str_ ? *str_ : std::string(); }
  // Why iterating this generator fails (failed_generator), or null.
  [[nodiscard]] const std::string* generator_error() const { return is_generator() ? str_.get() : nullptr; }

 private:
  explicit value(kind k) : kind_(k) {}
  kind kind_ = kind::undefined;
  seq_kind seq_ = seq_kind::list;
  bool markup_ = false;
  bool namespace_ = false;
  std::int64_t int_ = 0;
  double num_ = 0;
  std::shared_ptr<const std::string> str_;  // string; an undefined value's name; a failed generator's error
  std::shared_ptr<value_list> list_;
  std::shared_ptr<value_dict> dict_;
  std::shared_ptr<native_function> fn_;
};

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;
  // The keyword argument `name`, or the positional one at `index`, or nullptr; used ones are removed so
  // that leftovers can be reported.
  const value* get(std::string_view name, std::size_t index) {
    for (auto& [k, v] : keyword)
      if (k == name) return &v;
    return index < positional.size() ? &positional[index] : nullptr;
  }
};

template <class Json>
value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return value::none();
    case nlohmann::json::value_t::boolean: return value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return value(j.template get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return value(static_cast<std::int64_t>(j.template get<std::uint64_t>()));
    case nlohmann::json::value_t::number_float: return value(j.template get<double>());
    case nlohmann::json::value_t::string: return value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      value_list items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e));
      return value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      value_dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(value(it.key()), value_from_json(it.value()));
      return value::dict(std::move(d));
    }
    default: fail("jinja: a JSON value of type ", j.type_name(), " has no template value");
  }
}
inline value value::from_json(const nlohmann::json& j) { return value_from_json(j); }
inline value value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

// ---------------------------------------------------------------------------------------------
// Python's text forms
// ---------------------------------------------------------------------------------------------

// repr(float): the shortest digits that read back, fixed notation for exponents -4..15, else d.ddde+XX.
inline std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(r.ptr - buf));
  const bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  const std::size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exp);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<std::size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<std::size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp) + 1) + "." + digits.substr(static_cast<std::size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp < 0 ? "e-" : "e+";
  const std::string e_digits = std::to_string(exp < 0 ? -exp : exp);
  out += (e_digits.size() < 2 ? "0" : "") + e_digits;
  return out;
}

// repr(str): single quotes unless the text holds one and no double quote; \n \r \t \\ and other control
// characters escaped.
inline std::string py_string_repr(std::string_view s) {
  const char q = (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

inline std::string py_repr(const value& v);

// str(v), as `{{ v }}` writes it (undefined writes nothing).
inline std::string py_str(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::none: return "None";
    case value::kind::boolean: return v.as_int() ? "True" : "False";
    case value::kind::integer: return std::to_string(v.as_int());
    case value::kind::number: return py_float_repr(v.as_double());
    case value::kind::string: return v.as_string();
    case value::kind::list: {
      if (v.is_generator()) return "<generator object>";
      std::string out = v.is_view() ? v.undefined_name() + "([" : v.is_tuple() ? "(" : "[";
      const auto& l = v.as_list();
      for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + py_repr(l[i]);
      if (v.is_tuple() && l.size() == 1) out += ",";
      return out + (v.is_view() ? "])" : v.is_tuple() ? ")" : "]");
    }
    case value::kind::dict: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.as_dict().items) {
        out += (first ? "" : ", ") + py_repr(k) + ": " + py_repr(e);
        first = false;
      }
      return out + (v.is_namespace() ? "}>" : "}");
    }
    case value::kind::function: return "<function>";
  }
  return {};
}
inline std::string py_repr(const value& v) {
  if (v.is_undefined()) return "Undefined";  // an undefined value inside a printed list
  return v.is_string() ? py_string_repr(v.as_string()) : py_str(v);
}

// Python's truth: empty strings, lists and dicts, 0, None and undefined are false.
inline bool truthy(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
    case value::kind::none: return false;
    case value::kind::boolean:
    case value::kind::integer: return v.as_int() != 0;
    case value::kind::number: return v.as_double() != 0;
    case value::kind::string: return !v.as_string().empty();
    case value::kind::list: return v.is_generator() || !v.as_list().empty();
    case value::kind::dict: return v.is_namespace() || !v.as_dict().items.empty();
    case value::kind::function: return true;
  }
  return false;
}

// Python's ==: numbers by value (True == 1), lists and dicts item by item; undefined equals undefined.
inline bool equal(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() == value::kind::number || b.type() == value::kind::number) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::list: {
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size() || a.seq() != b.seq() || a.is_generator()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case value::kind::dict: {
      const auto &x = a.as_dict().items, &y = b.as_dict().items;
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x) {
        const value* w = b.as_dict().find(k);
        if (w == nullptr || !equal(v, *w)) return false;
      }
      return true;
    }
    case value::kind::function: return false;
    default: return false;
  }
}

inline const value* value_dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}
inline const value* value_dict::find(const value& key) const {
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}
inline void value_dict::set(value key, value v) {
  for (auto& [k, old] : items)
    if (equal(k, key)) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

inline std::string_view py_type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::number: return "float";
    case value::kind::string: return "str";
    case value::kind::list:
      switch (v.seq()) {
        case seq_kind::tuple: return "tuple";
        case seq_kind::generator: return "generator";
        case seq_kind::view: return "dict_view";
        default: return "list";
      }
    case value::kind::dict: return v.is_namespace() ? "Namespace" : "dict";
    case value::kind::function: return "function";
  }
  return "?";
}

// Python's <: numbers, strings (UTF-8 byte order is code point order) and lists; -1, 0, 1.
inline int compare(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (y < x ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_indexable() && b.is_indexable() && a.seq() == b.seq()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (const int c = compare(x[i], y[i]); c != 0) return c;
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '", py_type_name(a), "' and '", py_type_name(b), "'");
}

// ---------------------------------------------------------------------------------------------
// json.dumps(v, ensure_ascii, indent, separators, sort_keys), transformers' tojson
// ---------------------------------------------------------------------------------------------
struct dump_options {
  bool ensure_ascii = false;
  int indent = -1;  // -1: none (one line)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

inline void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  static constexpr char hex[] = "0123456789abcdef";
  auto u16 = [&](unsigned code) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += hex[(code >> shift) & 15];
  };
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      u16(c);
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
    } else {  // a UTF-8 sequence as \uXXXX (a surrogate pair above U+FFFF); an ill-formed one as U+FFFD
      const auto r = utf8::scan(s.substr(i));
      unsigned code = 0xFFFD;
      if (r.state == utf8::status::valid) code = static_cast<unsigned>(utf8::decode_valid(s.substr(i), r.length));
      i += r.length - 1;
      if (code >= 0x10000) {
        code -= 0x10000;
        u16(0xD800 + (code >> 10));
        u16(0xDC00 + (code & 0x3FF));
      } else {
        u16(code);
      }
    }
  }
  out += '"';
}

inline void dump_json(std::string& out, const value& v, const dump_options& o, int depth) {
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(o.indent * d), ' ');
  };
  switch (v.type()) {
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.as_int() ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::number: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
      return;
    }
    case value::kind::string: json_string(out, v.as_string(), o.ensure_ascii); return;
    case value::kind::list: {
      if (!v.is_indexable()) fail("Object of type ", py_type_name(v), " is not JSON serializable");
      const auto& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        dump_json(out, l[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case value::kind::dict: {
      if (v.is_namespace()) fail("Object of type Namespace is not JSON serializable");
      // json.dumps writes keys as strings: numbers as str() does, booleans and None as JSON does.
      std::vector<std::pair<std::string, const value*>> items;
      for (const auto& [k, e] : v.as_dict().items) {
        if (!k.is_string() && !k.is_number() && !k.is_none())
          fail("keys must be str, int, float, bool or None, not ", py_type_name(k));
        items.emplace_back(k.is_string() ? k.as_string() : k.is_bool() ? (k.as_int() ? "true" : "false")
                                                         : k.is_none() ? "null" : py_str(k), &e);
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        json_string(out, items[i].first, o.ensure_ascii);
        out += o.key_separator;
        dump_json(out, *items[i].second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case value::kind::undefined: fail("Object of type Undefined is not JSON serializable");
    case value::kind::function: fail("Object of type function is not JSON serializable");
  }
}

inline std::string to_json(const value& v, const dump_options& o = {}) {
  std::string out;
  dump_json(out, v, o, 0);
  return out;
}

}  // namespace zipage::jinja
