#include "kernels/impl/score_bpe.hpp"

#include <algorithm>
#include <charconv>
#include <queue>

namespace kvtier::kernels {
namespace {

struct Symbol {
  std::size_t begin = 0;
  std::size_t size = 0;
  int previous = -1;
  int next = -1;
  bool frozen = false;  // a user-defined piece: never merged
};

struct Candidate {
  float score = 0.0F;
  int left = 0;
  int right = 0;
  std::size_t size = 0;  // of the merged piece, to spot candidates made stale by other merges
};

// Highest score first; among equal scores the leftmost pair.
struct LowerPriority {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) {
    return 1;
  }
  if ((lead & 0xE0) == 0xC0) {
    return 2;
  }
  if ((lead & 0xF0) == 0xE0) {
    return 3;
  }
  if ((lead & 0xF8) == 0xF0) {
    return 4;
  }
  return 1;
}

void ScoredVocabulary::add(std::string piece, float score, bool mergeable) {
  const auto id = static_cast<std::int32_t>(pieces_.size());
  ids_.emplace(piece, id);  // the first of duplicate pieces wins, as in sentencepiece
  pieces_.push_back(std::move(piece));
  scores_.push_back(score);
  mergeable_.push_back(mergeable);
}

void ScoredVocabulary::add_user_defined(std::int32_t id) {
  user_defined_.push_back(id);
}

void ScoredVocabulary::finish(std::int32_t unknown_id) {
  unknown_id_ = unknown_id;
  byte_ids_.fill(-1);
  byte_value_.assign(pieces_.size(), -1);
  for (std::size_t id = 0; id < pieces_.size(); ++id) {
    // Exactly two hex digits: sscanf's %2X also took a sign or a space ("<0x-8>" read as
    // 4294967288, an index far outside byte_ids_), and from_chars takes neither.
    const std::string& piece = pieces_[id];
    unsigned int value = 0;
    if (piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>' &&
        std::from_chars(piece.data() + 3, piece.data() + 5, value, 16).ptr == piece.data() + 5) {
      byte_value_[id] = static_cast<int>(value);
      if (byte_ids_[value] < 0) {
        byte_ids_[value] = static_cast<std::int32_t>(id);
      }
    }
  }
}

std::int32_t ScoredVocabulary::find(std::string_view piece, bool mergeable_only) const {
  const auto found = ids_.find(piece);
  if (found == ids_.end()) {
    return -1;
  }
  const auto id = static_cast<std::size_t>(found->second);
  if (mergeable_only && !mergeable_[id]) {
    return -1;
  }
  return found->second;
}

std::size_t ScoredVocabulary::user_defined_match(std::string_view text) const {
  std::size_t longest = 0;
  for (const std::int32_t id : user_defined_) {
    const std::string& piece = pieces_[static_cast<std::size_t>(id)];
    if (piece.size() > longest && text.starts_with(piece)) {
      longest = piece.size();
    }
  }
  return longest;
}

std::vector<std::int32_t> ScoredVocabulary::encode(std::string_view normalized) const {
  std::vector<Symbol> symbols;
  for (std::size_t at = 0; at < normalized.size();) {
    Symbol symbol;
    symbol.begin = at;
    symbol.size = user_defined_match(normalized.substr(at));
    symbol.frozen = symbol.size > 0;
    if (!symbol.frozen) {
      symbol.size =
          std::min(utf8_length(static_cast<unsigned char>(normalized[at])), normalized.size() - at);
    }
    symbol.previous = static_cast<int>(symbols.size()) - 1;
    symbol.next = static_cast<int>(symbols.size()) + 1;
    at += symbol.size;
    symbols.push_back(symbol);
  }
  if (symbols.empty()) {
    return {};
  }
  symbols.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, LowerPriority> agenda;
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) {
      return;
    }
    const Symbol& a = symbols[static_cast<std::size_t>(left)];
    const Symbol& b = symbols[static_cast<std::size_t>(right)];
    if (a.frozen || b.frozen) {
      return;
    }
    // Symbols are adjacent substrings, so their concatenation is a substring too.
    const std::string_view merged = normalized.substr(a.begin, a.size + b.size);
    const std::int32_t id = find(merged, true);
    if (id >= 0) {
      agenda.push({scores_[static_cast<std::size_t>(id)], left, right, merged.size()});
    }
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
    consider(static_cast<int>(i), static_cast<int>(i + 1));
  }
  while (!agenda.empty()) {
    const Candidate best = agenda.top();
    agenda.pop();
    Symbol& left = symbols[static_cast<std::size_t>(best.left)];
    Symbol& right = symbols[static_cast<std::size_t>(best.right)];
    // Stale: one side was merged away or grew since this candidate was queued.
    if (left.size == 0 || right.size == 0 || left.size + right.size != best.size ||
        left.next != best.right) {
      continue;
    }
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) {
      symbols[static_cast<std::size_t>(right.next)].previous = best.left;
    }
    consider(left.previous, best.left);
    consider(best.left, left.next);
  }

  std::vector<std::int32_t> ids;
  for (int index = 0; index >= 0; index = symbols[static_cast<std::size_t>(index)].next) {
    const Symbol& symbol = symbols[static_cast<std::size_t>(index)];
    const std::string_view piece = normalized.substr(symbol.begin, symbol.size);
    const std::int32_t id = symbol.frozen ? find(piece, false) : find(piece, true);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    // Byte fallback when the vocabulary has byte pieces; otherwise one unknown token.
    const bool has_bytes = std::all_of(piece.begin(), piece.end(), [&](char byte) {
      return byte_ids_[static_cast<unsigned char>(byte)] >= 0;
    });
    if (!has_bytes) {
      ids.push_back(unknown_id_);
      continue;
    }
    for (const char byte : piece) {
      ids.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
    }
  }
  return ids;
}

std::string decode_scored_pieces(const ScoredVocabulary& vocabulary,
                                 std::span<const std::int32_t> ids,
                                 std::span<const std::int32_t> silent_ids,
                                 std::string_view space_marker, bool drop_leading_space) {
  std::string text;
  bool at_start = true;
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= vocabulary.size() ||
        std::find(silent_ids.begin(), silent_ids.end(), id) != silent_ids.end()) {
      continue;
    }
    const int byte = vocabulary.byte_of(id);
    std::string piece = byte >= 0 ? std::string(1, static_cast<char>(byte)) : vocabulary.piece(id);
    if (!space_marker.empty() && byte < 0) {
      for (std::size_t at = piece.find(space_marker); at != std::string::npos;
           at = piece.find(space_marker, at + 1)) {
        piece.replace(at, space_marker.size(), " ");
      }
    }
    if (at_start && drop_leading_space && !piece.empty() && piece.front() == ' ') {
      piece.erase(0, 1);
    }
    at_start = false;  // only the first piece carries the prefixed space
    text += piece;
  }
  return text;
}

}  // namespace kvtier::kernels
