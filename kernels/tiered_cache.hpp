#pragma once
// The live tiered KV cache (docs/LIVE.md). Where a token lives is a replay::LayerPlacement per
// layer — the very objects the replay's policies read and write — and apply_placement() moves
// the data to match:
//
//   T0 "HBM": one arena for all layers with a hard byte budget (full precision);
//   T1 host:  a host arena at full precision, staged (copied into a staging buffer) before each
//             layer's attention: all of T1 every step (prefetch full) or only the tokens new to
//             T1 since the last step, the staged copies being kept (prefetch differential);
//   T2:       host memory, 8-bit (kernels/impl/kv_quantise.hpp);
//   T3:       dropped; attention leaves it out of the softmax.
//
// The bookkeeping — slots, moves, staging plans and byte counts — is kernels/tier_book.hpp, one
// implementation for both backends; a backend owns the memory and performs the copies.
// TieredKvCache is the CPU backend: the CPU engine's KeyValueStore, copies are memcpy between
// host arenas, each kind timed with a steady clock. The CUDA backend is
// kernels/cuda_tiered_cache.hpp.

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/engine.hpp"
#include "kernels/tier_book.hpp"
#include "replay/placement.hpp"

namespace kvtier::kernels {

class WorkerPool;

// What moves full-precision slots between device and host memory on the CUDA backend.
enum class CacheCopies {
  // Kernels that read or write the mapped host tiers in place, one block per slot: any batch
  // in one launch, however scattered. They need SMs, which the engine's kernels hold.
  kKernels,
  // The GPU's copy engines: the slot pairs merged into runs of consecutive slots on both sides,
  // one cudaMemcpyBatchAsync (or a cudaMemcpyAsync per run before CUDA 13). T2's quantising and
  // dequantising moves stay kernels.
  kCopyEngines,
};
// "kernels" or "copy-engines", as `--cuda-copies` spells them.
[[nodiscard]] constexpr std::string_view cache_copies_name(CacheCopies copies) {
  return copies == CacheCopies::kCopyEngines ? "copy-engines" : "kernels";
}

struct TieredCacheOptions {
  // Hard limit of the T0 arena, all layers together; a store or promotion past it throws
  // ConfigError. Must hold at least one token-layer; 0: the full cache of max_positions tokens
  // in every layer.
  std::uint64_t t0_budget_bytes = 0;
  PrefetchMode prefetch = PrefetchMode::kFull;
  // Positions a run may reach (prompt + new tokens): the CUDA backend sizes its host tiers and
  // page tables for it up front, and both backends keep each host token-layer at its home slot
  // (kernels/tier_book.hpp). 0: not known (the CPU backend grows its arenas instead, its host
  // slots handed out in turn).
  std::uint64_t max_positions = 0;
  // Host tiers the policy can place tokens in: the CUDA backend pins them (sized for
  // max_positions) when it is made, so that the first offload does not pin hundreds of megabytes
  // inside a decode step. A tier not reserved is pinned when first used.
  bool reserve_t1 = false;
  bool reserve_t2 = false;
  // The CUDA backend's copies (the CPU backend copies in host memory either way).
  CacheCopies copies = CacheCopies::kKernels;
  // Host threads (the caller included) recoding T1 <-> T2 token-layers between steps, on the
  // step's path (kernels/impl/host_recode.hpp); at least 1. The bytes are the same for every
  // count.
  int recode_threads = 1;
  // The CUDA backend: layers staged ahead of the one computing (its copy stream fills
  // staging_lookahead + 1 transient regions in turn; kernels/cuda_tiered_cache.hpp). The CPU
  // backend stages a layer when its attention asks for it and has no use for this.
  int staging_lookahead = 1;
};

// How the recode threads share a step's recodes (kernels/impl/host_recode.hpp), as the
// simulator's tiering.host_recode states a pool: token-layers a thread takes at a time, and the
// values below which a step's recodes run on the calling thread alone.
struct RecodePoolShape {
  std::uint32_t chunk_token_layers;
  std::uint64_t parallel_min_values;
};
[[nodiscard]] RecodePoolShape recode_pool_shape();

// The most layers TieredCacheOptions::staging_lookahead may stage ahead of the one computing:
// the simulator's range (tiering.prefetch_lookahead_layers).
inline constexpr int kMostStagingLookahead = 16;
// ConfigError "WHAT N: from 0 to 16 layers" when `layers` is outside 0 .. kMostStagingLookahead.
void check_staging_lookahead(int layers, std::string_view what);

// options.t0_budget_bytes, or when it is 0 the full cache: max_positions * layers * token_bytes
// (std::logic_error when max_positions is 0 too).
[[nodiscard]] std::uint64_t resolved_t0_budget(const TieredCacheOptions& options, int layers,
                                               std::uint64_t token_bytes);

// What a cache allocated for its tiers, bytes.
struct CacheAllocation {
  std::uint64_t t0_arena_bytes = 0;
  std::uint64_t staging_bytes = 0;  // the largest staging allocation
  // The device's used memory (total - free) at its highest when sampled (every step); 0 on the
  // CPU backend.
  std::uint64_t device_used_peak_bytes = 0;
};

// What a live run drives, whatever the backend: the placement the policy changes, the moves
// that follow it, and the copies' figures.
class LiveKvCache {
 public:
  virtual ~LiveKvCache() = default;
  LiveKvCache() = default;
  LiveKvCache(const LiveKvCache&) = delete;
  LiveKvCache& operator=(const LiveKvCache&) = delete;
  LiveKvCache(LiveKvCache&&) = delete;
  LiveKvCache& operator=(LiveKvCache&&) = delete;

  // The placement a policy reads and changes (start/observe); apply_placement() then makes the
  // data follow. Tokens are appended (in T0) as the engine computes them.
  [[nodiscard]] virtual std::vector<replay::LayerPlacement>& placement() = 0;
  // Moves every token whose placement differs from where its data is: demotions first (so T0
  // space freed this step can be reused), then promotions into T0.
  virtual void apply_placement() = 0;
  // The figures so far, copies' times included (the CUDA backend waits for its copies).
  [[nodiscard]] virtual const TieredCacheStats& stats() = 0;
  // Bytes in each tier now (T0 arena, T1 arena, T2 store; T3 holds none).
  [[nodiscard]] virtual std::array<std::uint64_t, replay::kTierCount> tier_bytes() const = 0;
  [[nodiscard]] virtual std::uint64_t t0_budget_bytes() const = 0;
  // One token of one layer at full precision (K and V of every KV head), and compressed.
  [[nodiscard]] virtual std::uint64_t token_bytes() const = 0;
  [[nodiscard]] virtual std::uint64_t compressed_token_bytes() const = 0;
  [[nodiscard]] virtual CacheAllocation allocation() const = 0;
  // Makes `engine` keep its keys and values here (and detaches: nullptr semantics are the
  // engine's). Call after engine.reset().
  virtual void attach(Engine& engine) = 0;
  virtual void detach(Engine& engine) = 0;
};

// Host memory of the CPU backend's host tiers, in blocks of `block_slots` slots of `width`
// elements, each allocated (and left unwritten) when a slot in it is first used, and never
// moved. With host homes a block is a layer's positions, so a layer costs memory only once it
// has a host token.
template <typename T>
class HostBlocks {
 public:
  HostBlocks(std::size_t width, std::uint64_t block_slots)
      : width_(width), block_slots_(block_slots) {}

  [[nodiscard]] T* slot(std::uint32_t slot) {
    const auto block = static_cast<std::size_t>(slot / block_slots_);
    if (block >= blocks_.size()) {
      blocks_.resize(block + 1);
    }
    std::unique_ptr<T[]>& memory = blocks_[block];
    if (!memory) {
      memory = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(block_slots_) * width_);
    }
    return memory.get() + static_cast<std::size_t>(slot % block_slots_) * width_;
  }

 private:
  std::size_t width_;
  std::uint64_t block_slots_;
  std::vector<std::unique_ptr<T[]>> blocks_;
};

class TieredKvCache final : public LiveKvCache, public KeyValueStore {
 public:
  TieredKvCache(const config::ModelSpec& spec, const TieredCacheOptions& options);
  ~TieredKvCache() override;
  TieredKvCache(const TieredKvCache&) = delete;
  TieredKvCache& operator=(const TieredKvCache&) = delete;
  TieredKvCache(TieredKvCache&&) = delete;
  TieredKvCache& operator=(TieredKvCache&&) = delete;

  void store(const KeyValueWrite& write) override;
  LayerKeyValues load(int layer, int positions) override;

  [[nodiscard]] std::vector<replay::LayerPlacement>& placement() override {
    return book_.placement();
  }
  void apply_placement() override;
  [[nodiscard]] const TieredCacheStats& stats() override { return book_.stats(); }
  [[nodiscard]] std::array<std::uint64_t, replay::kTierCount> tier_bytes() const override {
    return book_.tier_bytes();
  }
  void attach(Engine& engine) override { engine.set_kv_store(this); }
  void detach(Engine& engine) override { engine.set_kv_store(nullptr); }

  // Empties the cache (keeps the statistics' peaks; reset_stats() clears them).
  void reset() { book_.reset(); }
  void reset_stats() { book_.reset_stats(); }

  [[nodiscard]] std::uint64_t t0_budget_bytes() const override { return book_.t0_budget_bytes(); }
  // float32 here.
  [[nodiscard]] std::uint64_t token_bytes() const override { return book_.token_bytes(); }
  [[nodiscard]] std::uint64_t compressed_token_bytes() const override {
    return book_.compressed_token_bytes();
  }
  [[nodiscard]] CacheAllocation allocation() const override;

 private:
  [[nodiscard]] float* t0_slot(std::uint32_t slot) { return slot_of(t0_, slot, token_floats_); }
  [[nodiscard]] float* t1_slot(std::uint32_t slot) { return t1_.slot(slot); }
  [[nodiscard]] std::int8_t* t2_slot(std::uint32_t slot) { return t2_.slot(slot); }
  template <typename T>
  [[nodiscard]] static T* slot_of(std::vector<T>& arena, std::uint32_t slot, std::size_t width) {
    return arena.data() + static_cast<std::size_t>(slot) * width;
  }
  void grow_arenas();
  void perform(const TokenMove& move);
  // The T1 <-> T2 recodes of one phase, on the recode pool.
  void recode(const std::vector<const TokenMove*>& moves);

  int kv_heads_ = 0;
  int head_dim_ = 0;
  std::size_t token_floats_ = 0;      // 2 * kv_heads * head_dim
  std::size_t compressed_width_ = 0;  // bytes of a compressed token-layer
  TierBook book_;
  std::vector<float> t0_;                // the T0 arena
  HostBlocks<float> t1_;                 // host arena, full precision
  HostBlocks<std::int8_t> t2_;           // host, int8 codes then the float scales' bytes
  std::vector<float> staging_;           // differential: kept staged copies of T1
  StagePlan stage_plan_;                 // the layer being loaded's
  std::vector<float> transient_;         // this layer's staged T1 (full) and dequantised T2
  std::vector<std::int8_t> compressed_;  // this layer's T2 bytes as copied to the device
  std::unique_ptr<WorkerPool> recode_pool_;
  // What attention reads: per KV head [positions][head_dim], and the readable mask.
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
  std::vector<const float*> key_pointers_;
  std::vector<const float*> value_pointers_;
  std::vector<std::uint8_t> readable_;
  std::uint64_t staging_peak_allocation_ = 0;
};

// The cache for `engine`'s backend: TieredKvCache for "cpu", the CUDA backend for "cuda"
// (ConfigError for an engine that has neither).
[[nodiscard]] std::unique_ptr<LiveKvCache> make_live_cache(Engine& engine,
                                                           const TieredCacheOptions& options);

}  // namespace kvtier::kernels
