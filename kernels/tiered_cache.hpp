#pragma once
// The live tiered KV cache, CPU backend (docs/LIVE.md). It is the engine's KeyValueStore: every
// key and value the forward pass computes is stored here, and attention reads each layer back
// from here. Where a token lives is a replay::LayerPlacement per layer — the very objects the
// replay's policies read and write — and apply_placement() moves the data to match:
//
//   T0 "HBM": one arena for all layers with a hard byte budget (full precision);
//   T1 host:  a host arena at full precision, staged (copied into a staging buffer) before each
//             layer's attention: all of T1 every step (prefetch full) or only the tokens new to
//             T1 since the last step, the staged copies being kept (prefetch differential);
//   T2:       host memory, 8-bit: per token, per KV head and separately for K and V, one float
//             scale = absmax / 127 and int8 q = round(x / scale) clamped to ±127; read as q·scale;
//   T3:       dropped; attention leaves it out of the softmax.
//
// Copies are counted per direction: host → device (staging T1, the compressed bytes of T2,
// promotions into T0) and device → host (offloads out of T0). Each is timed with a steady clock.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/engine.hpp"
#include "replay/placement.hpp"

namespace kvtier::kernels {

enum class PrefetchMode { kFull, kDifferential };

struct TieredCacheOptions {
  // Hard limit of the T0 arena, all layers together; a store or promotion past it throws
  // ConfigError. Must hold at least one token-layer.
  std::uint64_t t0_budget_bytes = 0;
  PrefetchMode prefetch = PrefetchMode::kFull;
};

// Bytes, token-layer copies and seconds of one kind of copy.
struct CopyCounter {
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0;
  double seconds = 0.0;
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
};

class TieredKvCache final : public KeyValueStore {
 public:
  TieredKvCache(const config::ModelSpec& spec, const TieredCacheOptions& options);

  void store(const KeyValueWrite& write) override;
  LayerKeyValues load(int layer, int positions) override;

  // The placement a policy reads and changes (start/observe); apply_placement() then makes the
  // data follow. Tokens are appended (in T0) by store().
  [[nodiscard]] std::vector<replay::LayerPlacement>& placement() noexcept { return placement_; }
  // Moves every token whose placement differs from where its data is: demotions first (so T0
  // space freed this step can be reused), then promotions into T0.
  void apply_placement();
  // Empties the cache (keeps the statistics' peaks; reset_stats() clears them).
  void reset();
  void reset_stats();

  [[nodiscard]] const TieredCacheStats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::uint64_t t0_budget_bytes() const noexcept { return options_.t0_budget_bytes; }
  // Bytes in each tier now (T0 arena, T1 arena, T2 store; T3 holds none).
  [[nodiscard]] std::array<std::uint64_t, replay::kTierCount> tier_bytes() const;
  // One token of one layer: K and V of every KV head at float32, and compressed (int8 + scales).
  [[nodiscard]] std::uint64_t token_bytes() const noexcept { return token_floats_ * 4; }
  [[nodiscard]] std::uint64_t compressed_token_bytes() const noexcept;

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFU;

  // Fixed-size slots of T elements with a free list; `limit` slots at most (0: no limit).
  template <typename T>
  struct SlotPool {
    std::size_t width = 0;
    std::uint64_t limit = 0;
    std::vector<T> data;
    std::vector<std::uint32_t> free;
    std::uint64_t used = 0;
    [[nodiscard]] std::uint32_t allocate();
    void release(std::uint32_t slot);
    [[nodiscard]] T* at(std::uint32_t slot) { return data.data() + slot * width; }
    void clear();
  };

  struct Layer {
    std::vector<replay::Tier> where;    // where each position's data is now
    std::vector<std::uint32_t> slot;    // its slot in that tier's pool
    std::vector<std::uint32_t> staged;  // differential: staging slot of a T1 token, or kNone
    std::uint64_t t1_tokens = 0;
    std::uint64_t t2_tokens = 0;
  };

  void move(int layer, std::uint64_t position, replay::Tier to);
  void quantise(const float* source, std::int8_t* codes) const;
  void dequantise(const std::int8_t* codes, float* target) const;
  void drop_staged(Layer& layer, std::uint64_t position);
  void update_peaks();

  TieredCacheOptions options_;
  int layers_ = 0;
  int kv_heads_ = 0;
  int head_dim_ = 0;
  std::size_t token_floats_ = 0;  // 2 * kv_heads * head_dim

  std::vector<replay::LayerPlacement> placement_;
  std::vector<Layer> state_;
  SlotPool<float> t0_;                   // the T0 arena
  SlotPool<float> t1_;                   // host arena, full precision
  SlotPool<std::int8_t> t2_;             // host, int8 codes then the float scales' bytes
  SlotPool<float> staging_;              // differential: kept staged copies of T1
  std::vector<float> transient_;         // full prefetch: this layer's staged T1
  std::vector<std::int8_t> compressed_;  // this layer's T2 bytes as copied to the device
  std::vector<std::uint32_t> transient_index_;
  std::uint64_t transient_tokens_ = 0;
  // What attention reads: per KV head [positions][head_dim], and the readable mask.
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
  std::vector<const float*> key_pointers_;
  std::vector<const float*> value_pointers_;
  std::vector<std::uint8_t> readable_;
  std::vector<float> scratch_;
  TieredCacheStats stats_;
};

}  // namespace kvtier::kernels
