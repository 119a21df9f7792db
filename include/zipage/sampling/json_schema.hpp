#pragma once
// JSON structured outputs (vLLM's guided_json / response_format json_schema, and json_object): a JSON Schema
// compiled to a regex in the subset zipage/sampling/guided.hpp accepts, which guided.hpp then compiles to a DFA
// like any guided_regex (with multipleOf's automata embedded: json_schema_compiled). The output is compact JSON
// with optional whitespace between tokens (`[ ]?` unless a whitespace pattern is given, as outlines), object keys in
// the schema's declared order.
//
// Supported, as outlines' build_regex_from_schema:
//   type: object (properties in order; those not in `required` may be left out; a name in `required` that
//         `properties` does not describe comes after them with any value; no other keys are generated, as if
//         additionalProperties were false; an object schema without `properties` or `required` is any JSON
//         object), array (items, minItems, maxItems), string (minLength, maxLength, pattern, format date / time /
//         date-time / duration / uuid / email / hostname / ipv4; another format is what JSON Schema makes it by
//         default, an annotation: the string is free), integer, number, boolean, null, and lists of types;
//   enum and const of any JSON value (written compactly), anyOf and oneOf (oneOf's exclusivity is not enforced),
//   allOf of one schema, $ref to a JSON pointer into the schema (#, #/$defs/..., #/definitions/...), and {} or
//   true: any JSON value. Recursion (a $ref inside its own target; any value's containers) two ways, as the caller
//   asks (json_schema_nesting): `calls`, exact: a recursive $ref, and every free-form value, is a call (?&N) of a
//   rule of its own, which guided.hpp compiles to a pushdown grammar (pushdown.hpp; what compile_guided_json does);
//   `unrolled`, for a plain DFA: a recursive $ref is an error naming it, free-form containers nest at most
//   json_any_depth deep.
// minimum, maximum, exclusiveMinimum and exclusiveMaximum (numbers, or draft 4's booleans) on integer and number
// (json_number_range.hpp: exact decimal bounds), and multipleOf on integer and number (json_multiple_of.hpp: exact
// for a decimal divisor, such as 7, 0.01 or 2.5; with the bounds, an automaton guided.hpp builds, of at most
// guided_max_dfa_states states like the whole schema's DFA, else an error naming it); a bounded number or one with
// multipleOf is written without an exponent. A schema without a type that has one of them is a number. A range no
// value fits, or no multiple, is an error naming it; so is a multipleOf that is not a number above 0 of at most 18
// significant digits (json_multiple_of::max_digits; within json_number_range's limits).
// An unbounded number's exponent has at most two digits (so that every number fits a double).
// A `pattern` is a whole-string match (anchors stripped) whose characters are written into the JSON string raw:
// a pattern that allows '"', '\' or control characters can make the output invalid JSON.
// Keywords that would change the language otherwise (patternProperties, additionalProperties as a schema, not,
// if / then / else, dependentSchemas, uniqueItems, prefixItems, ...) are errors naming the keyword and the JSON
// pointer of the schema holding it; annotations (title, description, examples, default, $schema, $id, ...) and
// unknown keywords are ignored.
// The DFA is capped as a regex's is (guided.hpp: guided_max_dfa_states, bounded construction work): bounded
// strings of a few hundred characters in all, or many free-form values ({}), pass it and are refused as
// "guided_json: the schema needs more than ... / is too complex to compile". A free-form value's regex is large
// (~16 KB for {}), so such a schema takes ~0.1 s to compile.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/sampling/json_multiple_of.hpp"
#include "zipage/sampling/json_number_range.hpp"
#include "zipage/sampling/regex_text.hpp"

namespace zipage {

// How deep containers nest in a value the schema leaves free ({}, true, json_object, an array without items):
// the DFA grows with it (see test_guided's json_object case for the state count).
inline constexpr int json_any_depth = 3;
inline constexpr int json_schema_max_depth = 64;  // schemas nested deeper are refused (the compiler recurses)
inline constexpr std::size_t json_schema_max_regex_bytes = 512 * 1024;  // far more than the DFA's cap admits

// A number that must be a multiple of multipleOf. The regex text writes it as (?%N), N its index in
// json_schema_compiled::multiples (guided.hpp's parser reads that syntax only where the caller supplies the
// automata, as guided.hpp does for a schema, never in a user's regex or pattern).
struct json_schema_multiple {
  std::string spelling;  // regex of the number's spellings within its bounds, without an exponent
  json_multiple_of::divisor divisor;
  bool integer_only = false;
  std::string value;  // multipleOf as the schema writes it, and where: the JSON pointer of its schema (for errors)
  std::string place;
};

// How a schema's recursion is compiled (see the top of this file).
enum class json_schema_nesting { unrolled, calls };

// A schema's regex, the multipleOf constraints it refers to, and (json_schema_nesting::calls) the rules its calls
// name: (?&N) calls rule N, rule 0 being `regex` itself (the root schema) and rule N >= 1 rules[N - 1], named
// rule_names[N - 1] (a $ref's target, or "{}" for any JSON value).
struct json_schema_compiled {
  std::string regex;
  std::vector<json_schema_multiple> multiples;
  std::vector<std::string> rules{};
  std::vector<std::string> rule_names{};
};

namespace json_schema_detail {

using schema = nlohmann::ordered_json;

using regex_text::quote;

// One character of a JSON string: any character but '"', '\' and control characters, or an escape.
inline const std::string string_char =
    R"((?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}))";
inline const std::string integer = R"(-?(?:0|[1-9][0-9]*))";
// Exponents of at most two digits: every number the guide allows fits a double (parsers such as nlohmann-json
// refuse 1e400).
inline const std::string number = integer + R"((?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?)";

inline std::string format_regex(const std::string& format) {
  const std::string date = R"([0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01]))";
  const std::string hour = "(?:[01][0-9]|2[0-3])";
  const std::string time = hour + R"(:[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-])" + hour + ":[0-5][0-9])?";
  if (format == "date") return date;
  if (format == "time") return time;
  if (format == "date-time") return date + "T" + time;
  if (format == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
  if (format == "hostname") return label + R"((?:\.)" + label + ")*";
  if (format == "email") return R"([A-Za-z0-9._%+-]+@)" + label + R"((?:\.)" + label + ")+";
  const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  if (format == "ipv4") return "(?:" + octet + R"(\.){3})" + octet;
  if (format == "duration")
    return R"(P(?:[0-9]+Y)?(?:[0-9]+M)?(?:[0-9]+W)?(?:[0-9]+D)?(?:T(?:[0-9]+H)?(?:[0-9]+M)?(?:[0-9]+(?:\.[0-9]+)?S)?)?)";
  return {};  // another format: an annotation only (JSON Schema's default), the string is free
}

// A property name as a JSON pointer's token ('~' and '/' escaped), for the paths errors name.
inline std::string pointer_token(const std::string& name) {
  std::string out;
  for (const char c : name) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// A pattern's anchors dropped: the guide matches the whole string anyway.
inline std::string strip_anchors(std::string p) {
  if (!p.empty() && p.front() == '^') p.erase(0, 1);
  std::size_t backslashes = 0;
  for (std::size_t i = p.size() - std::min<std::size_t>(p.size(), 1); i > 0 && p[i - 1] == '\\'; --i) ++backslashes;
  if (!p.empty() && p.back() == '$' && backslashes % 2 == 0) p.pop_back();
  return p;
}

inline bool is_annotation(const std::string& key) {
  static const std::set<std::string, std::less<>> keys = {
      "title", "description", "examples", "default", "$schema", "$id", "$comment", "$defs", "definitions",
      "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$anchor", "strict"};
  return keys.contains(key);
}
inline bool is_unsupported(const std::string& key) {
  static const std::set<std::string, std::less<>> keys = {
      "patternProperties", "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
      "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
      "prefixItems", "additionalItems", "uniqueItems", "minProperties", "maxProperties", "$dynamicRef",
      "$recursiveRef"};
  return keys.contains(key);
}

class compiler {
 public:
  // `check_pattern` throws zipage::error for a `pattern` the regex compiler would refuse.
  compiler(const schema& root, std::string ws, std::function<void(const std::string&)> check_pattern,
           json_schema_nesting nesting = json_schema_nesting::unrolled)
      : root_(root), ws_(std::move(ws)), check_pattern_(std::move(check_pattern)),
        calls_(nesting == json_schema_nesting::calls) {}

  // The whole schema: the root's regex, and with calls the rules they name (each compiled once, in the order first
  // called, a rule's own calls appended as it is compiled).
  json_schema_compiled compile() {
    json_schema_compiled out;
    if (calls_) {
      called_ = {"#"};  // a $ref to "#" while the root is compiled calls rule 0
      refs_ = {"#"};
    }
    out.regex = value(root_, "");
    for (std::size_t k = 1; k < called_.size(); ++k) {
      const std::string target = called_[k];  // a copy: compiling grows called_
      refs_ = {target};
      out.rules.push_back(target == any_rule ? any_value() : value(*resolve(target, target), target.substr(1), 1));
      out.rule_names.push_back(target);
    }
    out.multiples = multiples_;
    return out;
  }

  // The value's regex. Its size is bounded as it grows: $refs used twice at each of many levels would otherwise
  // double it level after level.
  std::string value(const schema& s, const std::string& path, int depth = 0) {
    std::string re = value_of(s, path, depth);
    check(re.size() <= json_schema_max_regex_bytes, "the schema's regex passes ", json_schema_max_regex_bytes,
          " bytes at ", at(path), "; simplify it");
    return re;
  }

  // The multipleOf constraints the regexes made so far refer to, each once.
  [[nodiscard]] std::vector<json_schema_multiple> multiples() const { return multiples_; }

 private:
  const schema& root_;
  std::string ws_;
  std::function<void(const std::string&)> check_pattern_;
  bool calls_ = false;
  std::vector<std::string> called_;  // calls_: the rules calls name, by index ("#": the root, any_rule: {})
  static constexpr const char* any_rule = "{}";
  std::vector<std::string> refs_;  // the $refs being expanded (a repeat is recursion)
  std::map<std::string, std::string, std::less<>> expanded_;  // each $ref's regex, made once
  std::vector<json_schema_multiple> multiples_;
  std::map<std::tuple<std::string, std::uint64_t, int>, std::size_t> multiple_index_;  // the same one, once

  std::string value_of(const schema& s, const std::string& path, int depth) {
    check(depth <= json_schema_max_depth, "the schema nests more than ", json_schema_max_depth, " deep at ",
          at(path));
    if (s.is_boolean()) {
      check(s.get<bool>(), "the schema at ", at(path), " is false (no value matches it)");
      return any(json_any_depth);
    }
    check(s.is_object(), "the schema at ", at(path), " must be an object or a boolean, got ", brief(s));
    check_keywords(s, path);
    if (const auto it = s.find("$ref"); it != s.end()) return ref(*it, path, depth);
    if (const auto it = s.find("const"); it != s.end()) return literal_value(*it);
    if (const auto it = s.find("enum"); it != s.end()) return enumeration(*it, path);
    for (const char* key : {"anyOf", "oneOf"})
      if (const auto it = s.find(key); it != s.end()) return any_of(*it, path + "/" + key, depth);
    if (const auto it = s.find("allOf"); it != s.end()) {
      check(it->is_array() && it->size() == 1, "'allOf' at ", at(path), " must hold exactly one schema (merging ",
            "several is not supported)");
      return value((*it)[0], path + "/allOf/0", depth + 1);
    }
    const auto type = s.find("type");
    if (type == s.end()) return untyped(s, path, depth);
    if (type->is_array()) {
      check(!type->empty(), "'type' at ", at(path), " is an empty list");
      std::vector<std::string> alts;
      for (const auto& t : *type) alts.push_back(typed(s, type_name(t, path), path, depth));
      return alternation(alts);
    }
    return typed(s, type_name(*type, path), path, depth);
  }

  static std::string at(const std::string& path) { return path.empty() ? "/ (the root)" : path; }
  // A value as errors quote it: its JSON, cut short.
  static std::string brief(const schema& v) {
    const std::string text = v.dump();
    return text.size() > 60 ? text.substr(0, 60) + "..." : text;
  }

  static void check_keywords(const schema& s, const std::string& path) {
    for (const auto& [key, v] : s.items()) {
      check(!is_unsupported(key), "'", key, "' at ", at(path), " is not supported");
      if (key == "additionalProperties")
        check(v.is_boolean(), "'additionalProperties' as a schema at ", at(path), " is not supported (only "
              "true or false; no keys but the listed properties are generated)");
    }
  }

  static std::string type_name(const schema& t, const std::string& path) {
    check(t.is_string(), "'type' at ", at(path), " must be a string or a list of strings, got ", brief(t));
    return t.get<std::string>();
  }

  static std::string alternation(const std::vector<std::string>& alts) { return regex_text::alternation(alts); }

  std::string ref(const schema& r, const std::string& path, int depth) {
    check(r.is_string(), "'$ref' at ", at(path), " must be a string");
    const std::string target = r.get<std::string>();
    check(target.starts_with("#"), "'$ref' \"", target, "\" at ", at(path), " is not supported (only references "
          "into the schema itself, such as #/$defs/name)");
    const schema* resolved = resolve(target, path);
    // With calls, a target that is a rule already is called rather than expanded again.
    if (calls_ && std::find(called_.begin(), called_.end(), target) != called_.end()) return call(target);
    if (std::find(refs_.begin(), refs_.end(), target) != refs_.end()) {
      check(calls_, "recursive '$ref' \"", target, "\" at ", at(path), " is not supported (its values would nest ",
            "without bound)");
      return call(target);
    }
    if (const auto it = expanded_.find(target); it != expanded_.end()) return it->second;
    refs_.push_back(target);
    std::string out = value(*resolved, target.substr(1), depth + 1);
    refs_.pop_back();
    expanded_.emplace(target, out);
    return out;
  }

  const schema* resolve(const std::string& target, const std::string& path) const {
    try {
      return &root_.at(nlohmann::ordered_json::json_pointer(target.substr(1)));
    } catch (const nlohmann::json::exception&) {
      fail("'$ref' \"", target, "\" at ", at(path), " names nothing in the schema");
    }
  }
  // A call of the rule `name` (a $ref's target, or any_rule), numbered on first use.
  std::string call(const std::string& name) {
    auto it = std::find(called_.begin(), called_.end(), name);
    if (it == called_.end()) it = called_.insert(called_.end(), name);
    return "(?&" + std::to_string(it - called_.begin()) + ")";
  }

  // A JSON value as written compactly, as a regex.
  static std::string literal_value(const schema& v) { return quote(v.dump()); }

  static std::string enumeration(const schema& e, const std::string& path) {
    check(e.is_array() && !e.empty(), "'enum' at ", at(path), " must be a non-empty list");
    std::vector<std::string> alts;
    for (const auto& v : e) alts.push_back(literal_value(v));
    return alternation(alts);
  }

  std::string any_of(const schema& list, const std::string& path, int depth) {
    check(list.is_array() && !list.empty(), "'", path.substr(path.rfind('/') + 1), "' at ", at(path),
          " must be a non-empty list of schemas");
    std::vector<std::string> alts;
    for (std::size_t i = 0; i < list.size(); ++i)
      alts.push_back(value(list[i], path + "/" + std::to_string(i), depth + 1));
    return alternation(alts);
  }

  // A schema without a type: its keywords say which type it means (outlines' reading), else any value.
  std::string untyped(const schema& s, const std::string& path, int depth) {
    if (s.contains("properties") || s.contains("required")) return typed(s, "object", path, depth);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
      return typed(s, "array", path, depth);
    if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength"))
      return typed(s, "string", path, depth);
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
      if (s.contains(key)) return typed(s, "number", path, depth);
    return any(json_any_depth);
  }

  std::string typed(const schema& s, const std::string& type, const std::string& path, int depth) {
    if (type == "object") return object(s, path, depth);
    if (type == "array") return array(s, path, depth);
    if (type == "string") return string(s, path);
    if (type == "integer" || type == "number") return numeric(s, type == "integer", path);
    if (type == "boolean") return "(?:true|false)";
    if (type == "null") return "null";
    fail("'type' \"", type, "\" at ", at(path), " is not a JSON Schema type");
  }

  std::string object(const schema& s, const std::string& path, int depth) {
    const auto props = s.find("properties");
    const auto req = s.find("required");
    if (props == s.end() && req == s.end()) return any_object(json_any_depth);
    const schema no_properties = schema::object();
    const schema& declared = props == s.end() ? no_properties : *props;
    check(declared.is_object(), "'properties' at ", at(path), " must be an object");
    std::set<std::string, std::less<>> required;
    std::vector<std::string> undeclared;  // required names without a schema of their own, in `required` order
    if (req != s.end()) {
      check(req->is_array(), "'required' at ", at(path), " must be a list of property names");
      for (const auto& k : *req) {
        check(k.is_string(), "'required' at ", at(path), " holds ", brief(k), ", which is not a property name");
        const std::string name = k.get<std::string>();
        if (required.insert(name).second && !declared.contains(name)) undeclared.push_back(name);
      }
    }
    std::vector<std::string> items;
    std::vector<bool> needed;
    auto member = [&](const std::string& key, const std::string& value_re) {
      items.push_back(quote(schema(key).dump()) + ws_ + ":" + ws_ + value_re);
      needed.push_back(required.contains(key));
    };
    for (const auto& [key, sub] : declared.items())
      member(key, value(sub, path + "/properties/" + pointer_token(key), depth + 1));
    // JSON Schema lets `required` name a key that `properties` does not describe: it must be there, with any value
    // (written after the declared ones).
    for (const std::string& key : undeclared) member(key, any(json_any_depth - 1));
    return "\\{" + ws_ + members(items, needed) + ws_ + "\\}";
  }

  // The properties written in order, each optional one possibly left out, commas between those written. Which
  // property comes first decides whether the next has a comma before it, so the regex is an alternation over the
  // first one written (up to the first required one), each followed by the rest with their commas.
  std::string members(const std::vector<std::string>& items, const std::vector<bool>& needed) const {
    const std::string comma = ws_ + "," + ws_;
    std::vector<std::string> rest(items.size() + 1);  // rest[i]: properties i.. after one already written
    for (std::size_t i = items.size(); i-- > 0;)
      rest[i] = (needed[i] ? comma + items[i] : "(?:" + comma + items[i] + ")?") + rest[i + 1];
    std::vector<std::string> firsts;
    bool any_required = false;
    for (std::size_t i = 0; i < items.size(); ++i) {
      firsts.push_back(items[i] + rest[i + 1]);
      if (needed[i]) {
        any_required = true;
        break;
      }
    }
    if (firsts.empty()) return "";
    return alternation(firsts) + (any_required ? "" : "?");
  }

  std::string array(const schema& s, const std::string& path, int depth) {
    const auto items = s.find("items");
    const std::string item =
        items == s.end() ? any(json_any_depth - 1) : value(*items, path + "/items", depth + 1);
    const long min = bound(s, "minItems", 0, path), max = bound(s, "maxItems", -1, path);
    check(max < 0 || min <= max, "'minItems' (", min, ") is above 'maxItems' (", max, ") at ", at(path));
    const std::string comma = ws_ + "," + ws_;
    const std::string more = "(?:" + comma + item + ")" + repeat(std::max(min - 1, 0L), max < 0 ? -1 : max - 1);
    std::string body = item + more;
    if (max == 0) body.clear();
    else if (min == 0) body = "(?:" + body + ")?";
    return "\\[" + ws_ + body + ws_ + "\\]";
  }

  std::string string(const schema& s, const std::string& path) {
    if (const auto p = s.find("pattern"); p != s.end()) {
      check(p->is_string(), "'pattern' at ", at(path), " must be a string");
      const std::string pattern = strip_anchors(p->get<std::string>());
      // Checked alone, so that an error names the pattern and its place rather than the whole schema's regex.
      try {
        if (check_pattern_) check_pattern_(pattern);
      } catch (const error& e) {
        fail("'pattern' at ", at(path), ": ", e.what());
      }
      return "\"(?:" + pattern + ")\"";
    }
    if (const auto f = s.find("format"); f != s.end()) {
      check(f->is_string(), "'format' at ", at(path), " must be a string");
      if (const std::string re = format_regex(f->get<std::string>()); !re.empty()) return "\"" + re + "\"";
    }
    const long min = bound(s, "minLength", 0, path), max = bound(s, "maxLength", -1, path);
    check(max < 0 || min <= max, "'minLength' (", min, ") is above 'maxLength' (", max, ") at ", at(path));
    return "\"" + string_char + repeat(min, max) + "\"";
  }

  // An integer or a number, within the schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum, a multiple
  // of its multipleOf.
  std::string numeric(const schema& s, bool integer_only, const std::string& path) {
    namespace nr = json_number_range;
    std::optional<nr::bound> lo, hi;
    // The tighter of two lower (upper) bounds: the larger (smaller) value, the exclusive one at a tie.
    auto tighten = [](std::optional<nr::bound>& b, const nr::bound& n, int sign) {
      if (!b) return void(b = n);
      const int c = nr::compare(n.value, b->value) * sign;
      if (c > 0 || (c == 0 && n.exclusive)) b = n;
    };
    auto read = [&](const char* key) -> std::optional<nr::decimal> {
      const auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) return std::nullopt;
      std::optional<nr::decimal> d;
      if (it->is_number()) d = nr::parse_decimal(it->dump());
      check(d.has_value(), "'", key, "' at ", at(path), " must be a number with at most ", nr::max_integer_digits,
            " digits before the point and ", nr::max_fraction_digits, " after it, got ", brief(*it));
      return d;
    };
    // Draft 4 spells an exclusive bound as minimum with exclusiveMinimum: true.
    auto draft4_exclusive = [&](const char* key) {
      const auto it = s.find(key);
      return it != s.end() && it->is_boolean() && it->get<bool>();
    };
    if (const auto d = read("minimum")) tighten(lo, {*d, draft4_exclusive("exclusiveMinimum")}, 1);
    if (const auto d = read("exclusiveMinimum")) tighten(lo, {*d, true}, 1);
    if (const auto d = read("maximum")) tighten(hi, {*d, draft4_exclusive("exclusiveMaximum")}, -1);
    if (const auto d = read("exclusiveMaximum")) tighten(hi, {*d, true}, -1);
    const auto multiple_of = s.find("multipleOf");
    std::string spelling;
    if (!lo && !hi) {
      if (multiple_of == s.end()) return integer_only ? integer : number;
      spelling = integer_only ? integer : integer + R"((?:\.[0-9]+)?)";  // no exponent, as a bounded number
    } else {
      const auto re = nr::number_range(lo, hi, integer_only);
      check(re.has_value(), "the range of minimum / maximum / exclusiveMinimum / exclusiveMaximum at ", at(path),
            " holds no ", integer_only ? "integer" : "number");
      if (multiple_of == s.end()) return *re;
      spelling = *re;
    }
    return multiple(spelling, *multiple_of, integer_only, path);
  }

  // The reference, (?%N), to a number spelled as `spelling` that is a multiple of `m` (multipleOf).
  std::string multiple(const std::string& spelling, const schema& m, bool integer_only, const std::string& path) {
    check(m.is_number(), "'multipleOf' at ", at(path), " must be a number, got ", brief(m));
    check(m.get<double>() > 0, "'multipleOf' at ", at(path), " must be above 0, got ", brief(m));
    const auto d = json_multiple_of::parse(m.dump());
    check(d.has_value(), "'multipleOf' at ", at(path), " must have at most ", json_multiple_of::max_digits,
          " significant digits and at most ", json_number_range::max_integer_digits, " before the point or ",
          json_number_range::max_fraction_digits, " after it, got ", brief(m));
    const auto [it, added] = multiple_index_.emplace(std::tuple{spelling, d->p, d->q}, multiples_.size());
    if (added) multiples_.push_back({spelling, *d, integer_only, m.dump(), at(path)});
    return "(?%" + std::to_string(it->second) + ")";
  }

  static long bound(const schema& s, const char* key, long none, const std::string& path) {
    const auto it = s.find(key);
    if (it == s.end()) return none;
    check(it->is_number_integer() && it->get<long>() >= 0 && it->get<long>() <= 1000, "'", key, "' at ", at(path),
          " must be an integer in [0, 1000], got ", brief(*it));
    return it->get<long>();
  }

  static std::string repeat(long min, long max) {
    if (max < 0) return min == 0 ? "*" : "{" + std::to_string(min) + ",}";
    return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  }

  // Any JSON value whose containers nest at most `depth` deep (0: scalars only).
  // Any JSON value (with calls: a call of the rule any_value() is; unrolled: containers `depth` deep at most).
  std::string any(int depth) {
    if (calls_) return call(any_rule);
    if (depth <= 0) return scalar();
    return "(?:" + scalar() + "|" + any_object(depth) + "|" + any_array(depth) + ")";
  }
  static std::string scalar() { return "(?:\"" + string_char + "*\"|" + number + "|true|false|null)"; }
  std::string any_object(int depth) {
    const std::string member = "\"" + string_char + "*\"" + ws_ + ":" + ws_ + any(depth - 1);
    return "\\{" + ws_ + "(?:" + member + "(?:" + ws_ + "," + ws_ + member + ")*)?" + ws_ + "\\}";
  }
  std::string any_array(int depth) {
    const std::string item = any(depth - 1);
    return "\\[" + ws_ + "(?:" + item + "(?:" + ws_ + "," + ws_ + item + ")*)?" + ws_ + "\\]";
  }
  // calls_: the rule of any JSON value, its containers' members calls of itself.
  std::string any_value() { return "(?:" + scalar() + "|" + any_object(1) + "|" + any_array(1) + ")"; }
};

}  // namespace json_schema_detail

// The regex of JSON text that `schema_text` (a JSON Schema, as JSON text) describes, and the multipleOf
// constraints it refers to (guided.hpp's json_schema_node builds their automata: the regex alone is no guided_regex
// when there are any); `whitespace` is the regex of the whitespace allowed between tokens; `check_pattern`
// (optional) throws zipage::error for a `pattern` the regex compiler refuses. Throws zipage::error for text that is
// not JSON, an unsupported keyword (naming it and its JSON pointer), a recursive $ref, a malformed keyword, or a
// regex past json_schema_max_regex_bytes.
[[nodiscard]] inline json_schema_compiled json_schema_regex(
    std::string_view schema_text, const std::string& whitespace = "[ ]?",
    std::function<void(const std::string&)> check_pattern = {},
    json_schema_nesting nesting = json_schema_nesting::unrolled) {
  json_schema_detail::schema root;
  try {
    root = json_schema_detail::schema::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    fail("the schema is not JSON (", e.what(), ")");
  }
  json_schema_detail::compiler c(root, "(?:" + whitespace + ")", std::move(check_pattern), nesting);
  return c.compile();
}

}  // namespace zipage
