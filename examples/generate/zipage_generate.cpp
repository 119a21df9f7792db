// zipage-generate: text generation with a Llama-family model (a GGUF file, or a Hugging Face checkpoint
// directory of Qwen3 / Qwen2 / Llama) on the GPU (zipage::cuda_backend, bf16, CUDA graphs) when the build
// has the CUDA backend and a device is present, else on the CPU reference backend (--device picks).
//   zipage-generate --prompt "Once upon a time" -n 64
//   zipage-generate --device cpu --prompt "Once upon a time" -n 64
//   zipage-generate --prompts prompts.txt -n 256 --temperature 0.8 --seed 1
//   zipage-generate --prompts prompts.txt --max-tokens-file lengths.txt --ignore-eos   # a length per prompt
//   zipage-generate --model Qwen3-0.6B/ --chat --no-thinking --prompt "What is 2+2?"
#include <CLI/CLI.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../common/engine_cli.hpp"
#include "../common/text_lines.hpp"

namespace {

struct options : zipage_cli::engine_options {
  std::string prompt;
  std::string prompts_file;
  std::string max_tokens_file;  // with --prompts: one max-tokens value per prompt
  bool chat = false;         // apply the checkpoint's chat template (Hugging Face checkpoints)
  bool no_thinking = false;  // with --chat: Qwen3's empty <think></think> block
  std::string system;        // with --chat: a system message
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in = zipage_cli::open_lines(path, "prompts file");
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);)
    if (const auto text = zipage_cli::without_cr(line); !text.empty()) prompts.emplace_back(text);
  zipage::check(!prompts.empty(), "prompts file '", path, "' has no prompt (one per line)");
  return prompts;
}

// One positive integer per non-empty line, as many as there are prompts (read_prompts skips empty lines too).
std::vector<int> read_max_tokens(const std::string& path, std::size_t prompts) {
  std::ifstream in = zipage_cli::open_lines(path, "--max-tokens-file");
  std::vector<int> values;
  int line_number = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_number;
    const std::string_view line = zipage_cli::without_cr(raw);
    if (line.empty()) continue;
    int v = 0;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    zipage::check(ec == std::errc{} && end == line.data() + line.size() && v >= 1, "--max-tokens-file '", path,
                  "' line ", line_number, ": '", line, "' is not a positive integer");
    values.push_back(v);
  }
  zipage::check(values.size() == prompts, "--max-tokens-file '", path, "' has ", values.size(),
                " values for ", prompts, " prompts (one per prompt, in order)");
  return values;
}

// The model, device, sampling, pool and policy flags are zipage-serve's too (examples/common/engine_cli.hpp).
void add_flags(CLI::App& app, options& o) {
  zipage_cli::add_engine_flags(app, o);
  auto* single = app.add_option("--prompt,-p", o.prompt, "prompt text (streamed)");
  auto* many = app.add_option("--prompts", o.prompts_file, "file with one prompt per line, run as one batch");
  single->excludes(many);
  o.sampling.max_tokens = 128;
  auto* n = app.add_option("-n,--max-tokens", o.sampling.max_tokens,
                           "tokens to generate per request (default: the checkpoint's max_new_tokens, else 128)")
                ->check(zipage_cli::positive_count());
  o.flags["--max-tokens"] = n;
  // Both given would leave one silently unused: refused by name instead.
  app.add_option("--max-tokens-file", o.max_tokens_file,
                 "with --prompts: one max-tokens value per line, for the prompt on the same line (instead of -n)")
      ->needs(many)
      ->excludes(n);
  app.add_flag("--quiet,-q", o.quiet,
               "print only the text, each prompt followed by its continuation: no memory plan, sampling line, "
               "progress or summary (errors still go to stderr)");
  app.add_flag("--chat", o.chat, "wrap each prompt in the checkpoint's chat template (checkpoint directories)");
  auto* chat = app.get_option("--chat");
  app.add_flag("--no-thinking", o.no_thinking, "with --chat: the template's enable_thinking = false (Qwen3: no thinking)")->needs(chat);
  app.add_option("--system", o.system, "with --chat: a system message")->needs(chat);
  // The template only shapes --chat's prompts: without --chat it would be silently unused (as --system would).
  app.get_option("--chat-template")->needs(chat);
}

void progress(std::size_t done, std::size_t total, std::int64_t tokens, double seconds) {
  constexpr int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%-*s] %zu/%zu requests  %lld tokens  %.0f tok/s", width, std::string(filled, '=').c_str(),
               done, total, static_cast<long long>(tokens), seconds > 0 ? tokens / seconds : 0.0);
  std::fflush(stderr);
}

template <class Engine>
void print_summary(const Engine& eng, std::size_t requests, double seconds) {
  const auto st = eng.stats();
  std::fprintf(stderr,
               "requests: %zu  generated tokens: %lld  time: %.2f s  throughput: %.1f tok/s\n"
               "peak KV blocks used: %d of %d (block size %d)  peak running: %d  preemptions: %lld  swaps: %lld\n"
               "compressions: %lld  prefix-cache hit rate: %.1f%%  steps: %lld\n",
               requests, static_cast<long long>(st.generated_tokens), seconds,
               seconds > 0 ? st.generated_tokens / seconds : 0.0, st.peak_blocks_used, st.num_blocks,
               eng.settings().block_size, st.peak_running, static_cast<long long>(st.preemptions),
               static_cast<long long>(st.swaps), static_cast<long long>(st.compressions), 100.0 * st.prefix_hit_rate(),
               static_cast<long long>(st.steps));
}

// The prompts and their lengths, read before the model loads so that a bad file fails at once.
struct inputs {
  std::vector<std::string> texts;
  std::vector<int> max_tokens;  // empty: -n for every prompt
};

inputs read_inputs(const options& o) {
  inputs in;
  in.texts = o.prompts_file.empty() ? std::vector<std::string>{o.prompt} : read_prompts(o.prompts_file);
  if (!o.max_tokens_file.empty()) in.max_tokens = read_max_tokens(o.max_tokens_file, in.texts.size());
  return in;
}

template <class Engine, class Encode>
int run_engine(options& o, const inputs& in, Engine& eng, Encode& encode);

// The output length: -n, else the checkpoint's max_new_tokens (vLLM's default max_tokens), else 128; the
// engine still stops at the model's context. The sampling line says which (or that --max-tokens-file sets it).
void resolve_max_tokens(options& o) {
  const bool flag = zipage_cli::given(o, "--max-tokens");
  if (!flag && o.checkpoint_max_tokens) o.sampling.max_tokens = *o.checkpoint_max_tokens;
  if (!o.max_tokens_file.empty()) {
    o.sampling_line += "; max-tokens from --max-tokens-file";
    return;
  }
  o.sampling_line += "; max-tokens " + std::to_string(o.sampling.max_tokens) +
                     (flag ? " (flag)" : o.checkpoint_max_tokens ? " (checkpoint max_new_tokens)" : " (default)");
}

// Reads the inputs, loads the model and builds the engine (zipage_cli::with_engine), then runs the prompts.
int run(options& o) {
  const inputs in = read_inputs(o);
  return zipage_cli::with_engine(o, [&](auto& eng, const zipage_cli::model_text& text) {
    resolve_max_tokens(o);
    if (o.chat) {
      zipage::check(text.bpe != nullptr, "--chat needs a Hugging Face checkpoint directory as --model");
      zipage::check(text.has_chat_template(), "--chat: ", o.model,
                    " has no chat template (--chat-template FILE gives one)");
      // A template that does not parse would fail every prompt alike: once, before any runs.
      if (o.chat_template == "auto")
        zipage::check(text.bpe->chat_template_error().empty(), "--chat: the chat template cannot be used: ",
                      text.bpe->chat_template_error(), " (--chat-template FILE gives another)");
    }
    auto encode = [&](const std::string& prompt) {
      if (!o.chat) return text.encode(prompt);
      std::vector<zipage::chat_message> messages;
      if (!o.system.empty()) messages.push_back({"system", o.system});
      messages.push_back({"user", prompt});
      // The template writes any BOS itself.
      return text.encode_templated(text.apply_chat_template(messages, {.enable_thinking = o.no_thinking ? std::optional<bool>(false) : std::nullopt}));
    };
    return run_engine(o, in, eng, encode);
  });
}

template <class Engine, class Encode>
int run_engine(options& o, const inputs& in, Engine& eng, Encode& encode) {
  if (!o.quiet) {
    std::fprintf(stderr, "%s; policy %s\n", eng.memory().describe().c_str(), std::string(eng.policy().name()).c_str());
    std::fprintf(stderr, "%s\n", o.sampling_line.c_str());
  }

  const bool batch = !o.prompts_file.empty();
  const std::vector<std::string>& texts = in.texts;
  const std::vector<int>& lengths = in.max_tokens;
  // A prompt the engine refuses (too long for the context, say) fails alone; the others still run.
  std::vector<std::optional<zipage::request_id>> ids;
  std::vector<std::string> refused(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    auto params = o.sampling;
    params.seed += i;
    if (!lengths.empty()) params.max_tokens = lengths[i];
    zipage_cli::add_end_of_turn(params, o);
    try {
      ids.push_back(eng.add_request(encode(texts[i]), params));
    } catch (const zipage::error& e) {
      ids.push_back(std::nullopt);
      refused[i] = zipage_cli::in_flag_terms(e.what());
    }
  }

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::size_t finished = 0;
  std::int64_t tokens = 0;
  double next_draw = 0.0;
  if (!batch) std::cout << texts[0] << std::flush;  // the prompt, then its continuation streamed
  while (eng.has_unfinished()) {
    for (const auto& ev : eng.step()) {
      ++tokens;
      if (!batch) std::cout << ev.text << std::flush;
      finished += ev.finished;
    }
    // Redraw at most ten times a second (and once at the end), not once per step.
    if (batch && !o.quiet && (elapsed() >= next_draw || !eng.has_unfinished())) {
      progress(finished, texts.size(), tokens, elapsed());
      next_draw = elapsed() + 0.1;
    }
  }
  const double seconds = elapsed();
  if (batch && !o.quiet) std::fprintf(stderr, "\n");

  std::vector<std::size_t> failed;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto out = ids[i] ? eng.take_output(*ids[i]) : zipage::request_output{};
    if (batch) std::cout << "[" << i << "] " << texts[i] << out.text << "\n";
    else std::cout << "\n";
    if (!ids[i] || out.reason == zipage::finish_reason::error) {
      std::cout << std::flush;  // the text's line ends before the error's
      std::fprintf(stderr, "request %zu failed: %s\n", i,
                   ids[i] ? zipage_cli::in_flag_terms(out.error_message).c_str() : refused[i].c_str());
      failed.push_back(i);
    }
  }
  std::cout << std::flush;  // the text first, then the summary on stderr
  if (!o.quiet) print_summary(eng, texts.size(), seconds);
  if (!failed.empty()) {  // a failed request is a failed run: exit status 1, and which ones
    std::string which;
    for (std::size_t k = 0; k < failed.size() && k < 20; ++k) which += (k ? ", " : "") + std::to_string(failed[k]);
    if (failed.size() > 20) which += ", ...";
    std::fprintf(stderr, "zipage-generate: error: %zu of %zu requests failed (request%s %s)\n", failed.size(),
                 texts.size(), failed.size() == 1 ? "" : "s", which.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zipage-generate: generate text with a GGUF model or a Hugging Face checkpoint (Compressed PagedAttention engine)"};
  options o;
  add_flags(app, o);
  if (const int rc = zipage_cli::parse_cli(app, argc, argv, "zipage-generate"); rc >= 0) return rc;
  return zipage_cli::run_reporting_errors("zipage-generate", [&] { return run(o); });
}
