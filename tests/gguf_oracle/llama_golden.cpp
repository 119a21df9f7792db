// llama.cpp as an independent reference for zipage's GGUF path (tests/gguf_oracle/README.md).
//
//   llama_golden quantize IN.gguf OUT.gguf FTYPE          llama.cpp's own quantiser (FTYPE: llama_ftype id)
//   llama_golden dequantize IN.gguf OUT.gguf              every tensor to F32 by ggml's dequantisation
//   llama_golden tokenize MODEL.gguf [special] < lines    llama.cpp's token ids of each line (\n, \\ escapes);
//                                                         with `special`, control tokens in the text are parsed
//   llama_golden golden MODEL.gguf OUT.gguf STEPS PROMPT...
//       For each prompt: llama.cpp's tokens (BOS first), its greedy continuation of STEPS tokens, and the
//       logits it computes at every position of that sequence (fp32 KV cache, one sequence at a time).
//       Written as GGUF: metadata golden.prompts (strings), golden.tokens.<i> (int32 array) and tensors
//       logits.<i> [vocab][positions] (F32).
//   llama_golden golden_top MODEL.gguf OUT.gguf STEPS K PROMPT...
//       The same for a large vocabulary, kept small: per position the K largest logits (tensor top_logits.<i>
//       [K][positions], their ids in metadata golden.top_ids.<i>) and the log-sum-exp of all of them (tensor
//       logsumexp.<i> [positions]); prompts tokenised with control tokens parsed (chat-formatted text).
// Not part of the build: run.sh builds it against the llama.cpp libraries that node-llama-cpp publishes.
#include <ggml-backend.h>
#include <llama.h>

#include <zipage/gguf/writer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace gg = zipage::gguf;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "llama_golden: %s\n", what.c_str());
  std::exit(1);
}

int quantize(const char* in, const char* out, int ftype) {
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = static_cast<llama_ftype>(ftype);
  p.nthread = 1;
  if (llama_model_quantize(in, out, &p) != 0) die(std::string("quantising ") + in + " failed");
  return 0;
}

// The model with every tensor converted to F32 by ggml's own dequantisation (its metadata copied): what a
// quantised file's weights are, for a reference run in fp32 (llama.cpp's quantised run also rounds the
// activations to 8 bits, which hides small errors).
int dequantize(const char* in, const char* out) {
  const gg::file f = gg::file::open(in);
  gg::writer w;
  for (const std::string& key : f.keys()) w.set(key, *f.find(key));
  w.set("general.file_type", static_cast<std::uint32_t>(0));  // LLAMA_FTYPE_ALL_F32
  for (const gg::tensor_info& t : f.tensors()) {
    std::vector<float> values(static_cast<std::size_t>(t.num_elements()));
    if (t.type == gg::tensor_type::f32)
      std::memcpy(values.data(), t.data, values.size() * sizeof(float));
    else
      ggml_get_type_traits(static_cast<ggml_type>(t.type))->to_float(t.data, values.data(), t.num_elements());
    w.add_tensor(t.name, t.dims, gg::tensor_type::f32, values);
  }
  w.write(out);
  return 0;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool parse_special = false) {
  std::vector<llama_token> ids(text.size() + 8);
  const int n = llama_tokenize(vocab, text.c_str(), static_cast<int>(text.size()), ids.data(),
                               static_cast<int>(ids.size()), /*add_special=*/true, parse_special);
  if (n < 0) die("tokenize failed");
  ids.resize(n);
  return ids;
}

// One line of text per input line (escapes: \n for a newline, \\ for a backslash) -> llama.cpp's token ids (BOS
// first), space-separated, one line each.
int tokenize_lines(const char* model_path, bool parse_special) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (model == nullptr) die(std::string("cannot load ") + model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  for (std::string line; std::getline(std::cin, line);) {
    std::string text;
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) {
        text += line[i + 1] == 'n' ? '\n' : line[i + 1];
        ++i;
      } else {
        text += line[i];
      }
    }
    const auto ids = tokenize(vocab, text, parse_special);
    for (std::size_t k = 0; k < ids.size(); ++k) std::printf(k ? " %d" : "%d", ids[k]);
    std::printf("\n");
  }
  llama_model_free(model);
  return 0;
}

// `top` = 0: every logit of every position (tensor logits.<i>); else the `top` largest and the log-sum-exp.
int golden(const char* model_path, const char* out, int steps, std::vector<std::string> prompts, int top = 0) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (model == nullptr) die(std::string("cannot load ") + model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  gg::writer w;
  w.set("general.architecture", "zipage-llama-golden");
  w.set("golden.model", std::filesystem::path(model_path).filename().string());
  w.set("golden.steps", static_cast<std::int32_t>(steps));
  w.set("golden.prompts", prompts);
  for (std::size_t k = 0; k < prompts.size(); ++k) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    // Plain attention: the CPU flash-attention path rounds K·Q and the softmax through fp16.
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) die("cannot make a context");
    std::vector<llama_token> seq = tokenize(vocab, prompts[k], /*parse_special=*/top > 0);
    std::vector<float> logits;  // [positions][vocab]
    // One token per decode, so every position's logits come out (and the cache grows as in generation).
    const std::size_t prompt_size = seq.size(), positions = prompt_size + static_cast<std::size_t>(steps) - 1;
    for (std::size_t pos = 0; pos < positions; ++pos) {
      llama_token t = seq[pos];
      if (const int rc = llama_decode(ctx, llama_batch_get_one(&t, 1)); rc != 0)
        die("decode failed at position " + std::to_string(pos) + ": " + std::to_string(rc));
      const float* l = llama_get_logits_ith(ctx, -1);
      logits.insert(logits.end(), l, l + n_vocab);
      if (pos + 1 >= prompt_size) {
        int best = 0;
        for (int v = 1; v < n_vocab; ++v)
          if (l[v] > l[best]) best = v;
        seq.push_back(best);
      }
    }
    llama_free(ctx);
    w.set("golden.tokens." + std::to_string(k), std::vector<std::int32_t>(seq.begin(), seq.end()));
    const std::int64_t positions_done = static_cast<std::int64_t>(logits.size() / n_vocab);
    if (top == 0) {
      w.add_tensor("logits." + std::to_string(k), {n_vocab, positions_done}, gg::tensor_type::f32, logits);
    } else {
      std::vector<std::int32_t> ids;
      std::vector<float> values, lse;
      for (std::int64_t p = 0; p < positions_done; ++p) {
        const float* l = logits.data() + p * n_vocab;
        std::vector<int> order(static_cast<std::size_t>(n_vocab));
        for (int v = 0; v < n_vocab; ++v) order[static_cast<std::size_t>(v)] = v;
        std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int a, int b) { return l[a] > l[b]; });
        double m = l[order[0]], sum = 0.0;
        for (int v = 0; v < n_vocab; ++v) sum += std::exp(double(l[v]) - m);
        lse.push_back(static_cast<float>(m + std::log(sum)));
        for (int j = 0; j < top; ++j) {
          ids.push_back(order[static_cast<std::size_t>(j)]);
          values.push_back(l[order[static_cast<std::size_t>(j)]]);
        }
      }
      w.set("golden.top_ids." + std::to_string(k), ids);
      w.add_tensor("top_logits." + std::to_string(k), {top, positions_done}, gg::tensor_type::f32, values);
      w.add_tensor("logsumexp." + std::to_string(k), {positions_done}, gg::tensor_type::f32, lse);
    }
    std::printf("prompt %zu: %zu tokens\n", k, seq.size());
  }
  llama_model_free(model);
  w.write(out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Quiet: llama.cpp logs every tensor; errors still reach stderr.
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  // The CPU backends are plug-ins (libggml-cpu-<arch>.so); run.sh says where they are.
  if (const char* dir = std::getenv("GGML_BACKEND_DIR")) ggml_backend_load_all_from_path(dir);
  else ggml_backend_load_all();
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "quantize" && argc == 5) return quantize(argv[2], argv[3], std::atoi(argv[4]));
  if (mode == "dequantize" && argc == 4) return dequantize(argv[2], argv[3]);
  if (mode == "tokenize" && (argc == 3 || (argc == 4 && std::string(argv[3]) == "special")))
    return tokenize_lines(argv[2], argc == 4);
  if (mode == "golden_top" && argc >= 7)
    return golden(argv[2], argv[3], std::atoi(argv[4]), std::vector<std::string>(argv + 6, argv + argc), std::atoi(argv[5]));
  if (mode == "golden" && argc >= 6)
    return golden(argv[2], argv[3], std::atoi(argv[4]), std::vector<std::string>(argv + 5, argv + argc));
  std::fprintf(stderr, "usage: llama_golden quantize IN OUT FTYPE | dequantize IN OUT | tokenize MODEL [special] | golden MODEL OUT STEPS PROMPT... | golden_top MODEL OUT STEPS K PROMPT...\n");
  return 2;
}
