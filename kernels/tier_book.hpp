#pragma once
// The live tiered cache's bookkeeping, shared by its CPU and CUDA backends (docs/LIVE.md): where
// every token-layer's data is and in which slot of its tier, the moves that make the data follow
// the policy's placement, what a layer's attention must stage, and the byte counts of every copy.
// The backends own the memory and perform the copies a plan lists; the book never touches data,
// so what the CPU backend's tests establish about placement, slots and byte counts holds for the
// CUDA backend too.
//
// Slots: fixed-size, one token-layer each. T0 (the budgeted arena), T1 (host, full precision),
// T2 (host, compressed) and the persistent staging slots of differential prefetch each have a
// pool. A slot freed while a plan is made is handed out again only after that plan: the moves of
// one phase can then run in any order (the CUDA backend runs them grouped by kind).
//
// Host homes: given the most positions a layer holds (host_positions), a T1 or T2 token-layer's
// slot is layer · host_positions + position instead of the next free one. A layer's host tokens
// then lie in position order, so staging all of a layer's T1 tokens reads as many contiguous
// runs as the layer has runs of T1 positions (about one per layer and step on the H200 runs'
// trace) rather than one or two slots per run in allocation order; the copy engines copy each
// run as one piece. The CUDA backend sizes its host tiers for every token-layer anyway; the CPU
// backend allocates a layer's block of them when the layer first has a host token.

#include <array>
#include <cstdint>
#include <vector>

#include "replay/placement.hpp"

namespace kvtier::kernels {

enum class PrefetchMode { kFull, kDifferential };

// Bytes, token-layer copies and seconds of one kind of copy, and the contiguous pieces they
// were: maximal runs of consecutive slots on both sides among a plan's copies of one kind (a
// layer's staging, or one kind of move), as the CUDA backend's copy-engine batches copy them.
struct CopyCounter {
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0;
  double seconds = 0.0;
  std::uint64_t runs = 0;
};

struct TieredCacheStats {
  CopyCounter h2d_prefetch;    // T1 host arena -> staging
  CopyCounter h2d_compressed;  // T2 compressed bytes -> staging, dequantised there
  CopyCounter h2d_promote;     // T1/T2 -> T0 arena
  CopyCounter d2h_offload;     // T0 -> T1 (full precision) or T2 (compressed bytes)
  CopyCounter host_recode;     // T1 <-> T2 inside host memory (no bus crossing)
  // Peaks, bytes.
  std::uint64_t t0_peak_bytes = 0;
  std::uint64_t t1_peak_bytes = 0;
  std::uint64_t t2_peak_bytes = 0;
  std::uint64_t staging_peak_bytes = 0;
  // Sum over layers of tokens evicted (dropped) so far.
  std::uint64_t evicted_tokens = 0;

  [[nodiscard]] CopyCounter h2d() const;  // prefetch + compressed + promote
  // The counter a move between tiers is charged to; nullptr for an eviction (nothing moves).
  [[nodiscard]] CopyCounter* counter_of(replay::Tier from, replay::Tier to);
};

// Index-only pool of slots with a free list; `limit` slots at most (0: no limit).
class SlotAllocator {
 public:
  explicit SlotAllocator(std::uint64_t limit = 0) : limit_(limit) {}

  [[nodiscard]] std::uint32_t allocate();
  // Freed now, handed out again after release_deferred().
  void release_later(std::uint32_t slot);
  void release_deferred();
  // A pool of fixed homes instead (the host tiers' slots with TierBook's host_positions): each
  // slot belongs to one token, which takes it and releases it; allocate() is not used then.
  void take_home(std::uint32_t slot);
  void release_home();
  // Every slot free; capacity() is kept (backends keep the memory for the next run).
  void clear();

  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] bool full() const noexcept { return limit_ != 0 && used_ >= limit_; }
  // Slots ever handed out: a backend's memory must hold this many.
  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }

 private:
  std::uint64_t limit_ = 0;
  std::uint64_t used_ = 0;
  std::uint64_t capacity_ = 0;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> deferred_;
};

// One token-layer changing tier: its data moves from `from_slot` of tier `from` to `to_slot` of
// tier `to` (no slot for T3).
struct TokenMove {
  std::uint32_t layer = 0;
  std::uint64_t position = 0;
  replay::Tier from = replay::Tier::kHbm;
  replay::Tier to = replay::Tier::kHbm;
  std::uint32_t from_slot = 0;
  std::uint32_t to_slot = 0;
};

// T1 -> T2 or T2 -> T1: a recode inside host memory (the backends run them on the host).
[[nodiscard]] inline bool is_recode(const TokenMove& move) {
  const auto host = [](replay::Tier tier) {
    return tier == replay::Tier::kHost || tier == replay::Tier::kCompressed;
  };
  return host(move.from) && host(move.to) && move.from != move.to;
}

// The moves of one apply_placement: every demotion (phase 1: out of T0, T1 <-> T2, evictions)
// before any promotion into T0 (phase 2), so T0 slots freed by phase 1 serve phase 2.
struct MovePlan {
  std::vector<TokenMove> demotions;
  std::vector<TokenMove> promotions;
};

// Where attention reads one position of a layer.
struct ReadSlot {
  enum class Kind : std::uint8_t {
    kT0,         // the T0 arena's slot `index`
    kStaged,     // differential prefetch: persistent staging slot `index`
    kTransient,  // this layer's transient staging buffer, entry `index`
    kNone,       // evicted: attention skips it
  };
  Kind kind = Kind::kNone;
  std::uint32_t index = 0;
};

// A copy of one token-layer into staging.
struct SlotCopy {
  std::uint32_t from_slot = 0;  // T1 or T2 slot
  std::uint32_t to = 0;         // staging slot (differential T1) or transient entry
};

// What a layer's attention needs staged, and where it then reads each position.
struct StagePlan {
  // T1 tokens copied host -> staging: full prefetch, every T1 token into the transient buffer
  // (entries 0 .. n1 - 1); differential, only tokens without a staged copy, into new persistent
  // staging slots.
  std::vector<SlotCopy> t1_copies;
  // T2 tokens: their compressed bytes copied and dequantised into the transient buffer, after
  // the full-prefetch T1 entries.
  std::vector<SlotCopy> t2_reads;
  std::uint32_t transient_entries = 0;
  std::vector<ReadSlot> reads;  // per position
  bool any_evicted = false;
};

class TierBook {
 public:
  // token_bytes: a token-layer at full precision; compressed_token_bytes: in T2 (codes and
  // scales); host_positions: the most positions a layer will hold, for host homes (0: host
  // slots from their pools; layers · host_positions must fit 32 bits). ConfigError when the T0
  // budget holds no token-layer.
  TierBook(int layers, std::uint64_t t0_budget_bytes, std::uint64_t token_bytes,
           std::uint64_t compressed_token_bytes, PrefetchMode prefetch,
           std::uint64_t host_positions = 0);

  // The placement a policy reads and changes; plan_moves() makes the book follow it.
  [[nodiscard]] std::vector<replay::LayerPlacement>& placement() noexcept { return placement_; }

  // A new token of `layer` at `position` (the layer's next), placed in T0; returns its T0 slot.
  // ConfigError when the T0 budget is full.
  [[nodiscard]] std::uint32_t append(int layer, std::uint64_t position);
  // The moves that make the data follow placement(), with their slots; the book records them as
  // done (the backend must perform the plan before the next call) and counts their bytes in
  // stats() — the backend adds the seconds. ConfigError when a promotion does not fit in T0.
  [[nodiscard]] MovePlan plan_moves();
  // What `layer`'s attention over `positions` tokens reads, into `plan` (its buffers are reused:
  // this runs for every layer of every forward call); counts the staging copies' bytes.
  void plan_stage(int layer, std::uint64_t positions, StagePlan& plan);

  void reset();
  void reset_stats();

  [[nodiscard]] TieredCacheStats& stats() noexcept { return stats_; }
  [[nodiscard]] const TieredCacheStats& stats() const noexcept { return stats_; }
  [[nodiscard]] PrefetchMode prefetch() const noexcept { return prefetch_; }
  [[nodiscard]] int layers() const noexcept { return static_cast<int>(state_.size()); }
  [[nodiscard]] std::uint64_t t0_budget_bytes() const noexcept { return t0_budget_bytes_; }
  [[nodiscard]] std::uint64_t t0_limit() const noexcept { return t0_.limit(); }
  [[nodiscard]] std::uint64_t token_bytes() const noexcept { return token_bytes_; }
  [[nodiscard]] std::uint64_t compressed_token_bytes() const noexcept {
    return compressed_token_bytes_;
  }
  // Slots a backend's memory must hold per pool.
  [[nodiscard]] std::uint64_t t0_capacity() const noexcept { return t0_.capacity(); }
  [[nodiscard]] std::uint64_t t1_capacity() const noexcept { return t1_.capacity(); }
  [[nodiscard]] std::uint64_t t2_capacity() const noexcept { return t2_.capacity(); }
  [[nodiscard]] std::uint64_t staging_capacity() const noexcept { return staging_.capacity(); }
  // T1 tokens of `layer` without a staged copy (what a differential stage of it copies).
  [[nodiscard]] std::uint64_t unstaged_t1_tokens(int layer) const;
  // Bytes in each tier now (T0 arena, T1 arena, T2 store; T3 holds none).
  [[nodiscard]] std::array<std::uint64_t, replay::kTierCount> tier_bytes() const;

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFU;

  struct Layer {
    std::vector<replay::Tier> where;    // where each position's data is now
    std::vector<std::uint32_t> slot;    // its slot in that tier's pool
    std::vector<std::uint32_t> staged;  // differential: staging slot of a T1 token, or kNone
    std::uint64_t t1_tokens = 0;
    std::uint64_t t2_tokens = 0;
    std::uint64_t unstaged = 0;  // T1 tokens with staged == kNone
  };

  TokenMove plan_move(int layer, std::uint64_t position, replay::Tier to);
  // A host tier's (T1, T2) slot for a token entering it, and its release when the token leaves.
  [[nodiscard]] SlotAllocator& host_pool(replay::Tier tier);
  [[nodiscard]] std::uint32_t host_slot(replay::Tier tier, int layer, std::uint64_t position);
  void release_host(replay::Tier tier, std::uint32_t slot);
  // Adds a phase's contiguous pieces, kind by kind, to their counters.
  void count_runs(const std::vector<TokenMove>& moves);
  void update_peaks(std::uint64_t transient_entries);

  PrefetchMode prefetch_;
  std::uint64_t t0_budget_bytes_;
  std::uint64_t token_bytes_;
  std::uint64_t compressed_token_bytes_;
  std::uint64_t host_positions_;
  std::vector<replay::LayerPlacement> placement_;
  std::vector<Layer> state_;
  SlotAllocator t0_;
  SlotAllocator t1_;
  SlotAllocator t2_;
  SlotAllocator staging_;
  TieredCacheStats stats_;
};

}  // namespace kvtier::kernels
