#include "kernels/impl/byte_level_bpe.hpp"

#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>

#include "common/errors.hpp"
#include "kernels/byte_level.hpp"
#include "kernels/impl/score_bpe.hpp"

namespace kvtier::kernels {
namespace {

struct Merge {
  std::int32_t rank = 0;
  std::int32_t merged = 0;
};

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  explicit ByteLevelBpeTokenizer(ByteLevelBpeDefinition definition)
      : definition_(std::move(definition)) {
    std::int32_t largest = -1;
    for (const auto& [text, id] : definition_.vocabulary) {
      ids_.emplace(text, id);
      largest = std::max(largest, id);
    }
    for (const AddedToken& token : definition_.added_tokens) {
      largest = std::max(largest, token.id);
      added_by_first_byte_[static_cast<unsigned char>(token.content.front())].push_back(token);
    }
    for (auto& candidates : added_by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const AddedToken& a, const AddedToken& b) {
                         return a.content.size() > b.content.size();
                       });
    }
    // Ids need not be dense (the file may skip some), so their texts are kept by id rather than
    // in a table as long as the largest id: a stray id of 2^31 - 2 must not cost 64 GB.
    vocab_size_ = largest + 1;  // the file's ids are below 2^31 - 1 (tokenizer_json.cpp)
    for (const auto& [text, id] : definition_.vocabulary) {
      text_of_id_[id] = byte_level_to_bytes(text);
    }
    for (const AddedToken& token : definition_.added_tokens) {
      text_of_id_[token.id] = token.content;
    }
    if (definition_.bos && !text_of_id_.contains(*definition_.bos)) {
      throw DataError("post_processor's BOS id " + std::to_string(*definition_.bos) +
                          " is not a token of the vocabulary",
                      definition_.where);
    }
    for (std::size_t rank = 0; rank < definition_.merges.size(); ++rank) {
      const auto& [left, right] = definition_.merges[rank];
      const auto left_id = ids_.find(left);
      const auto right_id = ids_.find(right);
      std::string merged = left;
      merged += right;
      const auto merged_id = ids_.find(merged);
      if (left_id == ids_.end() || right_id == ids_.end() || merged_id == ids_.end()) {
        std::string message = "merge '";
        message.append(left).append(" ").append(right).append("' (rank ");
        message.append(std::to_string(rank))
            .append(") names a token that is not in the vocabulary");
        throw DataError(message, definition_.where);
      }
      merges_.emplace(pair_key(left_id->second, right_id->second),
                      Merge{static_cast<std::int32_t>(rank), merged_id->second});
    }
    for (const std::string& pattern : definition_.split_patterns) {
      splitters_.emplace_back(pattern);
    }
  }

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    std::size_t plain_start = 0;
    for (std::size_t at = 0; at < text.size();) {
      const AddedToken* token = added_token_at(text.substr(at));
      if (token == nullptr) {
        ++at;
        continue;
      }
      encode_plain(text.substr(plain_start, at - plain_start), ids);
      ids.push_back(token->id);
      at += token->content.size();
      plain_start = at;
    }
    encode_plain(text.substr(plain_start), ids);
    return ids;
  }

  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text;
    for (const std::int32_t id : ids) {
      if (const auto found = text_of_id_.find(id); found != text_of_id_.end()) {
        text += found->second;
      }
    }
    return text;
  }

  [[nodiscard]] int vocab_size() const override { return vocab_size_; }
  [[nodiscard]] std::optional<std::int32_t> bos_id() const override { return definition_.bos; }
  [[nodiscard]] std::optional<std::int32_t> eos_id() const override { return definition_.eos; }
  [[nodiscard]] std::string_view kind() const override { return "byte-level-bpe"; }

 private:
  // Added tokens are matched before anything else, longest first.
  [[nodiscard]] const AddedToken* added_token_at(std::string_view text) const {
    for (const AddedToken& token : added_by_first_byte_[static_cast<unsigned char>(text.front())]) {
      if (text.starts_with(token.content)) {
        return &token;
      }
    }
    return nullptr;
  }

  void encode_plain(std::string_view text, std::vector<std::int32_t>& ids) const {
    if (text.empty()) {
      return;
    }
    std::string prefixed;
    if (definition_.add_prefix_space && text.front() != ' ') {
      prefixed = " ";
      prefixed += text;
      text = prefixed;
    }
    std::vector<std::string_view> pieces{text};
    for (const RegexSplitter& splitter : splitters_) {
      std::vector<std::string_view> finer;
      for (const std::string_view piece : pieces) {
        const auto parts = splitter.split(piece);
        finer.insert(finer.end(), parts.begin(), parts.end());
      }
      pieces = std::move(finer);
    }
    for (const std::string_view piece : pieces) {
      encode_word(bytes_to_byte_level(piece), ids);
    }
  }

  // BPE over one pre-tokenized word: the lowest-ranked adjacent merge first (leftmost on ties).
  void encode_word(const std::string& word, std::vector<std::int32_t>& ids) const {
    if (word.empty()) {
      return;
    }
    if (definition_.ignore_merges) {
      if (const auto whole = ids_.find(word); whole != ids_.end()) {
        ids.push_back(whole->second);
        return;
      }
    }
    struct Symbol {
      std::int32_t id;
      int previous;
      int next;
    };
    std::vector<Symbol> symbols;
    for (std::size_t at = 0; at < word.size();) {
      const std::size_t length = utf8_length(static_cast<unsigned char>(word[at]));
      const auto found = ids_.find(std::string_view(word).substr(at, length));
      if (found == ids_.end()) {
        throw DataError(
            "byte-level character '" + word.substr(at, length) + "' is not in the vocabulary",
            definition_.where);
      }
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({found->second, index - 1, index + 1});
      at += length;
    }
    symbols.back().next = -1;
    struct Candidate {
      std::int32_t rank;
      int left;
      std::int32_t left_id;
      std::int32_t right_id;
      bool operator>(const Candidate& other) const {
        return rank > other.rank || (rank == other.rank && left > other.left);
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> agenda;
    const auto consider = [&](int left) {
      if (left < 0 || symbols[static_cast<std::size_t>(left)].next < 0) {
        return;
      }
      const Symbol& a = symbols[static_cast<std::size_t>(left)];
      const Symbol& b = symbols[static_cast<std::size_t>(a.next)];
      if (const auto merge = merges_.find(pair_key(a.id, b.id)); merge != merges_.end()) {
        agenda.push({merge->second.rank, left, a.id, b.id});
      }
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) {
      consider(i);
    }
    while (!agenda.empty()) {
      const Candidate best = agenda.top();
      agenda.pop();
      Symbol& left = symbols[static_cast<std::size_t>(best.left)];
      if (left.id != best.left_id || left.next < 0 ||
          symbols[static_cast<std::size_t>(left.next)].id != best.right_id) {
        continue;  // stale: a neighbour changed since this candidate was queued
      }
      Symbol& right = symbols[static_cast<std::size_t>(left.next)];
      left.id = merges_.at(pair_key(best.left_id, best.right_id)).merged;
      right.id = -1;
      left.next = right.next;
      if (right.next >= 0) {
        symbols[static_cast<std::size_t>(right.next)].previous = best.left;
      }
      consider(left.previous);
      consider(best.left);
    }
    for (int index = 0; index >= 0; index = symbols[static_cast<std::size_t>(index)].next) {
      ids.push_back(symbols[static_cast<std::size_t>(index)].id);
    }
  }

  ByteLevelBpeDefinition definition_;
  std::unordered_map<std::string, std::int32_t, TransparentStringHash, std::equal_to<>> ids_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::vector<AddedToken>, 256> added_by_first_byte_;
  std::unordered_map<std::int32_t, std::string> text_of_id_;  // decoded bytes of every id
  std::int32_t vocab_size_ = 0;                               // the largest id + 1
  std::vector<RegexSplitter> splitters_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeDefinition definition) {
  return std::make_unique<ByteLevelBpeTokenizer>(std::move(definition));
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& path) {
  return make_byte_level_bpe(read_tokenizer_json(path));
}

}  // namespace kvtier::kernels
