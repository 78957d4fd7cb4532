#pragma once
// Where every token of one layer lives: T0 HBM, T1 host DDR at full precision, T2 host memory
// compressed, T3 evicted (dropped for good). Counts per tier are kept current so that a step's
// bookkeeping does not rescan the tokens.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::replay {

enum class Tier : std::uint8_t { kHbm = 0, kHost = 1, kCompressed = 2, kEvicted = 3 };
inline constexpr std::size_t kTierCount = 4;

// Movements since the last reset, in tokens.
// Which of them cross the host link, and at what size, depends on where they came from: a
// promotion from T2 carries compressed bytes, T0 -> T2 is an offload of compressed bytes, and
// T1 <-> T2 is a recode inside host memory that crosses no bus.
struct TierMoves {
  std::uint64_t promoted = 0;    // host (T1/T2) -> HBM
  std::uint64_t demoted = 0;     // HBM -> host (T1)
  std::uint64_t compressed = 0;  // -> T2
  std::uint64_t evicted = 0;     // -> T3
  std::uint64_t newly_host = 0;  // tokens that entered T1 (what a differential prefetch moves)
  std::uint64_t promoted_from_compressed = 0;  // of `promoted`, those from T2
  std::uint64_t compressed_from_hbm = 0;       // of `compressed`, those from HBM (not from T1)
};

class LayerPlacement {
 public:
  [[nodiscard]] std::uint64_t size() const noexcept { return tiers_.size(); }
  [[nodiscard]] Tier tier(std::uint64_t token) const { return tiers_[token]; }
  [[nodiscard]] std::uint64_t count(Tier tier) const {
    return counts_[static_cast<std::size_t>(tier)];
  }
  // Tokens not evicted.
  [[nodiscard]] std::uint64_t resident() const { return size() - count(Tier::kEvicted); }
  // 1 for tokens held (T0–T2) and 0 for evicted ones; 1 for tokens in HBM. Kept beside the
  // tiers so that per-step sums over a layer's tokens are plain vectorisable dot products.
  [[nodiscard]] std::span<const float> resident_mask() const noexcept { return resident_mask_; }
  [[nodiscard]] std::span<const float> hbm_mask() const noexcept { return hbm_mask_; }
  // 1 for tokens in T2.
  [[nodiscard]] std::span<const float> compressed_mask() const noexcept { return compressed_mask_; }

  // A new token (always placed in HBM: it was just computed there).
  void append();
  // Moves a token; evicted tokens cannot come back (throws std::logic_error).
  void move(std::uint64_t token, Tier to);

  [[nodiscard]] const TierMoves& moves() const noexcept { return moves_; }
  void reset_moves() noexcept { moves_ = {}; }

 private:
  std::vector<Tier> tiers_;
  std::vector<float> resident_mask_;
  std::vector<float> hbm_mask_;
  std::vector<float> compressed_mask_;
  std::array<std::uint64_t, kTierCount> counts_{};
  TierMoves moves_;
};

}  // namespace kvtier::replay
