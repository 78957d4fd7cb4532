#pragma once
// Tokenizers: llama2.c tokenizer.bin, sentencepiece tokenizer.model (BPE models: Llama 2,
// Mistral, TinyLlama) and Hugging Face tokenizer.json byte-level BPE (Llama 3, Qwen2/2.5/3,
// DeepSeek-R1-Distill).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::kernels {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  Tokenizer(Tokenizer&&) = delete;
  Tokenizer& operator=(Tokenizer&&) = delete;

  // The ids of `text`, without BOS or EOS. Throws DataError for text the tokenizer cannot take
  // (invalid UTF-8 for a byte-level BPE).
  [[nodiscard]] virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // The text of `ids` read from the start of a text: BOS and EOS decode to nothing, byte tokens to
  // their bytes, and sentencepiece-style tokenizers drop the space their encoder prefixed.
  [[nodiscard]] virtual std::string decode(std::span<const std::int32_t> ids) const = 0;

  [[nodiscard]] virtual int vocab_size() const = 0;
  // The token a prompt starts with (none for models trained without one, such as Qwen).
  [[nodiscard]] virtual std::optional<std::int32_t> bos_id() const = 0;
  [[nodiscard]] virtual std::optional<std::int32_t> eos_id() const = 0;
  // "llama2.c", "sentencepiece" or "byte-level-bpe".
  [[nodiscard]] virtual std::string_view kind() const = 0;

  // BOS (when the model has one) followed by encode(text).
  [[nodiscard]] std::vector<std::int32_t> encode_prompt(std::string_view text) const;
};

// llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length,
// bytes. Pieces spell spaces as ' '; BOS is 1, EOS 2, bytes 3..258 (<0x00>..<0xFF>).
[[nodiscard]] std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path);
// A sentencepiece BPE model (tokenizer.model).
[[nodiscard]] std::unique_ptr<Tokenizer> load_sentencepiece_model(
    const std::filesystem::path& path);
// A Hugging Face tokenizer.json whose model is byte-level BPE. tokenizer_config.json beside it,
// when present, names the EOS token.
[[nodiscard]] std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& path);

// By name: *.bin (llama2.c), *.model (sentencepiece), *.json (Hugging Face); for a directory,
// its tokenizer.json, else its tokenizer.model.
[[nodiscard]] std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

}  // namespace kvtier::kernels
