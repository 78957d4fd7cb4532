#pragma once
// Internal: the sentencepiece BPE segmentation shared by llama2.c's tokenizer.bin and
// sentencepiece's tokenizer.model (llama2.c's tokenizer is an export of the latter). Symbols
// start as single UTF-8 characters; the adjacent pair whose concatenation is the
// highest-scoring vocabulary piece merges first (the leftmost among equal scores), until no
// pair is in the vocabulary. Leftover symbols that are not pieces become byte tokens.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvtier::kernels {

struct TransparentStringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const noexcept {
    return std::hash<std::string_view>{}(text);
  }
};

class ScoredVocabulary {
 public:
  // `mergeable`: whether BPE may produce this piece (sentencepiece: normal pieces only).
  void add(std::string piece, float score, bool mergeable);
  // Pieces matched whole before segmentation and never merged (sentencepiece user-defined).
  void add_user_defined(std::int32_t id);
  // Finds the <0xNN> byte pieces; `unknown_id` takes bytes that have none.
  void finish(std::int32_t unknown_id);

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view normalized) const;

  [[nodiscard]] std::size_t size() const { return pieces_.size(); }
  [[nodiscard]] const std::string& piece(std::int32_t id) const {
    return pieces_[static_cast<std::size_t>(id)];
  }
  // The byte a <0xNN> piece stands for, or -1.
  [[nodiscard]] int byte_of(std::int32_t id) const {
    return byte_value_[static_cast<std::size_t>(id)];
  }

 private:
  [[nodiscard]] std::int32_t find(std::string_view piece, bool mergeable_only) const;
  [[nodiscard]] std::size_t user_defined_match(std::string_view text) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<bool> mergeable_;
  std::vector<int> byte_value_;
  std::vector<std::int32_t> user_defined_;
  std::unordered_map<std::string, std::int32_t, TransparentStringHash, std::equal_to<>> ids_;
  std::array<std::int32_t, 256> byte_ids_{};
  std::int32_t unknown_id_ = 0;
};

// The length of the UTF-8 character starting with `lead` (1 for a stray continuation byte).
[[nodiscard]] std::size_t utf8_length(unsigned char lead);

// Decoding pieces: <0xNN> byte pieces become raw bytes, other pieces their text with the
// whitespace marker (if any) turned back into spaces; the leading space of the text is dropped.
[[nodiscard]] std::string decode_scored_pieces(const ScoredVocabulary& vocabulary,
                                               std::span<const std::int32_t> ids,
                                               std::span<const std::int32_t> silent_ids,
                                               std::string_view space_marker,
                                               bool drop_leading_space);

}  // namespace kvtier::kernels
