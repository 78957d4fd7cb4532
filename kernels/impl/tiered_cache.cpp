// The live tiered KV cache on the CPU backend (kernels/tiered_cache.hpp, docs/LIVE.md).
#include "kernels/tiered_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {
namespace {

using replay::Tier;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void add(CopyCounter& counter, std::uint64_t tokens, std::uint64_t bytes_per_token,
         double seconds) {
  counter.tokens += tokens;
  counter.bytes += tokens * bytes_per_token;
  counter.seconds += seconds;
}

}  // namespace

CopyCounter TieredCacheStats::h2d() const {
  CopyCounter total;
  for (const CopyCounter* part : {&h2d_prefetch, &h2d_compressed, &h2d_promote}) {
    total.bytes += part->bytes;
    total.tokens += part->tokens;
    total.seconds += part->seconds;
  }
  return total;
}

template <typename T>
std::uint32_t TieredKvCache::SlotPool<T>::allocate() {
  ++used;
  if (!free.empty()) {
    const std::uint32_t slot = free.back();
    free.pop_back();
    return slot;
  }
  const std::size_t slots = data.size() / width;
  data.resize(data.size() + width);
  return static_cast<std::uint32_t>(slots);
}

template <typename T>
void TieredKvCache::SlotPool<T>::release(std::uint32_t slot) {
  --used;
  free.push_back(slot);
}

template <typename T>
void TieredKvCache::SlotPool<T>::clear() {
  free.clear();
  used = 0;
  // The slots' memory is kept for the next run.
  const std::size_t slots = data.size() / width;
  for (std::size_t slot = slots; slot > 0; --slot) {
    free.push_back(static_cast<std::uint32_t>(slot - 1));
  }
}

TieredKvCache::TieredKvCache(const config::ModelSpec& spec, const TieredCacheOptions& options)
    : options_(options),
      layers_(static_cast<int>(spec.num_hidden_layers())),
      kv_heads_(static_cast<int>(spec.num_key_value_heads())),
      head_dim_(static_cast<int>(spec.head_dim())),
      token_floats_(2 * static_cast<std::size_t>(kv_heads_) * static_cast<std::size_t>(head_dim_)),
      placement_(static_cast<std::size_t>(layers_)),
      state_(static_cast<std::size_t>(layers_)),
      keys_(static_cast<std::size_t>(kv_heads_)),
      values_(static_cast<std::size_t>(kv_heads_)),
      key_pointers_(static_cast<std::size_t>(kv_heads_)),
      value_pointers_(static_cast<std::size_t>(kv_heads_)) {
  if (options_.t0_budget_bytes < token_bytes()) {
    throw ConfigError("the T0 budget of " + std::to_string(options_.t0_budget_bytes) +
                      " bytes holds no token (one token of one layer takes " +
                      std::to_string(token_bytes()) + " bytes)");
  }
  t0_.width = token_floats_;
  t0_.limit = options_.t0_budget_bytes / token_bytes();
  t1_.width = token_floats_;
  t2_.width = compressed_token_bytes();
  staging_.width = token_floats_;
}

std::uint64_t TieredKvCache::compressed_token_bytes() const noexcept {
  // int8 codes for K and V, and one float scale per KV head for K and for V.
  return token_floats_ + 2 * static_cast<std::uint64_t>(kv_heads_) * sizeof(float);
}

std::array<std::uint64_t, replay::kTierCount> TieredKvCache::tier_bytes() const {
  return {t0_.used * token_bytes(), t1_.used * token_bytes(), t2_.used * compressed_token_bytes(),
          0};
}

void TieredKvCache::update_peaks() {
  const auto bytes = tier_bytes();
  stats_.t0_peak_bytes = std::max(stats_.t0_peak_bytes, bytes[0]);
  stats_.t1_peak_bytes = std::max(stats_.t1_peak_bytes, bytes[1]);
  stats_.t2_peak_bytes = std::max(stats_.t2_peak_bytes, bytes[2]);
  const std::uint64_t staging = (staging_.used + transient_tokens_) * token_bytes();
  stats_.staging_peak_bytes = std::max(stats_.staging_peak_bytes, staging);
}

void TieredKvCache::reset() {
  for (replay::LayerPlacement& layer : placement_) {
    layer = replay::LayerPlacement();
  }
  for (Layer& layer : state_) {
    layer = Layer();
  }
  t0_.clear();
  t1_.clear();
  t2_.clear();
  staging_.clear();
  transient_tokens_ = 0;
}

void TieredKvCache::reset_stats() {
  stats_ = {};
}

void TieredKvCache::store(const KeyValueWrite& write) {
  Layer& layer = state_.at(static_cast<std::size_t>(write.layer));
  if (static_cast<std::size_t>(write.position) != layer.where.size()) {
    throw std::logic_error("tiered cache: position " + std::to_string(write.position) +
                           " stored into layer " + std::to_string(write.layer) + " holding " +
                           std::to_string(layer.where.size()) + " tokens");
  }
  if (t0_.used >= t0_.limit) {
    throw ConfigError("the T0 budget of " + std::to_string(options_.t0_budget_bytes) + " bytes (" +
                      std::to_string(t0_.limit) + " token-layers) is full when position " +
                      std::to_string(write.position) + " of layer " + std::to_string(write.layer) +
                      " arrives: raise the budget or choose a policy that keeps less in T0");
  }
  const std::uint32_t slot = t0_.allocate();
  float* target = t0_.at(slot);
  const std::size_t half = token_floats_ / 2;
  std::copy_n(write.keys.data(), half, target);
  std::copy_n(write.values.data(), half, target + half);
  layer.where.push_back(Tier::kHbm);
  layer.slot.push_back(slot);
  layer.staged.push_back(kNone);
  placement_[static_cast<std::size_t>(write.layer)].append();
  update_peaks();
}

void TieredKvCache::quantise(const float* source, std::int8_t* codes) const {
  // Groups of head_dim: K of each KV head, then V of each KV head, as in the full-precision slot.
  const std::size_t groups = 2 * static_cast<std::size_t>(kv_heads_);
  std::int8_t* scales = codes + token_floats_;
  for (std::size_t group = 0; group < groups; ++group) {
    const float* x = source + group * static_cast<std::size_t>(head_dim_);
    float absmax = 0.0F;
    for (int i = 0; i < head_dim_; ++i) {
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    const float scale = absmax / 127.0F;
    std::int8_t* q = codes + group * static_cast<std::size_t>(head_dim_);
    for (int i = 0; i < head_dim_; ++i) {
      const float code = scale > 0.0F ? std::nearbyint(x[i] / scale) : 0.0F;
      q[i] = static_cast<std::int8_t>(std::clamp(code, -127.0F, 127.0F));
    }
    std::memcpy(scales + group * sizeof(float), &scale, sizeof(float));
  }
}

void TieredKvCache::dequantise(const std::int8_t* codes, float* target) const {
  const std::size_t groups = 2 * static_cast<std::size_t>(kv_heads_);
  const std::int8_t* scales = codes + token_floats_;
  for (std::size_t group = 0; group < groups; ++group) {
    float scale = 0.0F;
    std::memcpy(&scale, scales + group * sizeof(float), sizeof(float));
    const std::int8_t* q = codes + group * static_cast<std::size_t>(head_dim_);
    float* x = target + group * static_cast<std::size_t>(head_dim_);
    for (int i = 0; i < head_dim_; ++i) {
      x[i] = static_cast<float>(q[i]) * scale;
    }
  }
}

void TieredKvCache::drop_staged(Layer& layer, std::uint64_t position) {
  if (layer.staged[position] != kNone) {
    staging_.release(layer.staged[position]);
    layer.staged[position] = kNone;
  }
}

void TieredKvCache::move(int layer_index, std::uint64_t position, Tier to) {
  Layer& layer = state_[static_cast<std::size_t>(layer_index)];
  const Tier from = layer.where[position];
  const std::uint32_t slot = layer.slot[position];
  std::uint32_t target = kNone;
  const auto start = Clock::now();
  if (to == Tier::kHbm) {
    if (t0_.used >= t0_.limit) {
      throw ConfigError("the T0 budget of " + std::to_string(options_.t0_budget_bytes) +
                        " bytes (" + std::to_string(t0_.limit) +
                        " token-layers) cannot take a promoted token of layer " +
                        std::to_string(layer_index) + ": raise the budget");
    }
    target = t0_.allocate();
    if (from == Tier::kHost) {
      std::copy_n(t1_.at(slot), token_floats_, t0_.at(target));
      add(stats_.h2d_promote, 1, token_bytes(), seconds_since(start));
    } else {
      dequantise(t2_.at(slot), t0_.at(target));
      add(stats_.h2d_promote, 1, compressed_token_bytes(), seconds_since(start));
    }
  } else if (to == Tier::kHost) {
    target = t1_.allocate();
    if (from == Tier::kHbm) {
      std::copy_n(t0_.at(slot), token_floats_, t1_.at(target));
      add(stats_.d2h_offload, 1, token_bytes(), seconds_since(start));
    } else {
      dequantise(t2_.at(slot), t1_.at(target));
      add(stats_.host_recode, 1, compressed_token_bytes(), seconds_since(start));
    }
  } else if (to == Tier::kCompressed) {
    target = t2_.allocate();
    if (from == Tier::kHbm) {
      quantise(t0_.at(slot), t2_.at(target));
      add(stats_.d2h_offload, 1, compressed_token_bytes(), seconds_since(start));
    } else {
      quantise(t1_.at(slot), t2_.at(target));
      add(stats_.host_recode, 1, token_bytes(), seconds_since(start));
    }
  } else {
    ++stats_.evicted_tokens;
  }
  // Free the old copy.
  switch (from) {
    case Tier::kHbm: t0_.release(slot); break;
    case Tier::kHost:
      t1_.release(slot);
      --layer.t1_tokens;
      drop_staged(layer, position);
      break;
    case Tier::kCompressed:
      t2_.release(slot);
      --layer.t2_tokens;
      break;
    case Tier::kEvicted: throw std::logic_error("tiered cache: an evicted token cannot come back");
  }
  if (to == Tier::kHost) {
    ++layer.t1_tokens;
  } else if (to == Tier::kCompressed) {
    ++layer.t2_tokens;
  }
  layer.where[position] = to;
  layer.slot[position] = target;
}

void TieredKvCache::apply_placement() {
  // Pass 1: everything that does not enter T0; pass 2: promotions into T0.
  for (int pass = 0; pass < 2; ++pass) {
    for (int l = 0; l < layers_; ++l) {
      const replay::LayerPlacement& placement = placement_[static_cast<std::size_t>(l)];
      Layer& layer = state_[static_cast<std::size_t>(l)];
      if (placement.size() != layer.where.size()) {
        throw std::logic_error("tiered cache: placement and data of layer " + std::to_string(l) +
                               " differ in length");
      }
      for (std::uint64_t position = 0; position < layer.where.size(); ++position) {
        const Tier to = placement.tier(position);
        if (to != layer.where[position] && ((to == Tier::kHbm) == (pass == 1))) {
          move(l, position, to);
        }
      }
    }
    update_peaks();
  }
}

LayerKeyValues TieredKvCache::load(int layer_index, int positions) {
  Layer& layer = state_.at(static_cast<std::size_t>(layer_index));
  const auto count = static_cast<std::size_t>(positions);
  if (count != layer.where.size()) {
    throw std::logic_error("tiered cache: layer " + std::to_string(layer_index) + " holds " +
                           std::to_string(layer.where.size()) + " tokens, attention asked for " +
                           std::to_string(positions));
  }
  // 1. Stage T1: copy host arena -> staging (host to device).
  transient_tokens_ = 0;
  if (layer.t1_tokens > 0) {
    const auto start = Clock::now();
    std::uint64_t copied = 0;
    if (options_.prefetch == PrefetchMode::kFull) {
      transient_.resize(layer.t1_tokens * token_floats_);
      transient_index_.assign(count, kNone);
      std::uint32_t next = 0;
      for (std::size_t p = 0; p < count; ++p) {
        if (layer.where[p] == Tier::kHost) {
          std::copy_n(t1_.at(layer.slot[p]), token_floats_,
                      transient_.data() + static_cast<std::size_t>(next) * token_floats_);
          transient_index_[p] = next++;
        }
      }
      copied = next;
      transient_tokens_ = next;
    } else {
      for (std::size_t p = 0; p < count; ++p) {
        if (layer.where[p] == Tier::kHost && layer.staged[p] == kNone) {
          layer.staged[p] = staging_.allocate();
          std::copy_n(t1_.at(layer.slot[p]), token_floats_, staging_.at(layer.staged[p]));
          ++copied;
        }
      }
    }
    add(stats_.h2d_prefetch, copied, token_bytes(), seconds_since(start));
  }
  // 2. T2: the compressed bytes cross to the device, where they are dequantised.
  const std::size_t compressed_width = compressed_token_bytes();
  if (layer.t2_tokens > 0) {
    const auto start = Clock::now();
    compressed_.resize(layer.t2_tokens * compressed_width);
    std::size_t next = 0;
    for (std::size_t p = 0; p < count; ++p) {
      if (layer.where[p] == Tier::kCompressed) {
        std::copy_n(t2_.at(layer.slot[p]), compressed_width,
                    compressed_.data() + next * compressed_width);
        ++next;
      }
    }
    add(stats_.h2d_compressed, next, compressed_width, seconds_since(start));
  }
  update_peaks();
  // 3. Assemble what attention reads, per KV head.
  const auto width = static_cast<std::size_t>(head_dim_);
  const std::size_t half = token_floats_ / 2;
  for (int h = 0; h < kv_heads_; ++h) {
    keys_[static_cast<std::size_t>(h)].resize(count * width);
    values_[static_cast<std::size_t>(h)].resize(count * width);
  }
  readable_.assign(count, 1);
  bool any_evicted = false;
  scratch_.resize(token_floats_);
  std::size_t next_compressed = 0;
  for (std::size_t p = 0; p < count; ++p) {
    const float* source = nullptr;
    switch (layer.where[p]) {
      case Tier::kHbm: source = t0_.at(layer.slot[p]); break;
      case Tier::kHost:
        source =
            options_.prefetch == PrefetchMode::kFull
                ? transient_.data() + static_cast<std::size_t>(transient_index_[p]) * token_floats_
                : staging_.at(layer.staged[p]);
        break;
      case Tier::kCompressed:
        dequantise(compressed_.data() + next_compressed * compressed_width, scratch_.data());
        ++next_compressed;
        source = scratch_.data();
        break;
      case Tier::kEvicted:
        readable_[p] = 0;
        any_evicted = true;
        break;
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
  if (any_evicted) {
    view.readable = readable_;
  }
  return view;
}

}  // namespace kvtier::kernels
