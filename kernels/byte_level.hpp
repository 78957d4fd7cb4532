#pragma once
// Pieces of Hugging Face byte-level BPE that tests and tools use directly: GPT-2's reversible
// mapping from bytes to printable characters, and the regex pre-tokenizer (PCRE2).

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::kernels {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100 upwards in byte order; the result is UTF-8.
[[nodiscard]] std::string bytes_to_byte_level(std::string_view bytes);
// The inverse; characters outside the mapping are kept as they are.
[[nodiscard]] std::string byte_level_to_bytes(std::string_view text);

// The pre-tokenizer pattern of GPT-2 (a ByteLevel pre-tokenizer with use_regex).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits text at the matches of a pattern, keeping matches and the text between them as
// pieces (tokenizers' "Isolated" behaviour). Unicode classes (\p{L}, \s) follow Unicode.
class RegexSplitter {
 public:
  // Throws DataError naming the pattern when it does not compile.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Pieces that concatenate back to `text`. Throws DataError for invalid UTF-8.
  [[nodiscard]] std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace kvtier::kernels
