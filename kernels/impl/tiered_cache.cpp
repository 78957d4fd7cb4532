// The live tiered KV cache's CPU backend (kernels/tiered_cache.hpp, docs/LIVE.md).
#include "kernels/tiered_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"
#include "kernels/cuda_tiered_cache.hpp"
#include "kernels/impl/host_recode.hpp"
#include "kernels/impl/kv_quantise.hpp"
#include "kernels/impl/worker_pool.hpp"

namespace kvtier::kernels {
namespace {

using replay::Tier;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kPooledBlockSlots = 4096;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename T>
void grow(std::vector<T>& arena, std::uint64_t slots, std::size_t width) {
  const auto size = static_cast<std::size_t>(slots) * width;
  if (arena.size() < size) {
    arena.resize(size);
  }
}

}  // namespace

void check_staging_lookahead(int layers, std::string_view what) {
  if (layers < 0 || layers > kMostStagingLookahead) {
    throw ConfigError(std::string(what) + " " + std::to_string(layers) + ": from 0 to " +
                      std::to_string(kMostStagingLookahead) + " layers");
  }
}

std::uint64_t resolved_t0_budget(const TieredCacheOptions& options, int layers,
                                 std::uint64_t token_bytes) {
  if (options.t0_budget_bytes != 0) {
    return options.t0_budget_bytes;
  }
  if (options.max_positions == 0) {
    throw std::logic_error("tiered cache: a full-cache T0 budget needs max_positions");
  }
  return options.max_positions * static_cast<std::uint64_t>(layers) * token_bytes;
}

TieredKvCache::TieredKvCache(const config::ModelSpec& spec, const TieredCacheOptions& options)
    : kv_heads_(static_cast<int>(spec.num_key_value_heads())),
      head_dim_(static_cast<int>(spec.head_dim())),
      token_floats_(2 * static_cast<std::size_t>(kv_heads_) * static_cast<std::size_t>(head_dim_)),
      compressed_width_(quantise::compressed_bytes(kv_heads_, head_dim_)),
      book_(static_cast<int>(spec.num_hidden_layers()),
            resolved_t0_budget(options, static_cast<int>(spec.num_hidden_layers()),
                               token_floats_ * 4),
            token_floats_ * 4, compressed_width_, options.prefetch, options.max_positions),
      // A block per layer with host homes; else slots handed out in turn, 4,096 to a block.
      t1_(token_floats_, options.max_positions > 0 ? options.max_positions : kPooledBlockSlots),
      t2_(compressed_width_, options.max_positions > 0 ? options.max_positions : kPooledBlockSlots),
      recode_pool_(std::make_unique<WorkerPool>(options.recode_threads)),
      keys_(static_cast<std::size_t>(kv_heads_)),
      values_(static_cast<std::size_t>(kv_heads_)),
      key_pointers_(static_cast<std::size_t>(kv_heads_)),
      value_pointers_(static_cast<std::size_t>(kv_heads_)) {}

TieredKvCache::~TieredKvCache() = default;

void TieredKvCache::grow_arenas() {
  grow(t0_, book_.t0_capacity(), token_floats_);
  grow(staging_, book_.staging_capacity(), token_floats_);
}

CacheAllocation TieredKvCache::allocation() const {
  CacheAllocation allocation;
  allocation.t0_arena_bytes = t0_.size() * sizeof(float);
  allocation.staging_bytes = staging_peak_allocation_;
  return allocation;
}

void TieredKvCache::store(const KeyValueWrite& write) {
  const std::uint32_t slot = book_.append(write.layer, static_cast<std::uint64_t>(write.position));
  grow_arenas();
  float* target = t0_slot(slot);
  const std::size_t half = token_floats_ / 2;
  std::copy_n(write.keys.data(), half, target);
  std::copy_n(write.values.data(), half, target + half);
}

// Every move but the T1 <-> T2 recodes (recode()).
void TieredKvCache::perform(const TokenMove& move) {
  if (move.to != Tier::kHbm && move.to != Tier::kEvicted && move.from != Tier::kHbm) {
    throw std::logic_error("tiered cache: a recode outside recode()");
  }
  switch (move.to) {
    case Tier::kHbm:
      if (move.from == Tier::kHost) {
        std::copy_n(t1_slot(move.from_slot), token_floats_, t0_slot(move.to_slot));
      } else {
        quantise::dequantise_token(t2_slot(move.from_slot), kv_heads_, head_dim_,
                                   t0_slot(move.to_slot));
      }
      break;
    case Tier::kHost:
      std::copy_n(t0_slot(move.from_slot), token_floats_, t1_slot(move.to_slot));
      break;
    case Tier::kCompressed:
      quantise::quantise_token(t0_slot(move.from_slot), kv_heads_, head_dim_,
                               t2_slot(move.to_slot));
      break;
    case Tier::kEvicted: return;
  }
}

void TieredKvCache::apply_placement() {
  const MovePlan plan = book_.plan_moves();
  grow_arenas();
  // A token-layer's copy takes nanoseconds, as long as reading the clock: the clock is read
  // where the kind of move changes, and each run of moves of one kind is charged to its counter.
  // A phase's recodes run after its other moves, on the pool (any order within a phase is the
  // same: kernels/impl/host_recode.hpp).
  for (const std::vector<TokenMove>* moves : {&plan.demotions, &plan.promotions}) {
    CopyCounter* running = nullptr;
    Clock::time_point run_start;
    std::vector<const TokenMove*> recodes;
    for (const TokenMove& move : *moves) {
      if (is_recode(move)) {
        recodes.push_back(&move);
        continue;
      }
      CopyCounter* counter = book_.stats().counter_of(move.from, move.to);
      if (counter != running) {
        const auto now = Clock::now();
        if (running != nullptr) {
          running->seconds += std::chrono::duration<double>(now - run_start).count();
        }
        running = counter;
        run_start = now;
      }
      perform(move);
    }
    if (running != nullptr) {
      running->seconds += seconds_since(run_start);
    }
    if (!recodes.empty()) {
      const auto start = Clock::now();
      recode(recodes);
      book_.stats().host_recode.seconds += seconds_since(start);
    }
  }
}

void TieredKvCache::recode(const std::vector<const TokenMove*>& moves) {
  // Slots are found here, on this thread: finding one may allocate its host block.
  struct Recode {
    const void* source;
    void* target;
    bool quantise;
  };
  std::vector<Recode> recodes;
  recodes.reserve(moves.size());
  for (const TokenMove* move : moves) {
    if (move->to == Tier::kCompressed) {
      recodes.push_back({t1_slot(move->from_slot), t2_slot(move->to_slot), true});
    } else {
      recodes.push_back({t2_slot(move->from_slot), t1_slot(move->to_slot), false});
    }
  }
  recode_on_pool(*recode_pool_, recodes.size(), token_floats_, 0, [&](std::size_t i, float*) {
    const Recode& item = recodes[i];
    if (item.quantise) {
      quantise::quantise_token(static_cast<const float*>(item.source), kv_heads_, head_dim_,
                               static_cast<std::int8_t*>(item.target));
    } else {
      quantise::dequantise_token(static_cast<const std::int8_t*>(item.source), kv_heads_, head_dim_,
                                 static_cast<float*>(item.target));
    }
  });
}

LayerKeyValues TieredKvCache::load(int layer, int positions) {
  book_.plan_stage(layer, static_cast<std::uint64_t>(positions), stage_plan_);
  const StagePlan& plan = stage_plan_;
  grow_arenas();
  TieredCacheStats& stats = book_.stats();
  transient_.resize(static_cast<std::size_t>(plan.transient_entries) * token_floats_);
  staging_peak_allocation_ = std::max<std::uint64_t>(
      staging_peak_allocation_, (staging_.size() + transient_.size()) * sizeof(float));
  // 1. Stage T1: host arena -> staging (host to device).
  if (!plan.t1_copies.empty()) {
    const auto start = Clock::now();
    const bool full = book_.prefetch() == PrefetchMode::kFull;
    for (const SlotCopy& copy : plan.t1_copies) {
      float* target = full ? transient_.data() + static_cast<std::size_t>(copy.to) * token_floats_
                           : slot_of(staging_, copy.to, token_floats_);
      std::copy_n(t1_slot(copy.from_slot), token_floats_, target);
    }
    stats.h2d_prefetch.seconds += seconds_since(start);
  }
  // 2. T2: the compressed bytes cross to the device, where they are dequantised.
  if (!plan.t2_reads.empty()) {
    const auto start = Clock::now();
    compressed_.resize(plan.t2_reads.size() * compressed_width_);
    for (std::size_t i = 0; i < plan.t2_reads.size(); ++i) {
      std::copy_n(t2_slot(plan.t2_reads[i].from_slot), compressed_width_,
                  compressed_.data() + i * compressed_width_);
    }
    stats.h2d_compressed.seconds += seconds_since(start);
    for (std::size_t i = 0; i < plan.t2_reads.size(); ++i) {
      quantise::dequantise_token(
          compressed_.data() + i * compressed_width_, kv_heads_, head_dim_,
          transient_.data() + static_cast<std::size_t>(plan.t2_reads[i].to) * token_floats_);
    }
  }
  // 3. Assemble what attention reads, per KV head (a GPU kernel reads through a page table).
  const auto count = static_cast<std::size_t>(positions);
  const auto width = static_cast<std::size_t>(head_dim_);
  const std::size_t half = token_floats_ / 2;
  for (int h = 0; h < kv_heads_; ++h) {
    keys_[static_cast<std::size_t>(h)].resize(count * width);
    values_[static_cast<std::size_t>(h)].resize(count * width);
  }
  readable_.assign(count, 1);
  for (std::size_t p = 0; p < count; ++p) {
    const ReadSlot read = plan.reads[p];
    const float* source = nullptr;
    switch (read.kind) {
      case ReadSlot::Kind::kT0: source = t0_slot(read.index); break;
      case ReadSlot::Kind::kStaged: source = slot_of(staging_, read.index, token_floats_); break;
      case ReadSlot::Kind::kTransient:
        source = transient_.data() + static_cast<std::size_t>(read.index) * token_floats_;
        break;
      case ReadSlot::Kind::kNone: readable_[p] = 0; break;
    }
    for (int h = 0; h < kv_heads_; ++h) {
      float* key = keys_[static_cast<std::size_t>(h)].data() + p * width;
      float* value = values_[static_cast<std::size_t>(h)].data() + p * width;
      if (source == nullptr) {
        std::fill_n(key, width, 0.0F);
        std::fill_n(value, width, 0.0F);
      } else {
        std::copy_n(source + static_cast<std::size_t>(h) * width, width, key);
        std::copy_n(source + half + static_cast<std::size_t>(h) * width, width, value);
      }
    }
  }
  for (int h = 0; h < kv_heads_; ++h) {
    key_pointers_[static_cast<std::size_t>(h)] = keys_[static_cast<std::size_t>(h)].data();
    value_pointers_[static_cast<std::size_t>(h)] = values_[static_cast<std::size_t>(h)].data();
  }
  LayerKeyValues view;
  view.keys = key_pointers_;
  view.values = value_pointers_;
  if (plan.any_evicted) {
    view.readable = readable_;
  }
  return view;
}

std::unique_ptr<LiveKvCache> make_live_cache(Engine& engine, const TieredCacheOptions& options) {
  if (engine.backend() == "cpu") {
    return std::make_unique<TieredKvCache>(engine.spec(), options);
  }
  if (engine.backend() == "cuda") {
    return make_cuda_tiered_cache(engine, options);
  }
  throw ConfigError("the live tiered cache has no backend for the " +
                    std::string(engine.backend()) + " engine");
}

}  // namespace kvtier::kernels
