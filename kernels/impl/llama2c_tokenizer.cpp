#include <fstream>
#include <string>

#include "common/errors.hpp"
#include "kernels/impl/score_bpe.hpp"
#include "kernels/tokenizer.hpp"

namespace kvtier::kernels {
namespace {

// llama2.c fixes these ids (run.c); the file does not name them.
constexpr std::int32_t kUnknownId = 0;
constexpr std::int32_t kBosId = 1;
constexpr std::int32_t kEosId = 2;

class Llama2cTokenizer final : public Tokenizer {
 public:
  explicit Llama2cTokenizer(ScoredVocabulary vocabulary) : vocabulary_(std::move(vocabulary)) {}

  // As run.c's encode(): a space is prefixed to non-empty text (sentencepiece's dummy prefix);
  // the pieces spell spaces as ' ', so no other normalisation is needed.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const override {
    if (text.empty()) {
      return {};
    }
    std::string normalized = " ";
    normalized += text;
    return vocabulary_.encode(normalized);
  }
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const override {
    const std::int32_t silent[] = {kBosId, kEosId};
    return decode_scored_pieces(vocabulary_, ids, silent, "", true);
  }
  [[nodiscard]] int vocab_size() const override { return static_cast<int>(vocabulary_.size()); }
  [[nodiscard]] std::optional<std::int32_t> bos_id() const override { return kBosId; }
  [[nodiscard]] std::optional<std::int32_t> eos_id() const override { return kEosId; }
  [[nodiscard]] std::string_view kind() const override { return "llama2.c"; }

 private:
  ScoredVocabulary vocabulary_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path) {
  const std::string where = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("cannot open tokenizer", where);
  }
  std::int32_t max_token_length = 0;
  if (!in.read(reinterpret_cast<char*>(&max_token_length), sizeof(max_token_length)) ||
      max_token_length <= 0) {
    throw DataError("not a llama2.c tokenizer: bad max_token_length header", where);
  }
  // A length is checked against the bytes left in the file before its piece is allocated: a
  // damaged length field must cost an error, not gigabytes.
  std::error_code size_error;
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, size_error);
  if (size_error) {
    throw DataError("cannot read the tokenizer's size: " + size_error.message(), where);
  }
  ScoredVocabulary vocabulary;
  while (in.peek() != std::ifstream::traits_type::eof()) {
    float score = 0.0F;
    std::int32_t length = 0;
    in.read(reinterpret_cast<char*>(&score), sizeof(score));
    in.read(reinterpret_cast<char*>(&length), sizeof(length));
    if (!in || length < 0 || length > max_token_length) {
      throw DataError("token " + std::to_string(vocabulary.size()) +
                          " has a bad length or the file is truncated",
                      where);
    }
    const auto remaining = file_bytes - static_cast<std::uintmax_t>(in.tellg());
    if (static_cast<std::uintmax_t>(length) > remaining) {
      throw DataError("token " + std::to_string(vocabulary.size()) + " has length " +
                          std::to_string(length) + " but the file has " +
                          std::to_string(remaining) + " bytes left",
                      where);
    }
    std::string piece(static_cast<std::size_t>(length), '\0');
    if (!in.read(piece.data(), length)) {
      throw DataError("file ends inside token " + std::to_string(vocabulary.size()), where);
    }
    vocabulary.add(std::move(piece), score, true);
  }
  if (vocabulary.size() <= static_cast<std::size_t>(kEosId)) {
    throw DataError("tokenizer has too few tokens for <unk>, BOS and EOS", where);
  }
  vocabulary.finish(kUnknownId);
  return std::make_unique<Llama2cTokenizer>(std::move(vocabulary));
}

}  // namespace kvtier::kernels
