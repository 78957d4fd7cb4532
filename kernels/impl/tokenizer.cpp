#include "kernels/tokenizer.hpp"

#include "common/errors.hpp"

namespace kvtier::kernels {

std::vector<std::int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<std::int32_t> ids;
  if (const auto bos = bos_id()) {
    ids.push_back(*bos);
  }
  const std::vector<std::int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    if (std::filesystem::exists(path / "tokenizer.json")) {
      return load_tokenizer_json(path / "tokenizer.json");
    }
    if (std::filesystem::exists(path / "tokenizer.model")) {
      return load_sentencepiece_model(path / "tokenizer.model");
    }
    throw DataError("no tokenizer.json or tokenizer.model in the folder", path.string());
  }
  const std::string extension = path.extension().string();
  if (extension == ".bin") {
    return load_llama2c_tokenizer(path);
  }
  if (extension == ".model") {
    return load_sentencepiece_model(path);
  }
  if (extension == ".json") {
    return load_tokenizer_json(path);
  }
  throw DataError("unknown tokenizer format (expected .bin, .model or .json)", path.string());
}

}  // namespace kvtier::kernels
