#pragma once
// Internal: a Hugging Face byte-level BPE tokenizer as read from tokenizer.json.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tokenizer.hpp"

namespace kvtier::kernels {

struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool special = false;
};

struct ByteLevelBpeDefinition {
  std::vector<std::pair<std::string, std::int32_t>> vocabulary;  // byte-level text -> id
  std::vector<std::pair<std::string, std::string>> merges;       // in rank order
  bool ignore_merges = false;  // a word that is itself in the vocabulary is not split
  std::vector<AddedToken> added_tokens;
  std::vector<std::string> split_patterns;  // applied in order, "Isolated" behaviour
  bool add_prefix_space = false;
  std::optional<std::int32_t> bos;
  std::optional<std::int32_t> eos;
  std::string where;  // the file, for diagnostics
};

// Parses tokenizer.json (and tokenizer_config.json beside it for the EOS token).
[[nodiscard]] ByteLevelBpeDefinition read_tokenizer_json(const std::filesystem::path& path);

[[nodiscard]] std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeDefinition definition);

}  // namespace kvtier::kernels
