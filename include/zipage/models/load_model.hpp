#pragma once
// zipage::load_model: a model and its tokenizer by path — a Llama-architecture GGUF file, or a Hugging Face
// checkpoint directory (Qwen3, Qwen2, Llama: config.json, *.safetensors, tokenizer.json) — with the sampling
// defaults of its generation_config.json or GGUF general.sampling.* keys. What zipage::llm starts from; a tool that builds its own engine
// can start from it too (engine_settings() for its engine_config, the extra stop ids for with_end_of_turn).
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zipage/core/error.hpp"
#include "zipage/engine/engine_config.hpp"
#include "zipage/gguf/gguf.hpp"
#include "zipage/models/gguf_generation.hpp"
#include "zipage/models/hf_config.hpp"
#include "zipage/models/hf_loader.hpp"
#include "zipage/models/llama.hpp"
#include "zipage/tokenizer/bpe_tokenizer.hpp"
#include "zipage/tokenizer/detokenizer.hpp"
#include "zipage/tokenizer/spm_tokenizer.hpp"
#include "zipage/tokenizer/vocab_check.hpp"

namespace zipage {

template <class Backend>
struct loaded_model {
  llama_model<Backend> model;
  // The tokenizer, at a fixed address (detokenizer() refers to it): a GGUF file's SentencePiece vocabulary, or a
  // byte-level BPE one (a GGUF file's tokenizer.ggml.model = gpt2, or a checkpoint's tokenizer.json). Exactly one
  // is set.
  std::unique_ptr<const spm_tokenizer> spm;
  std::unique_ptr<const bpe_tokenizer> bpe;
  generation_defaults generation;         // the checkpoint's sampling fields: generation_config.json, or GGUF general.sampling.*
  std::vector<token_id> stop_token_ids;   // the tokenizer's end of turn when the config's eos is another id

  // Text to prompt ids with the model's BOS convention; ids back to text (special tokens left out).
  [[nodiscard]] std::vector<token_id> encode(const std::string& text) const {
    return bpe ? bpe->encode(text, bpe->add_bos()) : spm->encode(text, spm->add_bos());
  }
  [[nodiscard]] std::string decode(std::span<const token_id> ids) const {
    return bpe ? bpe->decode(ids, true) : spm->decode(ids);
  }
  // For engine_config::make_detokenizer; valid while this loaded_model's tokenizer lives.
  [[nodiscard]] std::function<streaming_detokenizer(std::span<const token_id>)> detokenizer() const {
    if (bpe) return detokenizer_factory(*bpe);
    return detokenizer_factory(*spm);
  }
  // For engine_config::encode_words (sampling_params::bad_words); valid while this loaded_model's tokenizer lives.
  [[nodiscard]] std::function<std::vector<token_id>(const std::string&)> words_encoder() const {
    if (bpe) return zipage::words_encoder(*bpe);
    return zipage::words_encoder(*spm);
  }
  // `cfg` wired to this model's tokenizer as zipage::llm wires its engine: the detokenizer, the bad-words encoder,
  // each token's bytes for structured output (engine_config::guide_vocab),
  // and engine_config::tokenizer_eos = the tokenizer's end of turn (stop_token_ids). Requests get that id as a
  // stop id through with_end_of_turn, which leaves it out under ignore_eos; only the engine's own copy keeps
  // min_tokens masking it then, as vLLM masks its tokenizer's eos with or without ignore_eos (and ending on it
  // reports no stop_reason, as on vLLM's). Each is set only where `cfg` leaves it unset (an empty function,
  // tokenizer_eos -1). Valid while this loaded_model's tokenizer lives.
  [[nodiscard]] engine_config engine_settings(engine_config cfg = {}) const {
    if (!cfg.make_detokenizer) cfg.make_detokenizer = detokenizer();
    if (!cfg.encode_words) cfg.encode_words = words_encoder();
    if (!cfg.guide_vocab) cfg.guide_vocab = bpe ? guide_vocabulary_of(*bpe) : guide_vocabulary_of(*spm);
    if (cfg.tokenizer_eos < 0 && !stop_token_ids.empty()) cfg.tokenizer_eos = stop_token_ids.front();
    return cfg;
  }
};

// Loads `path` onto `backend`: a directory is a Hugging Face checkpoint, anything else a GGUF file. The model
// and tokenizer vocabularies are checked against each other before the weights load. Throws zipage::error
// naming the file and what is wrong.
template <class Backend = cpu_backend>
loaded_model<Backend> load_model(const std::filesystem::path& path, const Backend& backend = {}) {
  std::error_code ec;
  check(!path.empty(), "no model path given");
  check(std::filesystem::exists(path, ec), path.string(), ": no such file or directory");
  if (std::filesystem::is_directory(path, ec)) {
    auto generation = load_generation_config(path);
    auto bpe = std::make_unique<const bpe_tokenizer>(bpe_tokenizer::from_dir(path));
    check_vocabulary_pair(load_hf_checkpoint_config(path), *bpe, (path / "config.json").string(),
                          (path / "tokenizer.json").string());
    auto model = load_hf_checkpoint<Backend>(path, backend);
    // The engine stops at the config's eos ids; the tokenizer's own end of turn (Qwen3's <|im_end|>) too.
    std::vector<token_id> stops;
    if (bpe->eos() >= 0 && bpe->eos() != model.config().eos) stops.push_back(bpe->eos());
    return {std::move(model), nullptr, std::move(bpe), std::move(generation), std::move(stops)};
  }
  const auto file = gguf::file::open(path);
  auto generation = generation_defaults_from_gguf(file);
  const model_config config = llama_config_from_gguf(file);
  const std::string model_name = path.string() + " (token_embd.weight)", vocab_name = path.string() + " (tokenizer.ggml.tokens)";
  if (gguf_has_bpe_vocab(file)) {  // Qwen's and Llama 3's byte-level BPE; the eos set is in config.extra_eos
    auto bpe = std::make_unique<const bpe_tokenizer>(bpe_tokenizer::from_gguf(file));
    check_vocabulary_pair(config, *bpe, model_name, vocab_name);
    return {load_llama_gguf<Backend>(file, backend), nullptr, std::move(bpe), std::move(generation), {}};
  }
  auto spm = std::make_unique<const spm_tokenizer>(spm_tokenizer::from_gguf(file));
  check_vocabulary_pair(config, *spm, model_name, vocab_name);
  return {load_llama_gguf<Backend>(file, backend), std::move(spm), nullptr, std::move(generation), {}};
}

}  // namespace zipage
