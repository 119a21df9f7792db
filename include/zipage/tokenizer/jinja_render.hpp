#pragma once
// The evaluation half of zipage's Jinja interpreter (jinja.hpp includes this): expressions, statements,
// and the filters, tests, methods and globals that chat templates use, with Python's semantics.
#include <cmath>
#include <cstdint>
#include <ctime>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/tokenizer/jinja.hpp"
#include "zipage/tokenizer/jinja_value.hpp"

namespace zipage::jinja {
namespace detail {

// ---------------------------------------------------------------------------------------------
// Python string helpers (code point aware where Python is)
// ---------------------------------------------------------------------------------------------
// Bytes of the code point at the front of `s` (not empty); an ill-formed sequence counts as one code point
// per maximal ill-formed subpart, as the decoder's U+FFFD replacement does (utf8.hpp).
inline std::size_t code_point_bytes(std::string_view s) { return utf8::scan(s).length; }

// The string's code points, each as its UTF-8 bytes.
inline std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = code_point_bytes(s.substr(i));
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// str.isspace() for one code point: ASCII whitespace, \x1c-\x1f and Unicode's spaces.
inline bool py_is_space(std::string_view cp) {
  if (cp.size() == 1) {
    const auto c = static_cast<unsigned char>(cp[0]);
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  }
  static constexpr std::string_view spaces[] = {
      "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
      "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88",
      "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F",
      "\xE3\x80\x80"};
  return std::find(std::begin(spaces), std::end(spaces), cp) != std::end(spaces);
}

// str.strip / lstrip / rstrip: whitespace, or any code point of `chars`.
inline std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const auto cps = code_points(s);
  const auto strip_set = chars ? code_points(*chars) : std::vector<std::string_view>{};
  auto stripped = [&](std::string_view cp) {
    return chars ? std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end() : py_is_space(cp);
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && stripped(cps[b])) ++b;
  if (right)
    while (e > b && stripped(cps[e - 1])) --e;
  if (b == e) return {};
  return std::string(cps[b].data(), static_cast<std::size_t>(cps[e - 1].data() + cps[e - 1].size() - cps[b].data()));
}

inline std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    check(!sep->empty(), "empty separator");
    std::size_t at = 0;
    for (;;) {
      const std::size_t hit = maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit ? s.find(*sep, at)
                                                                                                : std::string_view::npos;
      if (hit == std::string_view::npos) {
        out.emplace_back(s.substr(at));
        return out;
      }
      out.emplace_back(s.substr(at, hit - at));
      at = hit + sep->size();
    }
  }
  // runs of whitespace separate; none at either end
  const auto cps = code_points(s);
  std::size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && py_is_space(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {  // the rest as it is, trailing space too
      out.emplace_back(s.substr(static_cast<std::size_t>(cps[i].data() - s.data())));
      return out;
    }
    std::string word;
    while (i < cps.size() && !py_is_space(cps[i])) word += cps[i++];
    out.push_back(std::move(word));
  }
  return out;
}

inline std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (!sep) {  // runs of whitespace from the right; the rest, leading space kept, once maxsplit words are split off
    const auto cps = code_points(s);
    std::size_t i = cps.size();
    while (i > 0) {
      while (i > 0 && py_is_space(cps[i - 1])) --i;
      if (i == 0) break;
      const std::size_t end = static_cast<std::size_t>(cps[i - 1].data() + cps[i - 1].size() - s.data());
      if (static_cast<std::int64_t>(out.size()) == maxsplit) {
        out.emplace_back(s.substr(0, end));
        break;
      }
      while (i > 0 && !py_is_space(cps[i - 1])) --i;
      out.emplace_back(s.substr(static_cast<std::size_t>(cps[i].data() - s.data()),
                                end - static_cast<std::size_t>(cps[i].data() - s.data())));
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::size_t end = s.size();
  while (static_cast<std::int64_t>(out.size()) < maxsplit) {
    const std::size_t hit = end >= sep->size() ? s.rfind(*sep, end - sep->size()) : std::string_view::npos;
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

// Python's int(s, base) for a stripped string: an optional sign, the base's 0x / 0o / 0b prefix (base 16, 8, 2;
// base 0 reads it, else decimal), digits; nullopt where Python raises ValueError (a bad base included).
inline std::optional<std::int64_t> py_parse_int(std::string_view s, std::int64_t base) {
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  const auto prefix = [&](char c) {
    return s.size() > 2 && s[0] == '0' && (s[1] | 0x20) == c;
  };
  if (base == 0) base = prefix('x') ? 16 : prefix('o') ? 8 : prefix('b') ? 2 : 10;
  if ((base == 16 && prefix('x')) || (base == 8 && prefix('o')) || (base == 2 && prefix('b'))) s.remove_prefix(2);
  std::uint64_t magnitude = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), magnitude, static_cast<int>(base));
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  if (magnitude > (negative ? std::uint64_t{1} << 63 : (std::uint64_t{1} << 63) - 1)) return std::nullopt;
  return negative ? static_cast<std::int64_t>(0 - magnitude) : static_cast<std::int64_t>(magnitude);
}

// Python's float(s) for a stripped string: decimal and exponent forms, inf / infinity / nan in any case; nullopt
// where Python raises ValueError (hexadecimal among them, which strtod would read).
inline std::optional<double> py_parse_float(const std::string& s) {
  if (s.empty() || s.find_first_of("xX(") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

// s[start:end] for str.find, count, startswith, ... (indices in code points, negative ones from the end, end
// clamped) and the index of its first code point; nullopt when end < start, where Python finds nothing, not even "".
inline std::optional<std::pair<std::string_view, std::int64_t>> py_str_range(std::string_view s,
                                                                             std::optional<std::int64_t> start,
                                                                             std::optional<std::int64_t> end) {
  const auto cps = code_points(s);
  const auto n = static_cast<std::int64_t>(cps.size());
  auto from_end = [n](std::int64_t i) { return i < 0 ? std::max<std::int64_t>(0, i + n) : i; };
  const std::int64_t b = from_end(start.value_or(0)), e = std::min(n, from_end(end.value_or(n)));
  if (e < b) return std::nullopt;
  auto byte = [&](std::int64_t i) { return i == n ? s.size() : static_cast<std::size_t>(cps[i].data() - s.data()); };
  return std::pair{s.substr(byte(b), byte(e) - byte(b)), b};
}

inline std::string py_replace(std::string_view s, std::string_view from, std::string_view to, std::int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between code points (and at both ends)
    const auto cps = code_points(s);
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || static_cast<std::int64_t>(i) < count) out += to;
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  std::size_t at = 0;
  for (std::int64_t n = 0; count < 0 || n < count; ++n) {
    const std::size_t hit = s.find(from, at);
    if (hit == std::string_view::npos) break;
    out += s.substr(at, hit - at);
    out += to;
    at = hit + from.size();
  }
  out += s.substr(at);
  return out;
}

inline std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return s;
}
inline std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}
inline bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline std::string py_title(std::string s) {
  bool prev_cased = false;
  for (char& c : s) {
    if (ascii_alpha(c)) {
      c = prev_cased ? (c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c) : (c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c);
      prev_cased = true;
    } else {
      prev_cased = static_cast<unsigned char>(c) >= 0x80 && prev_cased;
    }
  }
  return s;
}
inline std::string py_capitalize(std::string s) {
  s = ascii_lower(std::move(s));
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 32);
  return s;
}

inline std::string html_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's floor division and modulo.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
inline std::int64_t floor_mod(std::int64_t a, std::int64_t b) { return a - floor_div(a, b) * b; }

enum class flow : std::uint8_t { normal, break_, continue_ };

// What one rendering may spend: a template is data from a checkpoint or a request, so a runaway one (a
// macro recursing into two branches, a string doubled in a loop) ends in an error, not a hung server.
inline constexpr std::int64_t max_steps = 20'000'000;          // statements and expressions evaluated
inline constexpr std::size_t max_text_bytes = std::size_t{64} << 20;  // any string, the output included

// ---------------------------------------------------------------------------------------------
// The renderer: one per render() call
// ---------------------------------------------------------------------------------------------
class renderer {
 public:
  renderer(const std::vector<std::pair<std::string, value>>& variables, const render_options& options)
      : options_(options) {
    for (const auto& [k, v] : variables) globals_.set(k, v);
    frames_.emplace_back();
    install_globals();
  }

  void run(const body& b, std::string& out) {
    if (run_body(b, out) != flow::normal) error("'break' or 'continue' outside a loop");
  }

 private:
  using frame = std::vector<std::pair<std::string, value>>;
  const render_options& options_;
  value_dict globals_;
  std::vector<frame> frames_;  // [0]: the template's top level
  std::size_t base_ = 1;       // a macro body sees frames_[base_..] and frames_[0]
  int line_ = 0;
  int macro_depth_ = 0;
  std::int64_t steps_ = 0;

  void step() {
    if (++steps_ > max_steps) error("the template takes more than ", max_steps, " steps; refusing to go on");
  }
  void check_size(std::size_t bytes) const {
    if (bytes > max_text_bytes) error("the template writes a text longer than ", max_text_bytes >> 20, " MiB");
  }
  // a op b on 64-bit integers, refusing what overflows (Python's integers would grow instead).
  template <class Op>
  std::int64_t checked(Op op, std::int64_t a, std::int64_t b) const {
    std::int64_t r = 0;
    if (op(a, b, &r)) error("integer overflow (zipage's templates use 64-bit integers)");
    return r;
  }
  static bool add_overflow(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_add_overflow(a, b, r); }
  static bool sub_overflow(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_sub_overflow(a, b, r); }
  static bool mul_overflow(std::int64_t a, std::int64_t b, std::int64_t* r) { return __builtin_mul_overflow(a, b, r); }

  template <class... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    fail(located(parts...));
  }
  template <class... Parts>
  std::string located(const Parts&... parts) const {
    std::ostringstream os;
    os << "chat template line " << line_ << ": ";
    (os << ... << parts);
    return os.str();
  }
  [[noreturn]] void undefined_error(const value& v) const {
    const std::string hint = v.undefined_name();
    error(hint.empty() ? std::string("a value is undefined") : hint);
  }

  // ---- variables ----
  const value* find_var(std::string_view name) const {
    for (std::size_t i = frames_.size(); i-- > base_;)
      for (const auto& [k, v] : frames_[i])
        if (k == name) return &v;
    for (const auto& [k, v] : frames_[0])
      if (k == name) return &v;
    return globals_.find(name);
  }
  void set_var(const std::string& name, value v) {
    for (auto& [k, old] : frames_.back())
      if (k == name) {
        old = std::move(v);
        return;
      }
    frames_.back().emplace_back(name, std::move(v));
  }
  void assign(const std::vector<std::string>& targets, const value& v) {
    if (targets.size() == 1) {
      set_var(targets[0], v);
      return;
    }
    const std::vector<value> items = iterate(v);
    if (items.size() != targets.size())
      error("cannot unpack ", items.size(), " values into ", targets.size(), " names");
    for (std::size_t i = 0; i < targets.size(); ++i) set_var(targets[i], items[i]);
  }

  // ---- statements ----
  flow run_body(const body& b, std::string& out) {
    for (const auto& st : b)
      if (const flow f = run_stmt(*st, out); f != flow::normal) return f;
    return flow::normal;
  }

  flow run_stmt(const stmt& st, std::string& out) {
    step();
    if (st.type != stmt::kind::text) line_ = st.line;
    switch (st.type) {
      case stmt::kind::text:
        out += st.text;
        check_size(out.size());
        return flow::normal;
      case stmt::kind::output:
        out += py_str(eval(*st.value));
        check_size(out.size());
        return flow::normal;
      case stmt::kind::if_:
        for (const auto& [test, b] : st.branches)
          if (!test || truthy(eval(*test))) return run_body(b, out);
        return flow::normal;
      case stmt::kind::for_: run_for(st, out); return flow::normal;
      case stmt::kind::set: {
        value v = eval(*st.value);
        if (st.attribute_target) {
          const value* ns = find_var(st.targets[0]);
          if (!ns || !ns->is_namespace()) error("cannot assign attribute on non-namespace object '", st.targets[0], "'");
          ns->mutable_dict().set(st.targets[1], std::move(v));
        } else {
          assign(st.targets, v);
        }
        return flow::normal;
      }
      case stmt::kind::set_block: {
        std::string text;
        run_captured(st.main, text);
        value v(std::move(text));
        if (st.value) v = apply_filters(*st.value, v);
        set_var(st.targets[0], std::move(v));
        return flow::normal;
      }
      case stmt::kind::macro: set_var(st.text, make_macro(st)); return flow::normal;
      case stmt::kind::filter_block: {
        std::string text;
        run_captured(st.main, text);
        out += py_str(apply_filters(*st.value, value(std::move(text))));
        return flow::normal;
      }
      case stmt::kind::break_: return flow::break_;
      case stmt::kind::continue_: return flow::continue_;
      case stmt::kind::scope: return run_body(st.main, out);
    }
    return flow::normal;
  }

  // A block's output into `text`; break/continue may still leave the enclosing loop.
  void run_captured(const body& b, std::string& text) {
    if (run_body(b, text) != flow::normal) error("'break' or 'continue' inside a captured block is not supported");
  }

  // Each iteration is its own scope (assignments in the body do not outlive it); `loop` describes it.
  void run_for(const stmt& st, std::string& out) {
    std::vector<value> items = iterate(eval(*st.value));
    if (st.loop_filter) {
      std::vector<value> kept;
      for (auto& item : items) {
        frames_.emplace_back();
        assign(st.targets, item);
        const bool keep = truthy(eval(*st.loop_filter));
        frames_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (run_body(st.otherwise, out) != flow::normal) error("'break' or 'continue' outside a loop");
      return;
    }
    const std::size_t n = items.size();
    for (std::size_t i = 0; i < n; ++i) {
      frames_.emplace_back();
      assign(st.targets, items[i]);
      value_dict loop;
      loop.set("index", value(i + 1));
      loop.set("index0", value(i));
      loop.set("revindex", value(n - i));
      loop.set("revindex0", value(n - i - 1));
      loop.set("first", value(i == 0));
      loop.set("last", value(i + 1 == n));
      loop.set("length", value(n));
      loop.set("depth", value(1));
      loop.set("depth0", value(0));
      loop.set("previtem", i > 0 ? items[i - 1] : value::undefined("there is no previous item"));
      loop.set("nextitem", i + 1 < n ? items[i + 1] : value::undefined("there is no next item"));
      loop.set("cycle", value::function([i](call_args& a) -> value {
        if (a.positional.empty()) fail("loop.cycle() needs at least one value");
        return a.positional[i % a.positional.size()];
      }));
      set_var("loop", value::dict(std::move(loop)));
      const flow f = run_body(st.main, out);
      frames_.pop_back();
      if (f == flow::break_) break;
    }
  }

  value make_macro(const stmt& st) {
    const stmt* m = &st;
    return value::function([this, m](call_args& a) { return call_macro(*m, a); });
  }

  value call_macro(const stmt& m, call_args& a) {
    if (++macro_depth_ > 64) error("macro '", m.text, "' recurses more than 64 levels");
    if (a.positional.size() > m.params.size())
      error("macro '", m.text, "' takes not more than ", m.params.size(), " argument(s)");
    for (const auto& kv : a.keyword) {
      const std::string& k = kv.first;  // (not a structured binding: clang 14 cannot capture those)
      const bool known = std::any_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == k; });
      if (!known) error("macro '", m.text, "' takes no keyword argument '", k, "'");
    }
    const int caller_line = line_;
    const std::size_t saved_base = base_;
    frame params;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      const value* given = a.get(name, i);
      params.emplace_back(name, given ? *given : def ? eval(*def) : value::undefined("'" + name + "' is undefined"));
    }
    base_ = frames_.size();
    frames_.push_back(std::move(params));
    std::string text;
    flow f = flow::normal;
    try {
      f = run_body(m.main, text);
    } catch (...) {
      frames_.resize(base_);
      base_ = saved_base;
      --macro_depth_;
      throw;
    }
    frames_.resize(base_);
    base_ = saved_base;
    --macro_depth_;
    line_ = caller_line;
    if (f != flow::normal) error("'break' or 'continue' outside a loop");
    return value(std::move(text));
  }

  // ---- iteration, attributes, items ----
  std::vector<value> iterate(const value& v) const {
    switch (v.type()) {
      case value::kind::undefined: return {};
      case value::kind::list:
        if (const std::string* why = v.generator_error()) fail(*why);  // located where the generator was made
        return v.as_list();
      case value::kind::dict: {
        if (v.is_namespace()) error("'Namespace' object is not iterable");
        std::vector<value> keys;
        for (const auto& [k, e] : v.as_dict().items) keys.push_back(k);
        return keys;
      }
      case value::kind::string: {
        std::vector<value> chars;
        for (const auto cp : code_points(v.as_string())) chars.emplace_back(cp);
        return chars;
      }
      default: error("'", py_type_name(v), "' object is not iterable");
    }
  }

  static bool iterable(const value& v) {
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  }

  std::int64_t length_of(const value& v) const {
    switch (v.type()) {
      case value::kind::undefined: return 0;
      case value::kind::string: return static_cast<std::int64_t>(code_points(v.as_string()).size());
      case value::kind::list:
        if (v.is_generator()) error("object of type 'generator' has no len()");
        return static_cast<std::int64_t>(v.as_list().size());
      case value::kind::dict: return static_cast<std::int64_t>(v.as_dict().items.size());
      default: error("object of type '", py_type_name(v), "' has no len()");
    }
  }

  value get_attr(const value& obj, const std::string& name) {
    if (obj.is_undefined()) undefined_error(obj);
    if (value m = method(obj, name); !m.is_undefined() || !m.undefined_name().empty()) return m;
    if (obj.is_dict())
      if (const value* v = obj.as_dict().find(name)) return *v;
    return value::undefined("'" + std::string(obj.is_namespace() ? "Namespace" : std::string(py_type_name(obj)) + " object") +
                            "' has no attribute '" + name + "'");
  }

  value get_item(const value& obj, const value& key) {
    if (obj.is_undefined()) undefined_error(obj);
    auto index = [&](std::int64_t size) -> std::optional<std::size_t> {
      if (!key.is_int()) return std::nullopt;
      std::int64_t i = key.as_int();
      if (i < 0) i += size;
      if (i < 0 || i >= size) return std::nullopt;
      return static_cast<std::size_t>(i);
    };
    // What Python cannot index (a generator, a number) is undefined here, as jinja2's getitem makes it.
    if (obj.is_indexable()) {
      if (const auto i = index(static_cast<std::int64_t>(obj.as_list().size()))) return obj.as_list()[*i];
    } else if (obj.is_string()) {
      const auto cps = code_points(obj.as_string());
      if (const auto i = index(static_cast<std::int64_t>(cps.size()))) return value(cps[*i]);
    } else if (obj.is_dict()) {
      if (const value* v = obj.as_dict().find(key)) return *v;
    }
    if (key.is_string() && !obj.is_dict()) return get_attr(obj, key.as_string());
    return value::undefined("'" + std::string(py_type_name(obj)) + " object' has no item " + py_repr(key));
  }

  value slice(const value& obj, const value& start, const value& stop, const value& step_v) {
    if (obj.is_undefined()) undefined_error(obj);
    auto as_index = [&](const value& v, const char* what) -> std::optional<std::int64_t> {
      if (v.is_undefined() || v.is_none()) return std::nullopt;
      if (!v.is_int()) error("slice ", what, " must be an integer or None, got '", py_type_name(v), "'");
      return v.as_int();
    };
    const std::int64_t step = as_index(step_v, "step").value_or(1);
    if (step == 0) error("slice step cannot be zero");
    std::vector<value> items;
    std::vector<std::string_view> cps;
    std::int64_t n;
    if (obj.is_indexable()) {
      n = static_cast<std::int64_t>(obj.as_list().size());
    } else if (obj.is_string()) {
      cps = code_points(obj.as_string());
      n = static_cast<std::int64_t>(cps.size());
    } else {  // jinja2 subscripts slices directly: Python's error
      error(obj.is_dict() ? std::string("unhashable type: 'slice'") : "'" + std::string(py_type_name(obj)) + "' object is not subscriptable");
    }
    // a step longer than the sequence takes one item: clamped, so stepping cannot overflow
    const std::int64_t stride = std::clamp<std::int64_t>(step, -(n + 1), n + 1);
    auto clamp = [&](std::optional<std::int64_t> i, std::int64_t def) {
      if (!i) return def;
      std::int64_t v = *i < 0 ? *i + n : *i;
      if (step > 0) return std::clamp<std::int64_t>(v, 0, n);
      return std::clamp<std::int64_t>(v, -1, n - 1);
    };
    const std::int64_t b = clamp(as_index(start, "start"), step > 0 ? 0 : n - 1);
    const std::int64_t e = clamp(as_index(stop, "stop"), step > 0 ? n : -1);
    std::string text;
    for (std::int64_t i = b; step > 0 ? i < e : i > e; i += stride) {
      if (obj.is_list()) {
        items.push_back(obj.as_list()[static_cast<std::size_t>(i)]);
      } else {
        text += cps[static_cast<std::size_t>(i)];
      }
    }
    if (obj.is_string()) return value(std::move(text));
    return value::list(std::move(items), obj.seq());
  }

  // ---- expressions ----
  value eval(const expr& e) {
    step();
    value v = eval_node(e);
    if (v.is_string()) check_size(v.as_string().size());
    return v;
  }
  value eval_node(const expr& e) {
    switch (e.type) {
      case expr::kind::literal: return e.literal;
      case expr::kind::name: {
        if (const value* v = find_var(e.name)) return *v;
        return value::undefined("'" + e.name + "' is undefined");
      }
      case expr::kind::attr: return get_attr(eval(*e.args[0]), e.name);
      case expr::kind::item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case expr::kind::slice: {
        auto part = [&](std::size_t i) { return e.args[i] ? eval(*e.args[i]) : value::none(); };
        return slice(eval(*e.args[0]), part(1), part(2), part(3));
      }
      case expr::kind::call: {
        const value callee = eval(*e.args[0]);
        call_args a = eval_args(e, 1);
        if (callee.is_undefined()) undefined_error(callee);
        if (!callee.is_function()) error("'", py_type_name(callee), "' object is not callable");
        return callee.as_function()(a);
      }
      case expr::kind::filter: return apply_filters(e, value());
      case expr::kind::test: {
        const value subject = eval(*e.args[0]);
        call_args a = eval_args(e, 1);
        return value(run_test(e.name, subject, a));
      }
      case expr::kind::not_: return value(!truthy(eval(*e.args[0])));
      case expr::kind::neg:
      case expr::kind::pos: {
        const value v = eval(*e.args[0]);
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) error("bad operand type for unary ", e.type == expr::kind::neg ? "-" : "+", ": '", py_type_name(v), "'");
        if (e.type == expr::kind::pos) return v.is_int() ? value(v.as_int()) : v;
        return v.is_int() ? value(checked(sub_overflow, 0, v.as_int())) : value(-v.as_double());
      }
      case expr::kind::binary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]));
      case expr::kind::compare: {
        value left = eval(*e.args[0]);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          value right = eval(*e.args[i + 1]);
          if (!compare_op(e.ops[i], left, right)) return value(false);
          left = std::move(right);
        }
        return value(true);
      }
      case expr::kind::and_: {
        value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case expr::kind::or_: {
        value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case expr::kind::cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : value::undefined("the conditional expression has no else");
      case expr::kind::list:
      case expr::kind::tuple: {
        value_list items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return value::list(std::move(items), e.type == expr::kind::tuple ? seq_kind::tuple : seq_kind::list);
      }
      case expr::kind::dict: {
        value_dict d;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          value k = eval(*e.args[i]);
          if (k.is_list() || k.is_dict() || k.is_undefined()) error("unhashable type: '", py_type_name(k), "'");
          d.set(std::move(k), eval(*e.args[i + 1]));
        }
        return value::dict(std::move(d));
      }
    }
    error("unknown expression");
  }

  call_args eval_args(const expr& e, std::size_t first) {
    call_args a;
    for (std::size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  bool compare_op(const std::string& op, const value& a, const value& b) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    if (a.is_undefined()) undefined_error(a);
    if (b.is_undefined()) undefined_error(b);
    int c;
    try {
      c = compare(a, b);
    } catch (const zipage::error& x) {
      error(x.what());
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  bool contains(const value& container, const value& item) const {
    switch (container.type()) {
      case value::kind::undefined: return false;
      case value::kind::string:
        if (!item.is_string()) error("'in <string>' requires string as left operand, not ", py_type_name(item));
        return container.as_string().find(item.as_string()) != std::string::npos;
      case value::kind::list:
        if (const std::string* why = container.generator_error()) fail(*why);
        return std::any_of(container.as_list().begin(), container.as_list().end(),
                           [&](const value& v) { return equal(v, item); });
      case value::kind::dict:
        if ((item.is_list() && (item.seq() == seq_kind::list || item.is_view())) || item.is_dict())
          error("unhashable type: '", py_type_name(item), "'");
        return container.as_dict().find(item) != nullptr;
      default: error("argument of type '", py_type_name(container), "' is not iterable");
    }
  }

  value binary(const std::string& op, const value& a, const value& b) {
    if (op == "~") {
      std::string x = py_str(a), y = py_str(b);
      check_size(x.size() + y.size());
      return value(std::move(x) + y);
    }
    if (a.is_undefined()) undefined_error(a);
    if (b.is_undefined()) undefined_error(b);
    const bool ints = a.is_int() && b.is_int();
    if (a.is_number() && b.is_number()) {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return ints ? value(checked(add_overflow, a.as_int(), b.as_int())) : value(x + y);
      if (op == "-") return ints ? value(checked(sub_overflow, a.as_int(), b.as_int())) : value(x - y);
      if (op == "*") return ints ? value(checked(mul_overflow, a.as_int(), b.as_int())) : value(x * y);
      if (op == "/") {
        if (y == 0) error("division by zero");
        return value(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0) error("integer division or modulo by zero");
        if (ints && a.as_int() == INT64_MIN && b.as_int() == -1) error("integer overflow (zipage's templates use 64-bit integers)");
        if (ints) return value(op == "//" ? floor_div(a.as_int(), b.as_int()) : floor_mod(a.as_int(), b.as_int()));
        const double q = std::floor(x / y);
        return op == "//" ? value(q) : value(x - q * y);
      }
      if (op == "**") {
        if (ints && b.as_int() >= 0) {  // by squaring, refusing what overflows 64 bits
          std::int64_t result = 1, base = a.as_int();
          for (std::int64_t n = b.as_int(); n > 0; n >>= 1) {
            if (n & 1) result = checked(mul_overflow, result, base);
            if (n > 1) base = checked(mul_overflow, base, base);
          }
          return value(result);
        }
        return value(std::pow(x, y));
      }
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      if (!a.is_markup() && !b.is_markup()) return value(a.as_string() + b.as_string());
      auto safe = [](const value& x) { return x.is_markup() ? x.as_string() : html_escape(x.as_string()); };
      return value::markup(safe(a) + safe(b));
    }
    if (op == "+" && a.is_indexable() && b.is_indexable() && a.seq() == b.seq()) {
      value_list items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return value::list(std::move(items), a.seq());
    }
    if (op == "*" && (a.is_string() || a.is_indexable()) && b.is_int()) {
      const std::size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size() * 16;
      if (b.as_int() > 0 && unit > 0) check_size(unit * static_cast<std::size_t>(std::min<std::int64_t>(b.as_int(), INT32_MAX)));
      if (a.is_string()) {
        std::string out;
        for (std::int64_t i = 0; i < b.as_int(); ++i) out += a.as_string();
        return value(std::move(out));
      }
      value_list items;
      for (std::int64_t i = 0; i < b.as_int(); ++i) items.insert(items.end(), a.as_list().begin(), a.as_list().end());
      return value::list(std::move(items), a.seq());
    }
    if (op == "*" && a.is_int() && (b.is_string() || b.is_indexable())) return binary(op, b, a);
    if (op == "%" && a.is_string())  // a tuple gives the arguments; a mapping may go unused, as in Python
      return value(percent_format(a.as_string(), b.is_tuple() ? b.as_list() : value_list{b}, b.is_dict()));
    error("unsupported operand type(s) for ", op, ": '", py_type_name(a), "' and '", py_type_name(b), "'");
  }

  // 'text %s' % args with %s, %r, %d, %i and %%.
  std::string percent_format(std::string_view f, const value_list& args, bool mapping = false) const {
    std::string out;
    std::size_t next = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i] != '%') {
        out += f[i];
        continue;
      }
      if (++i == f.size()) error("incomplete format");
      const char c = f[i];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (next >= args.size()) error("not enough arguments for format string");
      const value& v = args[next++];
      if (c == 's') out += py_str(v);
      else if (c == 'r') out += py_repr(v);
      else if ((c == 'd' || c == 'i') && v.is_int()) out += std::to_string(v.as_int());
      else if ((c == 'd' || c == 'i') && v.is_number() && std::fabs(v.as_double()) < 9.2e18) out += std::to_string(static_cast<std::int64_t>(v.as_double()));
      else error("unsupported format character '", std::string(1, c), "'");
    }
    if (next != args.size() && !mapping) error("not all arguments converted during string formatting");
    return out;
  }

  // ---- methods ----
  // obj.name as a bound method; undefined (no name) when obj has no such method.
  value method(const value& obj, const std::string& name) {
    auto bound = [&](auto fn) { return value::function([this, obj, fn](call_args& a) -> value { return fn(*this, obj, a); }); };
    auto opt_string = [this](call_args& a, std::string_view key, std::size_t i) -> std::optional<std::string> {
      const value* v = a.get(key, i);
      if (!v || v->is_none()) return std::nullopt;
      if (!v->is_string()) error("expected a string argument '", key, "', got '", py_type_name(*v), "'");
      return v->as_string();
    };
    auto opt_int = [this](call_args& a, std::string_view key, std::size_t i, std::int64_t def) {
      const value* v = a.get(key, i);
      if (!v || v->is_none()) return def;
      if (!v->is_int()) error("expected an integer argument '", key, "', got '", py_type_name(*v), "'");
      return v->as_int();
    };
    // A start/end index of str.find & co: an int, or None (absent).
    auto opt_index = [this](call_args& a, std::string_view key, std::size_t i) -> std::optional<std::int64_t> {
      const value* v = a.get(key, i);
      if (!v || v->is_none()) return std::nullopt;
      if (!v->is_int()) error("slice indices must be integers or None, got '", py_type_name(*v), "'");
      return v->as_int();
    };
    auto str_list = [](std::vector<std::string> parts) {
      value_list l;
      for (auto& p : parts) l.emplace_back(std::move(p));
      return value::list(std::move(l));
    };
    if (obj.is_string()) {
      const std::string& s = obj.as_string();
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return bound([opt_string, name](renderer&, const value& o, call_args& a) {
          return value(py_strip(o.as_string(), opt_string(a, "chars", 0), name != "rstrip", name != "lstrip"));
        });
      if (name == "split" || name == "rsplit")
        return bound([opt_string, opt_int, str_list, name](renderer&, const value& o, call_args& a) {
          const auto sep = opt_string(a, "sep", 0);
          const auto maxsplit = opt_int(a, "maxsplit", 1, -1);
          return str_list(name == "split" ? py_split(o.as_string(), sep, maxsplit) : py_rsplit(o.as_string(), sep, maxsplit));
        });
      if (name == "splitlines")
        return bound([str_list](renderer&, const value& o, call_args&) {
          std::vector<std::string> lines = py_split(o.as_string(), std::string("\n"), -1);
          if (!lines.empty() && lines.back().empty()) lines.pop_back();
          for (auto& l : lines)
            if (!l.empty() && l.back() == '\r') l.pop_back();
          return str_list(std::move(lines));
        });
      if (name == "startswith" || name == "endswith")
        return bound([name, opt_index](renderer& r, const value& o, call_args& a) {
          const value* arg = a.get("prefix", 0);
          if (!arg) r.error(name, "() takes at least 1 argument");
          const value_list options = arg->is_tuple() ? arg->as_list() : value_list{*arg};
          const auto range = py_str_range(o.as_string(), opt_index(a, "start", 1), opt_index(a, "end", 2));
          for (const value& p : options) {
            if (!p.is_string()) r.error(name, " first arg must be str or a tuple of str, not ", py_type_name(p));
            if (range && (name == "startswith" ? range->first.starts_with(p.as_string())
                                               : range->first.ends_with(p.as_string())))
              return value(true);
          }
          return value(false);
        });
      if (name == "replace")
        return bound([opt_string, opt_int](renderer& r, const value& o, call_args& a) {
          const auto from = opt_string(a, "old", 0), to = opt_string(a, "new", 1);
          if (!from || !to) r.error("replace() takes two string arguments");
          return value(py_replace(o.as_string(), *from, *to, opt_int(a, "count", 2, -1)));
        });
      if (name == "upper") return bound([](renderer&, const value& o, call_args&) { return value(ascii_upper(o.as_string())); });
      if (name == "lower") return bound([](renderer&, const value& o, call_args&) { return value(ascii_lower(o.as_string())); });
      if (name == "title") return bound([](renderer&, const value& o, call_args&) { return value(py_title(o.as_string())); });
      if (name == "capitalize")
        return bound([](renderer&, const value& o, call_args&) { return value(py_capitalize(o.as_string())); });
      if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex")
        return bound([opt_string, opt_index, name](renderer& r, const value& o, call_args& a) {
          const auto sub = opt_string(a, "sub", 0);
          if (!sub) r.error(name, "() takes a string argument");
          const auto range = py_str_range(o.as_string(), opt_index(a, "start", 1), opt_index(a, "end", 2));
          const std::string_view s = range ? range->first : std::string_view();
          if (name == "count") {
            std::int64_t n = 0;
            if (!range) return value(n);
            if (sub->empty()) return value(static_cast<std::int64_t>(code_points(s).size()) + 1);
            for (std::size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size())) ++n;
            return value(n);
          }
          const std::size_t at = !range ? std::string_view::npos
                                 : name == "find" || name == "index" ? s.find(*sub) : s.rfind(*sub);
          if (at == std::string_view::npos) {
            if (name == "index" || name == "rindex") r.error("substring not found");
            return value(-1);
          }
          return value(range->second + static_cast<std::int64_t>(code_points(s.substr(0, at)).size()));
        });
      if (name == "join")
        return bound([](renderer& r, const value& o, call_args& a) {
          if (a.positional.size() != 1) r.error("join() takes exactly one argument");
          std::string out;
          bool first = true;
          for (const value& v : r.iterate(a.positional[0])) {
            if (!v.is_string()) r.error("sequence item: expected str instance, ", py_type_name(v), " found");
            if (!first) out += o.as_string();
            out += v.as_string();
            first = false;
          }
          return value(std::move(out));
        });
      if (name == "format") return bound([](renderer& r, const value& o, call_args& a) { return value(r.str_format(o.as_string(), a)); });
      if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
          name == "islower")
        return bound([name](renderer&, const value& o, call_args&) {
          const std::string& t = o.as_string();
          if (t.empty()) return value(false);
          bool cased = false;
          for (const auto cp : code_points(t)) {
            const char c = cp.size() == 1 ? cp[0] : '\0';
            if (name == "isspace") {
              if (!py_is_space(cp)) return value(false);
              continue;
            }
            if (cp.size() != 1) return value(false);  // non-ASCII: ASCII rules only
            const bool digit = c >= '0' && c <= '9', alpha = ascii_alpha(c);
            if (name == "isdigit" && !digit) return value(false);
            if (name == "isalpha" && !alpha) return value(false);
            if (name == "isalnum" && !digit && !alpha) return value(false);
            if (name == "isupper" && c >= 'a' && c <= 'z') return value(false);
            if (name == "islower" && c >= 'A' && c <= 'Z') return value(false);
            cased = cased || alpha;
          }
          return value(name == "isupper" || name == "islower" ? cased : true);
        });
      (void)s;
      return value();
    }
    if (obj.is_dict() && !obj.is_namespace()) {
      if (name == "items" || name == "keys" || name == "values")
        return bound([name](renderer&, const value& o, call_args&) {
          value_list out;
          for (const auto& [k, v] : o.as_dict().items) {
            if (name == "items") out.push_back(value::list({k, v}, seq_kind::tuple));
            else if (name == "keys") out.push_back(k);
            else out.push_back(v);
          }
          return value::view(std::move(out), "dict_" + name);
        });
      if (name == "get")
        return bound([](renderer& r, const value& o, call_args& a) {
          if (a.positional.empty() || a.positional.size() > 2) r.error("get() takes 1 or 2 arguments");
          const value& k = a.positional[0];
          if (k.is_string())
            if (const value* v = o.as_dict().find(k.as_string())) return *v;
          return a.positional.size() == 2 ? a.positional[1] : value::none();
        });
      if (name == "pop" || name == "popitem" || name == "update" || name == "clear" || name == "setdefault")
        return value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
      return value();
    }
    if (obj.is_indexable()) {
      if (name == "index" || name == "count")
        return bound([name](renderer& r, const value& o, call_args& a) {
          if (a.positional.size() != 1) r.error(name, "() takes exactly one argument");
          std::int64_t n = 0;
          for (std::size_t i = 0; i < o.as_list().size(); ++i) {
            if (!equal(o.as_list()[i], a.positional[0])) continue;
            if (name == "index") return value(i);
            ++n;
          }
          if (name == "index") r.error(py_repr(a.positional[0]), " is not in list");
          return value(n);
        });
      if (!obj.is_tuple() && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                              name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
    }
    return value();
  }

  // str.format: {} / {0} / {name} fields, {{ and }} escapes; no format specs beyond an empty one.
  std::string str_format(std::string_view f, call_args& a) const {
    std::string out;
    std::size_t auto_index = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const char c = f[i];
      if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
        out += c;
        ++i;
        continue;
      }
      if (c == '}') error("single '}' encountered in format string");
      if (c != '{') {
        out += c;
        continue;
      }
      const std::size_t close = f.find('}', i);
      if (close == std::string_view::npos) error("single '{' encountered in format string");
      std::string_view field = f.substr(i + 1, close - i - 1);
      if (field.find(':') != std::string_view::npos || field.find('!') != std::string_view::npos)
        error("str.format: format specs and conversions are not supported");
      const value* v = nullptr;
      if (field.empty()) {
        if (auto_index >= a.positional.size()) error("str.format: replacement index ", auto_index, " out of range");
        v = &a.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), is_digit)) {
        std::size_t k = 0;
        if (std::from_chars(field.data(), field.data() + field.size(), k).ec != std::errc() || k >= a.positional.size())
          error("str.format: replacement index ", std::string(field), " out of range");
        v = &a.positional[k];
      } else {
        for (const auto& [k, val] : a.keyword)
          if (k == field) v = &val;
        if (!v) error("str.format: no argument named '", std::string(field), "'");
      }
      out += py_str(*v);
      i = close;
    }
    return out;
  }

  // ---- filters ----
  // Applies the chain of filters ending at `e`; the innermost filter's input is `input` when its own
  // input expression is null (a filter block or {% set x | f %}).
  value apply_filters(const expr& e, value input) {
    if (e.type != expr::kind::filter) return eval(e);
    value subject = e.args[0] ? (e.args[0]->type == expr::kind::filter ? apply_filters(*e.args[0], std::move(input))
                                                                      : eval(*e.args[0]))
                              : std::move(input);
    call_args a = eval_args(e, 1);
    return filter(e.name, subject, a);
  }

  value filter(const std::string& name, const value& v, call_args& a) {
    const bool generator = name == "map" || name == "select" || name == "reject" || name == "selectattr" ||
                           name == "rejectattr" || name == "unique" || name == "batch";
    if (!generator) return eager_filter(name, v, a);
    // jinja2's generator filters run when their result is iterated: an error inside one (a test or a filter
    // failing on an item) waits for that.
    try {
      return eager_filter(name, v, a);
    } catch (const zipage::error& e) {
      return value::failed_generator(e.what());
    }
  }

  value eager_filter(const std::string& name, const value& v, call_args& a) {
    auto arg = [&](std::string_view key, std::size_t i) { return a.get(key, i); };
    auto flag = [&](std::string_view key, std::size_t i, bool def) {
      const value* x = arg(key, i);
      return x ? truthy(*x) : def;
    };
    auto need_string = [&](const value& x) -> std::string {
      if (x.is_undefined()) return {};
      return py_str(x);
    };
    auto list_of = [&](const value& x) { return iterate(x); };
    // jinja2's generator filters fail only when their result is iterated.
    // (map and the select family skip a false input: `if value` in jinja2.)
    const bool guarded = name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr";
    if ((guarded || name == "unique" || name == "batch") && !iterable(v) && (truthy(v) || !guarded))
      return value::failed_generator(located("'" + std::string(py_type_name(v)) + "' object is not iterable"));
    if (name == "items" && !v.is_undefined() && !v.is_dict())
      return value::failed_generator(located("Can only get item pairs from a mapping."));
    if (name == "safe") return v.is_markup() ? v : value::markup(need_string(v));
    if (name == "forceescape") return value::markup(html_escape(need_string(v)));
    if (name == "e" || name == "escape") return v.is_markup() ? v : value::markup(html_escape(need_string(v)));
    if (name == "trim") {
      const value* chars = arg("chars", 0);
      return value(py_strip(need_string(v), chars && chars->is_string() ? std::optional<std::string>(chars->as_string()) : std::nullopt, true, true));
    }
    if (name == "upper") return value(ascii_upper(need_string(v)));
    if (name == "lower") return value(ascii_lower(need_string(v)));
    if (name == "title") {  // jinja2's: words begin after '-', whitespace, '(', '{', '[' or '<'
      std::string s = need_string(v);
      bool start = true;
      for (char& c : s) {
        const bool boundary = c == '-' || is_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
        if (boundary) {
          start = true;
          continue;
        }
        if (start && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
        else if (!start && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
        start = false;
      }
      return value(std::move(s));
    }
    if (name == "capitalize") return value(py_capitalize(need_string(v)));
    if (name == "string") return v.is_string() ? v : value(need_string(v));
    if (name == "length" || name == "count") return value(length_of(v));
    if (name == "wordcount") {  // runs of \w (letters, digits, '_'; any non-ASCII character counts as a letter)
      std::int64_t words = 0;
      bool in_word = false;
      for (const char c : need_string(v)) {
        const bool w = ascii_alpha(c) || is_digit(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
        words += w && !in_word;
        in_word = w;
      }
      return value(words);
    }
    if (name == "tojson") {
      dump_options o;
      o.ensure_ascii = flag("ensure_ascii", 0, false);
      if (const value* indent = arg("indent", 1); indent && !indent->is_none()) {
        if (!indent->is_int()) error("tojson: indent must be an integer");
        o.indent = static_cast<int>(indent->as_int());
        o.item_separator = ",";
      }
      if (const value* sep = arg("separators", 2); sep && !sep->is_none()) {
        if (!sep->is_list() || sep->as_list().size() != 2 || !sep->as_list()[0].is_string() || !sep->as_list()[1].is_string())
          error("tojson: separators must be a pair of strings");
        o.item_separator = sep->as_list()[0].as_string();
        o.key_separator = sep->as_list()[1].as_string();
      }
      o.sort_keys = flag("sort_keys", 3, false);
      if (v.is_undefined()) undefined_error(v);
      try {
        return value(to_json(v, o));
      } catch (const zipage::error& x) {
        error("tojson: ", x.what());
      }
    }
    if (name == "d" || name == "default") {
      const value* def = arg("default_value", 0);
      const bool boolean = flag("boolean", 1, false);
      if (v.is_undefined() || (boolean && !truthy(v))) return def ? *def : value("");
      return v;
    }
    if (name == "first" || name == "last") {
      if (v.is_undefined()) return value::undefined("no " + name + " item, the sequence is undefined");
      if (name == "last" && v.is_generator()) error("'generator' object is not reversible");
      const std::vector<value> items = list_of(v);
      if (items.empty()) return value::undefined("no " + name + " item, the sequence was empty");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return value::list(list_of(v));
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.as_string());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return value(std::move(out));
      }
      std::vector<value> items = list_of(v);
      std::reverse(items.begin(), items.end());
      // Python's reversed() gives an iterator; a generator cannot be reversed, so jinja2 makes a list of it
      return value::list(std::move(items), v.is_generator() ? seq_kind::list : seq_kind::generator);
    }
    if (name == "join") {
      const value* sep = arg("d", 0);
      const value* attribute = arg("attribute", 1);
      std::string out;
      bool first = true;
      for (const value& item : list_of(v)) {
        if (!first) out += sep ? py_str(*sep) : "";
        out += py_str(attribute ? get_path(item, *attribute) : item);
        first = false;
      }
      return value(std::move(out));
    }
    if (name == "replace") {
      const value *from = arg("old", 0), *to = arg("new", 1), *count = arg("count", 2);
      if (!from || !to) error("replace: needs the old and the new text");
      return value(py_replace(need_string(v), py_str(*from), py_str(*to), count && count->is_int() ? count->as_int() : -1));
    }
    if (name == "indent") {
      const value* width = arg("width", 0);
      const std::int64_t n = width && width->is_int() ? std::clamp<std::int64_t>(width->as_int(), 0, 4096) : 4;
      const std::string pad = width && width->is_string() ? width->as_string() : std::string(static_cast<std::size_t>(n), ' ');
      const bool first = flag("first", 1, false), blank = flag("blank", 2, false);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_string()) error("indent: expected a string, got '", py_type_name(v), "'");
      const std::string& s = v.as_string();
      std::vector<std::string> lines = py_split(s, std::string("\n"), -1);
      std::string out;
      for (std::size_t i = 0; i < lines.size(); ++i) {
        if (i) out += '\n';
        if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
        out += lines[i];
      }
      return value(std::move(out));
    }
    if ((name == "int" || name == "float") && v.is_undefined()) undefined_error(v);
    if (name == "int") {
      if (v.is_int()) return value(v.as_int());
      if (v.is_number()) {
        if (!(std::fabs(v.as_double()) < 9.2e18)) error("int: ", py_float_repr(v.as_double()), " is out of the 64-bit range");
        return value(static_cast<std::int64_t>(v.as_double()));
      }
      const value* def = arg("default", 0);
      const value* base = arg("base", 1);
      if (v.is_string()) {  // jinja2: int(value, base), else int(float(value)), else the default
        const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
        if (const auto i = py_parse_int(s, base && base->is_int() ? base->as_int() : 10)) return value(*i);
        if (const auto d = py_parse_float(s); d && std::isfinite(*d)) {  // inf, nan: the default, as in jinja2
          if (!(std::fabs(*d) < 9.2e18)) error("int: ", py_float_repr(*d), " is out of the 64-bit range");
          return value(static_cast<std::int64_t>(*d));
        }
      }
      return def ? *def : value(0);
    }
    if (name == "float") {
      if (v.is_number()) return value(v.as_double());
      const value* def = arg("default", 0);
      if (v.is_string())
        if (const auto d = py_parse_float(py_strip(v.as_string(), std::nullopt, true, true))) return value(*d);
      return def ? *def : value(0.0);
    }
    if (name == "abs") {
      if (!v.is_number()) error("bad operand type for abs(): '", py_type_name(v), "'");
      return v.is_int() ? value(v.as_int() < 0 ? -v.as_int() : v.as_int()) : value(std::fabs(v.as_double()));
    }
    if (name == "round") {
      const value* precision = arg("precision", 0);
      const value* method = arg("method", 1);
      const double scale = std::pow(10.0, precision && precision->is_int() ? static_cast<double>(precision->as_int()) : 0.0);
      const std::string m = method && method->is_string() ? method->as_string() : "common";
      if (m != "common" && m != "ceil" && m != "floor") error("round: method must be common, ceil or floor");
      if (!v.is_number()) error("round: type ", py_type_name(v), " doesn't define __round__ method");
      if (v.is_int() && m == "common") return value(v.as_int());  // Python's round() keeps an int an int
      const std::int64_t digits = precision && precision->is_int() ? precision->as_int() : 0;
      if (m == "common" && digits >= 0 && std::isfinite(v.as_double())) {
        // Python rounds the double's exact decimal value (2.675 is 2.67499...: 2.67), halves to even; so does
        // to_chars with a precision. Beyond 340 digits every double is already exact.
        if (digits > 340) return value(v.as_double());
        char text[720];
        const auto r = std::to_chars(text, text + sizeof text, v.as_double(), std::chars_format::fixed,
                                     static_cast<int>(digits));
        double out = 0.0;
        std::from_chars(text, r.ptr, out);
        return value(out);
      }
      const double x = v.as_double() * scale;
      // "common" is Python's round(): halves to even
      const double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);
      return value(r / scale);
    }
    if (name == "items") {
      if (v.is_undefined()) return value::list({}, seq_kind::generator);
      if (!v.is_dict()) error("items: expected a mapping, got '", py_type_name(v), "'");
      value_list out;
      for (const auto& [k, e] : v.as_dict().items) out.push_back(value::list({k, e}, seq_kind::tuple));
      return value::list(std::move(out), seq_kind::generator);
    }
    if (name == "dictsort") {
      if (!v.is_dict()) error("dictsort: expected a mapping, got '", py_type_name(v), "'");
      const bool case_sensitive = flag("case_sensitive", 0, false);
      const value* by = arg("by", 1);
      const bool by_value = by && by->is_string() && by->as_string() == "value";
      const bool reverse = flag("reverse", 2, false);
      value_list out;
      for (const auto& [k, e] : v.as_dict().items) out.push_back(value::list({k, e}, seq_kind::tuple));
      sort_values(out, [&](const value& x) { return sort_key(x.as_list()[by_value ? 1 : 0], case_sensitive); }, reverse);
      return value::list(std::move(out));
    }
    if (name == "sort") {
      const bool reverse = flag("reverse", 0, false), case_sensitive = flag("case_sensitive", 1, false);
      const value* attribute = arg("attribute", 2);
      std::vector<value> items = list_of(v);
      sort_values(items, [&](const value& x) { return sort_key(attribute ? get_path(x, *attribute) : x, case_sensitive); }, reverse);
      return value::list(std::move(items));
    }
    if (name == "unique") {
      const bool case_sensitive = flag("case_sensitive", 0, false);
      const value* attribute = arg("attribute", 1);
      std::vector<value> out, keys;
      for (const value& x : list_of(v)) {
        value k = sort_key(attribute ? get_path(x, *attribute) : x, case_sensitive);
        if (std::any_of(keys.begin(), keys.end(), [&](const value& y) { return equal(y, k); })) continue;
        keys.push_back(std::move(k));
        out.push_back(x);
      }
      return value::list(std::move(out), seq_kind::generator);
    }
    if (name == "min" || name == "max") {
      const bool case_sensitive = flag("case_sensitive", 0, false);
      const value* attribute = arg("attribute", 1);
      std::vector<value> items = list_of(v);
      if (items.empty()) return value::undefined("no " + name + " item, the sequence was empty");
      std::size_t best = 0;
      for (std::size_t i = 1; i < items.size(); ++i) {
        const value a1 = sort_key(attribute ? get_path(items[i], *attribute) : items[i], case_sensitive);
        const value b1 = sort_key(attribute ? get_path(items[best], *attribute) : items[best], case_sensitive);
        const int c = checked_compare(a1, b1);
        if (name == "min" ? c < 0 : c > 0) best = i;
      }
      return items[best];
    }
    if (name == "sum") {
      const value* attribute = arg("attribute", 0);
      const value* start = arg("start", 1);
      value total = start ? *start : value(0);
      for (const value& x : list_of(v)) total = binary("+", total, attribute ? get_path(x, *attribute) : x);
      return total;
    }
    if (name == "attr") {
      const value* attribute = arg("name", 0);
      if (!attribute || !attribute->is_string()) error("attr: needs an attribute name");
      return get_attr(v, attribute->as_string());
    }
    if (name == "map") {
      std::vector<value> out;
      if (!truthy(v)) return value::list({}, seq_kind::generator);  // Jinja maps over `if value`
      const value* attribute = nullptr;
      for (const auto& [k, x] : a.keyword)
        if (k == "attribute") attribute = &x;
      if (attribute) {
        const value* def = nullptr;
        for (const auto& [k, x] : a.keyword)
          if (k == "default") def = &x;
        for (const value& x : list_of(v)) {
          value got = get_path(x, *attribute);
          out.push_back(got.is_undefined() && def ? *def : got);
        }
        return value::list(std::move(out), seq_kind::generator);
      }
      if (a.positional.empty() || !a.positional[0].is_string()) error("map: needs a filter name or attribute=");
      const std::string f = a.positional[0].as_string();
      if (!known_filter(f)) error("map: no filter named '", f, "'");
      call_args rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.keyword = a.keyword;
      for (const value& x : list_of(v)) {
        call_args copy = rest;
        out.push_back(filter(f, x, copy));
      }
      return value::list(std::move(out), seq_kind::generator);
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.ends_with("attr");
      const bool keep_if = name.starts_with("select");
      std::size_t next = 0;
      const value* attribute = nullptr;
      if (by_attr) {
        if (a.positional.empty()) error(name, ": needs an attribute name");
        attribute = &a.positional[next++];
      }
      std::string test_name;
      if (next < a.positional.size()) {
        if (!a.positional[next].is_string()) error(name, ": the test must be named by a string");
        test_name = a.positional[next++].as_string();
        if (!known_test(test_name)) error(name, ": no test named '", test_name, "'");
      }
      call_args test_args;
      test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
      std::vector<value> out;
      if (!truthy(v)) return value::list({}, seq_kind::generator);  // Jinja selects over `if value`
      for (const value& x : list_of(v)) {
        const value subject = attribute ? get_path(x, *attribute) : x;
        call_args copy = test_args;
        const bool passed = test_name.empty() ? truthy(subject) : run_test(test_name, subject, copy);
        if (passed == keep_if) out.push_back(x);
      }
      return value::list(std::move(out), seq_kind::generator);
    }
    if (name == "batch") {
      const value* size = arg("linecount", 0);
      if (!size || !size->is_int() || size->as_int() <= 0) error("batch: needs a positive size");
      const value* fill = arg("fill_with", 1);
      std::vector<value> out, cur;
      for (const value& x : list_of(v)) {
        cur.push_back(x);
        if (static_cast<std::int64_t>(cur.size()) == size->as_int()) {
          out.push_back(value::list(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (fill)
          while (static_cast<std::int64_t>(cur.size()) < size->as_int()) cur.push_back(*fill);
        out.push_back(value::list(std::move(cur)));
      }
      return value::list(std::move(out), seq_kind::generator);
    }
    if (name == "center") {
      const value* width = arg("width", 0);
      const std::string s = need_string(v);
      const std::int64_t w = width && width->is_int() ? std::min<std::int64_t>(width->as_int(), 1 << 20) : 80;
      const std::int64_t n = static_cast<std::int64_t>(code_points(s).size());
      if (n >= w) return value(s);
      const std::int64_t total = w - n, left = total / 2 + (total & w & 1);
      return value(std::string(static_cast<std::size_t>(left), ' ') + s + std::string(static_cast<std::size_t>(total - left), ' '));
    }
    if (name == "format") {
      value_list args = a.positional;
      return value(percent_format(need_string(v), args));
    }
    error("no filter named '", name, "'");
  }

  // "a.b.0" paths of the attribute= arguments (map, selectattr, sort, join, sum).
  value get_path(const value& x, const value& path) {
    if (path.is_int()) return get_item(x, path);
    value cur = x;
    for (const std::string& part : py_split(py_str(path), std::string("."), -1)) {
      if (cur.is_undefined()) return cur;
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), is_digit);
      std::int64_t index = 0;
      const bool numeric = digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
      cur = numeric ? get_item(cur, value(index)) : get_item(cur, value(part));
    }
    return cur;
  }

  static value sort_key(const value& x, bool case_sensitive) {
    return !case_sensitive && x.is_string() ? value(ascii_lower(x.as_string())) : x;
  }
  int checked_compare(const value& a, const value& b) const {
    try {
      return compare(a, b);
    } catch (const zipage::error& x) {
      error(x.what());
    }
  }
  template <class Key>
  void sort_values(std::vector<value>& items, Key key, bool reverse) const {
    std::vector<std::pair<value, std::size_t>> keyed;
    for (std::size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      const int c = checked_compare(x.first, y.first);
      return reverse ? c > 0 : c < 0;
    });
    std::vector<value> sorted;
    for (const auto& [k, i] : keyed) sorted.push_back(items[i]);
    items = std::move(sorted);
  }

  // ---- tests ----
  bool run_test(const std::string& name, const value& v, call_args& a) {
    static constexpr std::string_view unary[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer",
                                                 "float", "number", "string", "mapping", "iterable", "sequence",
                                                 "callable", "escaped", "lower", "upper", "even", "odd", "filter", "test"};
    if (std::find(std::begin(unary), std::end(unary), name) != std::end(unary) && !(a.positional.empty() && a.keyword.empty()))
      error("test '", name, "' takes no argument (", name, "() takes 1 positional argument)");
    auto other = [&]() -> const value& {
      if (a.positional.empty()) error("test '", name, "' needs an argument");
      return a.positional[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_int() != 0;
    if (name == "false") return v.is_bool() && v.as_int() == 0;
    if (name == "integer") return v.type() == value::kind::integer;
    if (name == "float") return v.type() == value::kind::number;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict() && !v.is_namespace();
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
    if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_indexable() || (v.is_dict() && !v.is_namespace());
    if (name == "callable") return v.is_function() || v.is_undefined();  // (jinja2's Undefined defines __call__)
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {  // str(value).islower() / .isupper(): a cased letter, none of the other case
      const std::string s = py_str(v);
      bool cased = false;
      for (const char c : s) {
        const bool up = c >= 'A' && c <= 'Z', low = c >= 'a' && c <= 'z';
        if ((name == "lower" && up) || (name == "upper" && low)) return false;
        cased = cased || up || low;
      }
      return cased;
    }
    if (name == "even" || name == "odd" || name == "divisibleby") {  // value % n as Python computes it
      const value n = name == "divisibleby" ? other() : value(2);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number() || !n.is_number()) error("test '", name, "': unsupported operand type(s) for %: '", py_type_name(v), "' and '", py_type_name(n), "'");
      const value rest = binary("%", v, n);
      return equal(rest, value(name == "odd" ? 1 : 0));
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
    if (name == "ne" || name == "!=") return !equal(v, other());
    if (name == "sameas") {
      const value& o = other();
      if (v.type() != o.type()) return false;
      return v.is_none() || v.is_undefined() || ((v.is_bool() || v.is_int()) && v.as_int() == o.as_int()) ||
             (v.is_string() && &v.as_string() == &o.as_string());
    }
    if (name == "in") return contains(other(), v);
    if (name == "filter") return v.is_string() && known_filter(v.as_string());
    if (name == "test") return v.is_string() && known_test(v.as_string());
    if (!known_test(name)) error("no test named '", name, "'");
    const std::string op = name == "lt" || name == "lessthan" ? "<" : name == "le" ? "<=" : name == "gt" || name == "greaterthan" ? ">"
                           : name == "ge" ? ">=" : name;
    return compare_op(op, v, other());
  }

  // ---- globals ----
  // dict(...) / namespace(...)'s items: those of mappings given positionally, then the keyword arguments.
  value_dict mapping_of(const call_args& a, const char* function) const {
    value_dict d;
    for (const value& v : a.positional) {
      if (!v.is_dict()) error(function, "() takes a mapping");
      for (const auto& [k, e] : v.as_dict().items) d.set(k, e);
    }
    for (const auto& [k, e] : a.keyword) d.set(k, e);
    return d;
  }

  void install_globals() {
    auto define = [&](const char* name, native_function f) {
      if (!globals_.find(name)) globals_.set(name, value::function(std::move(f)));
    };
    define("raise_exception", [](call_args& a) -> value {
      fail("chat template: ", a.positional.empty() ? std::string("raise_exception() called") : py_str(a.positional[0]));
    });
    define("range", [this](call_args& a) -> value {
      std::int64_t start = 0, stop = 0, step = 1;
      for (const value& v : a.positional)
        if (!v.is_int()) error("range() arguments must be integers, got '", py_type_name(v), "'");
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else if (a.positional.size() == 2 || a.positional.size() == 3) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      } else {
        error("range() takes 1 to 3 arguments");
      }
      if (step == 0) error("range() arg 3 must not be zero");
      value_list out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop;) {
        out.emplace_back(i);
        if (out.size() > 1000000) error("range() is too large");
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return value::list(std::move(out));
    });
    define("dict", [this](call_args& a) -> value { return value::dict(mapping_of(a, "dict")); });
    define("namespace", [this](call_args& a) -> value { return value::dict(mapping_of(a, "namespace"), /*is_namespace=*/true); });
    define("strftime_now", [this](call_args& a) -> value {
      if (a.positional.size() != 1 || !a.positional[0].is_string()) error("strftime_now() takes one format string");
      std::tm tm{};
      if (options_.now) {
        tm = *options_.now;
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[256];
      const std::size_t n = std::strftime(buf, sizeof buf, a.positional[0].as_string().c_str(), &tm);
      return value(std::string(buf, n));
    });
  }
};

}  // namespace detail

inline std::string template_::render(const std::vector<std::pair<std::string, value>>& variables,
                                     const render_options& options) const {
  std::string out;
  detail::renderer r(variables, options);
  r.run(*body_, out);
  return out;
}

}  // namespace zipage::jinja
