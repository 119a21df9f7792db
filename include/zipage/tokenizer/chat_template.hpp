#pragma once
// Chat templates of the model families zipage loads (Qwen2/2.5/3, Llama 3/3.1, DeepSeek-R1 and friends):
// rendering plain-text conversations as each family's published Jinja template does, and recognising the
// family from a tokenizer_config.json's chat_template.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/core/json.hpp"
#include "zipage/tokenizer/jinja.hpp"

namespace zipage {

// ---------------------------------------------------------------------------------------------
// Chat templates
// ---------------------------------------------------------------------------------------------

// Each format renders what the model family's published Jinja template renders for plain text messages
// (tool calls and tool definitions left out); tests/unit/test_chat_templates.cpp holds the expected
// strings, rendered from the real templates.
struct chat_message {
  std::string role;  // "system", "user", "assistant"; "tool" (not deepseek_r1); "ipython" (llama3, llama3_1)
  std::string content;
};

enum class chat_format {
  none,         // the tokenizer has no (recognised) chat template
  chatml,       // plain ChatML: <|im_start|>role\n...<|im_end|>\n, nothing added (no default system prompt)
  qwen2,        // Qwen2-Instruct's ChatML: a default system message when the conversation has none
  qwen2_5,      // Qwen2.5-Instruct's: qwen2, plus tool results as <tool_response> blocks in user turns
  qwen3,        // Qwen3's ChatML: earlier answers lose their reasoning; thinking can be turned off
  qwq,          // QwQ-32B's ChatML: earlier answers lose their reasoning; the generation prompt opens <think>
  llama3,       // Llama 3.0: <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  llama3_1,     // Llama 3.1 and later 3.x: Llama 3.0 plus an always-present system block with the
                // "Cutting Knowledge Date"/"Today Date" lines; tool results as "ipython" turns in JSON
  deepseek_r1,  // DeepSeek-R1(-Distill): <｜begin▁of▁sentence｜>system<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
};

inline std::string_view chat_format_name(chat_format f) noexcept {
  switch (f) {
    case chat_format::chatml: return "chatml";
    case chat_format::qwen2: return "qwen2";
    case chat_format::qwen2_5: return "qwen2_5";
    case chat_format::qwen3: return "qwen3";
    case chat_format::qwq: return "qwq";
    case chat_format::llama3: return "llama3";
    case chat_format::llama3_1: return "llama3_1";
    case chat_format::deepseek_r1: return "deepseek_r1";
    default: return "none";
  }
}

// The format named by chat_format_name (e.g. a command-line choice); an unknown name is an error.
inline chat_format chat_format_from_name(std::string_view name) {
  for (const chat_format f : {chat_format::chatml, chat_format::qwen2, chat_format::qwen2_5, chat_format::qwen3,
                              chat_format::qwq, chat_format::llama3, chat_format::llama3_1, chat_format::deepseek_r1})
    if (chat_format_name(f) == name) return f;
  fail("unknown chat template '", json::printable(name),
       "' (zipage knows chatml, qwen2, qwen2_5, qwen3, qwq, llama3, llama3_1, deepseek_r1)");
}

// The default system message of qwen2 and qwen2_5 as the published templates write it (Qwen2-Instruct's,
// Qwen2.5-Instruct's); empty for the other formats. A tokenizer uses the one its own template writes.
inline std::string_view chat_format_default_system(chat_format f) noexcept {
  switch (f) {
    case chat_format::qwen2: return "You are a helpful assistant.";
    case chat_format::qwen2_5: return "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    default: return {};
  }
}

struct chat_options {
  bool add_generation_prompt = true;  // end with the assistant's header, ready to generate
  // The template's enable_thinking variable (Qwen3 and others: false turns reasoning off). Unset: not
  // passed, as vLLM and transformers leave it (each template then uses its own default; qwen3 thinks).
  std::optional<bool> enable_thinking{};
  // The template's date_string variable (Llama 3.1's "Today Date: " line). Unset: not passed; Llama 3.1's
  // template then writes "26 Jul 2024", Llama 3.2's today's date (strftime_now).
  std::optional<std::string> date_string{};
  // qwen2, qwen2_5 (built-in formats only): the system message written when the conversation does not start
  // with one. Unset: bpe_tokenizer::apply_chat_template uses the text its template writes, the free
  // apply_chat_template chat_format_default_system(format) ("You are a helpful assistant." for qwen2, "You
  // are Qwen, created by Alibaba Cloud. You are a helpful assistant." for qwen2_5).
  std::optional<std::string> default_system{};
  // The tools the model may call, as OpenAI's request lists them ({"type": "function", "function": {...}});
  // null: none (the template sees tools = None, as under transformers). Jinja templates only.
  nlohmann::ordered_json tools{};
  // More template variables (vLLM's chat_template_kwargs), an object; they override the ones above.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

namespace detail {
inline std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  if (left) {
    const auto b = s.find_first_not_of(chars);
    s = b == std::string_view::npos ? std::string_view{} : s.substr(b);
  }
  if (right) {
    const auto e = s.find_last_not_of(chars);
    s = e == std::string_view::npos ? std::string_view{} : s.substr(0, e + 1);
  }
  return s;
}

// Python's str.strip() with no argument (Jinja's trim filter): strips the code points for which
// str.isspace() is true, ASCII and Unicode alike (jinja::detail::py_is_space).
inline std::size_t py_space_prefix(std::string_view s) {
  if (s.empty()) return 0;
  const std::size_t n = jinja::detail::code_point_bytes(s);
  return jinja::detail::py_is_space(s.substr(0, n)) ? n : 0;
}
inline std::size_t py_space_suffix(std::string_view s) {
  std::size_t b = s.size();  // the last code point's first byte
  while (b > 0 && s.size() - b < 4 && (b == s.size() || (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80)) --b;
  if (b == s.size()) return 0;
  return jinja::detail::py_is_space(s.substr(b)) ? s.size() - b : 0;
}
inline std::string_view py_strip(std::string_view s) {
  while (const std::size_t n = py_space_prefix(s)) s.remove_prefix(n);
  while (const std::size_t n = py_space_suffix(s)) s.remove_suffix(n);
  return s;
}

// A JSON string literal as Python's json.dumps(s, ensure_ascii=False) writes it (transformers' tojson).
inline std::string py_json_string(std::string_view s) {
  std::string out;
  jinja::json_string(out, s, /*ensure_ascii=*/false);
  return out;
}

inline void check_role(const chat_message& m, std::initializer_list<std::string_view> roles, chat_format f) {
  check(std::find(roles.begin(), roles.end(), m.role) != roles.end(), "chat template ", chat_format_name(f),
        ": unsupported role '", json::printable(m.role), "'");
}

// Qwen2.5's, Qwen3's and QwQ's tool results: consecutive ones share one user turn of <tool_response> blocks.
inline void tool_response_turn(std::string& out, std::span<const chat_message> msgs, std::size_t i) {
  if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + msgs[i].content + "\n</tool_response>";
  if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
}

// Qwen3's template (tools left out): earlier turns' reasoning is dropped, the turns after the last user
// query keep theirs in <think> blocks.
inline std::string qwen3_chat(std::span<const chat_message> msgs, const chat_options& o) {
  std::string out;
  const std::size_t n = msgs.size();
  if (n > 0 && msgs[0].role == "system") out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  std::size_t last_query = n == 0 ? 0 : n - 1;
  for (std::size_t k = n; k-- > 0;) {
    const auto& m = msgs[k];
    if (m.role == "user" && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    check_role(m, {"system", "user", "assistant", "tool"}, chat_format::qwen3);
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (const auto close = m.content.find("</think>"); close != std::string::npos) {
        const std::string_view all = m.content;
        content = strip_chars(all.substr(all.rfind("</think>") + 8), "\n", true, false);
        std::string_view before = strip_chars(all.substr(0, close), "\n", false, true);
        if (const auto open = before.rfind("<think>"); open != std::string_view::npos) before = before.substr(open + 7);
        reasoning = strip_chars(before, "\n", true, false);
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n";
        out += strip_chars(reasoning, "\n", true, true);
        out += "\n</think>\n\n";
        out += strip_chars(content, "\n", true, false);
      } else {
        out += "<|im_start|>assistant\n";
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      tool_response_turn(out, msgs, i);
    }
  }
  if (o.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!o.enable_thinking.value_or(true)) out += "<think>\n\n</think>\n\n";
  }
  return out;
}
// QwQ-32B's template (tools left out): an answer before the last message keeps only what follows its last
// </think> (newlines at its start dropped); the generation prompt opens the model's <think> block.
inline std::string qwq_chat(std::span<const chat_message> msgs, const chat_options& o) {
  std::string out;
  const std::size_t n = msgs.size();
  if (n > 0 && msgs[0].role == "system") out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    check_role(m, {"system", "user", "assistant", "tool"}, chat_format::qwq);
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      if (i + 1 != n) {
        if (const auto close = content.rfind("</think>"); close != std::string_view::npos) content = content.substr(close + 8);
        content = strip_chars(content, "\n", true, false);
      }
      out += "<|im_start|>assistant\n";
      out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      tool_response_turn(out, msgs, i);
    }
  }
  if (o.add_generation_prompt) out += "<|im_start|>assistant\n<think>\n";
  return out;
}
}  // namespace detail

// A built-in format's options: template_kwargs may set enable_thinking and date_string (the variables the
// built-in formats read); tools and other variables need the checkpoint's Jinja template.
inline chat_options builtin_chat_options(chat_format format, const chat_options& options) {
  chat_options o = options;
  check(options.tools.is_null() || (options.tools.is_array() && options.tools.empty()), "chat template ",
        chat_format_name(format), " (built in): tools need the checkpoint's own (Jinja) chat template");
  check(options.template_kwargs.is_object(), "chat template variables must be an object");
  for (const auto& [k, v] : options.template_kwargs.items()) {
    if (k == "enable_thinking" && v.is_boolean()) {
      o.enable_thinking = v.get<bool>();
    } else if (k == "date_string" && v.is_string()) {
      o.date_string = v.get<std::string>();
    } else {
      fail("chat template ", chat_format_name(format), " (built in) has no variable '", json::printable(k),
           "' of that type (it reads enable_thinking, a boolean, and date_string, a string)");
    }
  }
  return o;
}

inline std::string apply_chat_template(chat_format format, std::span<const chat_message> messages,
                                       const chat_options& given = {}) {
  const chat_options options = builtin_chat_options(format, given);
  std::string out;
  switch (format) {
    case chat_format::qwen3: return detail::qwen3_chat(messages, options);
    case chat_format::qwq: return detail::qwq_chat(messages, options);
    case chat_format::qwen2:
    case chat_format::qwen2_5:
      // Qwen2's template writes its default only inside the loop over the messages (none for an empty
      // conversation); Qwen2.5's reads messages[0] unconditionally, which fails on an empty one.
      check(format == chat_format::qwen2 || !messages.empty(), "chat template ", chat_format_name(format),
            ": the conversation has no messages");
      if (!messages.empty() && messages[0].role != "system") {
        out += "<|im_start|>system\n";
        out += options.default_system ? std::string_view(*options.default_system) : chat_format_default_system(format);
        out += "<|im_end|>\n";
      }
      [[fallthrough]];
    case chat_format::chatml:
      for (std::size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "tool"}, format);
        if (format == chat_format::qwen2_5 && m.role == "tool") {
          detail::tool_response_turn(out, messages, i);
        } else {
          out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        }
      }
      if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case chat_format::llama3:
      // Every turn as is, content trimmed; the BOS comes with the first turn.
      for (std::size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "ipython", "tool"}, format);
        if (i == 0) out += "<|begin_of_text|>";
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += detail::py_strip(m.content);
        out += "<|eot_id|>";
      }
      if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case chat_format::llama3_1: {
      // The system block is always there (a leading system message's text, trimmed, after the date
      // lines); tool results are "ipython" turns holding the content as a JSON string, untrimmed.
      std::size_t first = 0;
      std::string_view system;
      if (!messages.empty() && messages[0].role == "system") {
        system = detail::py_strip(messages[0].content);
        first = 1;
      }
      out += "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
             "Cutting Knowledge Date: December 2023\nToday Date: ";
      out += options.date_string.value_or("26 Jul 2024");
      out += "\n\n";
      out += system;
      out += "<|eot_id|>";
      for (std::size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        detail::check_role(m, {"system", "user", "assistant", "ipython", "tool"}, format);
        if (m.role == "tool" || m.role == "ipython") {
          out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + detail::py_json_string(m.content);
        } else {
          out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
          out += detail::py_strip(m.content);
        }
        out += "<|eot_id|>";
      }
      if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case chat_format::deepseek_r1: {
      // The last system message is the system prompt; answers keep only what follows their last
      // </think> (the newlines after it included).
      std::string system;
      for (const auto& m : messages)
        if (m.role == "system") system = m.content;
      out += "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>" + system;
      for (const auto& m : messages) {
        detail::check_role(m, {"system", "user", "assistant"}, format);
        if (m.role == "user") {
          out += "<\xEF\xBD\x9CUser\xEF\xBD\x9C>" + m.content;
        } else if (m.role == "assistant") {
          std::string_view content = m.content;
          if (const auto p = content.rfind("</think>"); p != std::string_view::npos) content = content.substr(p + 8);
          out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
          out += content;
          out += "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
        }
      }
      if (options.add_generation_prompt) out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n";
      return out;
    }
    default: fail("apply_chat_template: the tokenizer has no chat template zipage knows");
  }
}

namespace detail {
// The content of the `{% ... %}` tag opening at `open` (its '-'/'+' markers and outer spaces dropped).
inline std::string_view jinja_tag(std::string_view t, std::size_t open) {
  const std::size_t close = t.find("%}", open);
  if (close == std::string_view::npos) return {};
  return strip_chars(t.substr(open + 2, close - open - 2), " \t\n-+", true, true);
}

// Where the `{% ... %}` tag that directly precedes the `{{` expression holding position `pos` opens:
// only spaces, '-' and that `{{` may stand between the tag and `pos`. npos when there is none.
inline std::size_t tag_before_output(std::string_view t, std::size_t pos) {
  std::size_t i = pos;
  while (i > 0 && (t[i - 1] == ' ' || t[i - 1] == '\n' || t[i - 1] == '\t' || t[i - 1] == '-')) --i;
  if (i < 2 || t.substr(i - 2, 2) != "{{") return std::string_view::npos;
  i -= 2;
  while (i > 0 && (t[i - 1] == ' ' || t[i - 1] == '\n' || t[i - 1] == '\t')) --i;
  if (i < 2 || t.substr(i - 2, 2) != "%}") return std::string_view::npos;
  return t.rfind("{%", i - 2);
}

// A Jinja string literal's body (between its quotes) as Jinja reads it, for the escapes plain text
// uses: \n \t \r \\ \' \"; nullopt for any other (or a raw CR, which Jinja would normalise).
inline std::optional<std::string> jinja_unescape(std::string_view body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\r') return std::nullopt;
    if (body[i] != '\\') {
      out += body[i];
      continue;
    }
    if (++i == body.size()) return std::nullopt;
    switch (body[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': case '\'': case '"': out += body[i]; break;
      default: return std::nullopt;
    }
  }
  return out;
}

// `if ... messages[0]... <op> ...'system'...`: the test on the first message's role.
inline bool first_role_test(std::string_view tag, std::string_view op) {
  return tag.starts_with("if ") && tag.find("messages[0]") != std::string_view::npos &&
         tag.find(op) != std::string_view::npos && tag.find("system") != std::string_view::npos;
}
}  // namespace detail

// The default system message of a Qwen2/Qwen2.5-style ChatML template: the string literal
// '<|im_start|>system\nTEXT<|im_end|>\n' written by a `{{ '...' }}` that stands right after either
// `{% if ... messages[0]... != 'system' %}` (Qwen2-Instruct) or the `{% else %}` of
// `{% if messages[0]... == 'system' %}` (Qwen2.5-Instruct), the whole of that `{{ }}`. Returns TEXT
// (which holds no other turn) as Jinja reads it when the
// template has exactly one such text and writes no system text any other way; nullopt otherwise
// (such a template is rendered as plain chatml).
inline std::optional<std::string> chat_template_default_system(std::string_view t) {
  static constexpr std::string_view head = "<|im_start|>system\\n", tail = "<|im_end|>\\n";
  std::optional<std::string> found;
  for (std::size_t at = t.find(head); at != std::string_view::npos; at = t.find(head, at + 1)) {
    if (at == 0 || (t[at - 1] != '\'' && t[at - 1] != '"')) continue;  // not the start of a literal
    const char quote = t[at - 1];
    std::size_t end = at;  // the closing quote
    while (end < t.size() && t[end] != quote) end += t[end] == '\\' ? 2 : 1;
    if (end >= t.size()) continue;
    const std::string_view body = t.substr(at, end - at);
    if (body.size() < head.size() + tail.size() || !body.ends_with(tail)) continue;
    const std::string_view text = body.substr(head.size(), body.size() - head.size() - tail.size());
    // the literal must be the whole `{{ ... }}` expression
    const std::size_t after = t.find_first_not_of(" \t\n-", end + 1);
    const bool alone = after != std::string_view::npos && t.substr(after, 2) == "}}";
    const std::size_t tag = alone ? detail::tag_before_output(t, at - 1) : std::string_view::npos;
    bool guarded = tag != std::string_view::npos && text.find("<|im_") == std::string_view::npos &&
                   detail::first_role_test(detail::jinja_tag(t, tag), "!=");
    if (!guarded && tag != std::string_view::npos && tag > 0 && text.find("<|im_") == std::string_view::npos &&
        detail::jinja_tag(t, tag) == "else") {
      // the if of this else: the tag before it, with one output expression between them
      const std::size_t if_tag = t.rfind("{%", tag - 1);
      guarded = if_tag != std::string_view::npos && detail::first_role_test(detail::jinja_tag(t, if_tag), "==");
    }
    if (!guarded) return std::nullopt;  // a system text written in some other case: not Qwen2's scheme
    auto value = detail::jinja_unescape(text);
    if (!value || (found && *found != *value)) return std::nullopt;
    found = std::move(value);
  }
  return found;
}

// Recognises the chat template of a tokenizer_config.json by its markers.
inline chat_format detect_chat_format(std::string_view jinja_template) {
  if (jinja_template.find("<\xEF\xBD\x9CUser\xEF\xBD\x9C>") != std::string_view::npos) return chat_format::deepseek_r1;
  if (jinja_template.find("<|start_header_id|>") != std::string_view::npos)
    return jinja_template.find("Cutting Knowledge Date") != std::string_view::npos ? chat_format::llama3_1
                                                                                   : chat_format::llama3;
  if (jinja_template.find("<|im_start|>") != std::string_view::npos) {
    // QwQ's generation prompt opens the <think> block (Qwen3's writes it only to turn thinking off).
    if (jinja_template.find("'<|im_start|>assistant\\n<think>\\n'") != std::string_view::npos) return chat_format::qwq;
    if (jinja_template.find("enable_thinking") != std::string_view::npos) return chat_format::qwen3;
    if (!chat_template_default_system(jinja_template)) return chat_format::chatml;
    return jinja_template.find("<tool_response>") != std::string_view::npos ? chat_format::qwen2_5 : chat_format::qwen2;
  }
  return chat_format::none;
}

// ---------------------------------------------------------------------------------------------
// The checkpoint's own (Jinja) chat template
// ---------------------------------------------------------------------------------------------

// Renders `messages` (OpenAI's message objects: role, content, and tool_calls, tool_call_id, name,
// reasoning_content or any other field the template reads) with a Jinja chat template as transformers'
// apply_chat_template renders it: the variables messages, tools (None when there are none), documents
// (None), add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...), then
// enable_thinking and date_string when set, then options.template_kwargs.
inline std::string render_chat_template(const jinja::template_& t, const nlohmann::ordered_json& messages,
                                        const chat_options& options,
                                        const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object(),
                                        const jinja::render_options& render = {}) {
  check(messages.is_array(), "chat template: the messages must be a list");
  check(options.template_kwargs.is_object(), "chat template variables must be an object");
  std::vector<std::pair<std::string, jinja::value>> vars;
  vars.reserve(8 + special_tokens.size() + options.template_kwargs.size());
  vars.emplace_back("messages", jinja::value::from_json(messages));
  vars.emplace_back("tools", options.tools.is_null() ? jinja::value::none() : jinja::value::from_json(options.tools));
  vars.emplace_back("documents", jinja::value::none());
  vars.emplace_back("add_generation_prompt", jinja::value(options.add_generation_prompt));
  for (const auto& [name, v] : special_tokens.items()) vars.emplace_back(name, jinja::value::from_json(v));
  if (options.enable_thinking) vars.emplace_back("enable_thinking", jinja::value(*options.enable_thinking));
  if (options.date_string) vars.emplace_back("date_string", jinja::value(*options.date_string));
  for (const auto& [k, v] : options.template_kwargs.items()) vars.emplace_back(k, jinja::value::from_json(v));
  return t.render(vars, render);
}

// Plain-text messages as OpenAI message objects.
inline nlohmann::ordered_json chat_messages_json(std::span<const chat_message> messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

}  // namespace zipage
