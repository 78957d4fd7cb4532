// The live tiered cache's bookkeeping (kernels/tier_book.hpp).
#include "kernels/tier_book.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {
namespace {

using replay::Tier;

void count(CopyCounter& counter, std::uint64_t bytes_per_token) {
  ++counter.tokens;
  counter.bytes += bytes_per_token;
}

// Whether a copy continues the contiguous piece of the copy before it: both its slots follow.
bool continues(std::uint32_t previous_from, std::uint32_t previous_to, std::uint32_t from,
               std::uint32_t to) {
  return from == previous_from + 1 && to == previous_to + 1;
}

// The contiguous pieces of a staging list, in its order.
std::uint64_t runs_of(const std::vector<SlotCopy>& copies) {
  std::uint64_t runs = 0;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const bool joined = i > 0 && continues(copies[i - 1].from_slot, copies[i - 1].to,
                                           copies[i].from_slot, copies[i].to);
    runs += joined ? 0 : 1;
  }
  return runs;
}

}  // namespace

CopyCounter* TieredCacheStats::counter_of(Tier from, Tier to) {
  switch (to) {
    case Tier::kHbm: return &h2d_promote;
    case Tier::kHost:
    case Tier::kCompressed: return from == Tier::kHbm ? &d2h_offload : &host_recode;
    case Tier::kEvicted: return nullptr;
  }
  return nullptr;
}

CopyCounter TieredCacheStats::h2d() const {
  CopyCounter total;
  for (const CopyCounter* part : {&h2d_prefetch, &h2d_compressed, &h2d_promote}) {
    total.bytes += part->bytes;
    total.tokens += part->tokens;
    total.seconds += part->seconds;
    total.runs += part->runs;
  }
  return total;
}

std::uint32_t SlotAllocator::allocate() {
  ++used_;
  if (!free_.empty()) {
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  return static_cast<std::uint32_t>(capacity_++);
}

void SlotAllocator::release_later(std::uint32_t slot) {
  --used_;
  deferred_.push_back(slot);
}

void SlotAllocator::release_deferred() {
  free_.insert(free_.end(), deferred_.begin(), deferred_.end());
  deferred_.clear();
}

void SlotAllocator::take_home(std::uint32_t slot) {
  ++used_;
  capacity_ = std::max<std::uint64_t>(capacity_, std::uint64_t{slot} + 1);
}

void SlotAllocator::release_home() {
  --used_;
}

void SlotAllocator::clear() {
  used_ = 0;
  deferred_.clear();
  free_.clear();
  // Slot 0 is handed out first, as in a fresh pool.
  for (std::uint64_t slot = capacity_; slot > 0; --slot) {
    free_.push_back(static_cast<std::uint32_t>(slot - 1));
  }
}

namespace {

std::uint64_t t0_slots(std::uint64_t budget_bytes, std::uint64_t token_bytes) {
  if (budget_bytes < token_bytes) {
    throw ConfigError("the T0 budget of " + std::to_string(budget_bytes) +
                      " bytes holds no token (one token of one layer takes " +
                      std::to_string(token_bytes) + " bytes)");
  }
  return budget_bytes / token_bytes;
}

}  // namespace

TierBook::TierBook(int layers, std::uint64_t t0_budget_bytes, std::uint64_t token_bytes,
                   std::uint64_t compressed_token_bytes, PrefetchMode prefetch,
                   std::uint64_t host_positions)
    : prefetch_(prefetch),
      t0_budget_bytes_(t0_budget_bytes),
      token_bytes_(token_bytes),
      compressed_token_bytes_(compressed_token_bytes),
      host_positions_(host_positions),
      placement_(static_cast<std::size_t>(layers)),
      state_(static_cast<std::size_t>(layers)),
      t0_(t0_slots(t0_budget_bytes, token_bytes)) {
  if (host_positions_ >
      std::uint64_t{0xFFFFFFFFU} / static_cast<std::uint64_t>(std::max(1, layers))) {
    throw ConfigError(
        "the tiered cache indexes host slots with 32 bits: " + std::to_string(host_positions_) +
        " positions of " + std::to_string(layers) + " layers are too many");
  }
}

SlotAllocator& TierBook::host_pool(Tier tier) {
  return tier == Tier::kHost ? t1_ : t2_;
}

std::uint32_t TierBook::host_slot(Tier tier, int layer, std::uint64_t position) {
  SlotAllocator& pool = host_pool(tier);
  if (host_positions_ == 0) {
    return pool.allocate();
  }
  if (position >= host_positions_) {
    throw std::logic_error("tiered cache: position " + std::to_string(position) +
                           " is past the host homes' " + std::to_string(host_positions_));
  }
  const auto slot =
      static_cast<std::uint32_t>(static_cast<std::uint64_t>(layer) * host_positions_ + position);
  pool.take_home(slot);
  return slot;
}

void TierBook::release_host(Tier tier, std::uint32_t slot) {
  SlotAllocator& pool = host_pool(tier);
  if (host_positions_ == 0) {
    pool.release_later(slot);
  } else {
    pool.release_home();
  }
}

std::uint64_t TierBook::unstaged_t1_tokens(int layer) const {
  return state_.at(static_cast<std::size_t>(layer)).unstaged;
}

std::array<std::uint64_t, replay::kTierCount> TierBook::tier_bytes() const {
  return {t0_.used() * token_bytes_, t1_.used() * token_bytes_,
          t2_.used() * compressed_token_bytes_, 0};
}

void TierBook::update_peaks(std::uint64_t transient_entries) {
  const auto bytes = tier_bytes();
  stats_.t0_peak_bytes = std::max(stats_.t0_peak_bytes, bytes[0]);
  stats_.t1_peak_bytes = std::max(stats_.t1_peak_bytes, bytes[1]);
  stats_.t2_peak_bytes = std::max(stats_.t2_peak_bytes, bytes[2]);
  const std::uint64_t staging = (staging_.used() + transient_entries) * token_bytes_;
  stats_.staging_peak_bytes = std::max(stats_.staging_peak_bytes, staging);
}

void TierBook::reset() {
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
}

void TierBook::reset_stats() {
  stats_ = {};
}

std::uint32_t TierBook::append(int layer_index, std::uint64_t position) {
  Layer& layer = state_.at(static_cast<std::size_t>(layer_index));
  if (position != layer.where.size()) {
    throw std::logic_error("tiered cache: position " + std::to_string(position) +
                           " stored into layer " + std::to_string(layer_index) + " holding " +
                           std::to_string(layer.where.size()) + " tokens");
  }
  if (t0_.full()) {
    throw ConfigError("the T0 budget of " + std::to_string(t0_budget_bytes_) + " bytes (" +
                      std::to_string(t0_.limit()) + " token-layers) is full when position " +
                      std::to_string(position) + " of layer " + std::to_string(layer_index) +
                      " arrives: raise the budget or choose a policy that keeps less in T0");
  }
  const std::uint32_t slot = t0_.allocate();
  layer.where.push_back(Tier::kHbm);
  layer.slot.push_back(slot);
  layer.staged.push_back(kNone);
  placement_[static_cast<std::size_t>(layer_index)].append();
  update_peaks(0);
  return slot;
}

TokenMove TierBook::plan_move(int layer_index, std::uint64_t position, Tier to) {
  Layer& layer = state_[static_cast<std::size_t>(layer_index)];
  TokenMove move;
  move.layer = static_cast<std::uint32_t>(layer_index);
  move.position = position;
  move.from = layer.where[position];
  move.to = to;
  move.from_slot = layer.slot[position];
  move.to_slot = kNone;
  switch (to) {
    case Tier::kHbm:
      if (t0_.full()) {
        throw ConfigError("the T0 budget of " + std::to_string(t0_budget_bytes_) + " bytes (" +
                          std::to_string(t0_.limit()) +
                          " token-layers) cannot take a promoted token of layer " +
                          std::to_string(layer_index) + ": raise the budget");
      }
      move.to_slot = t0_.allocate();
      // A T2 token crosses compressed and is dequantised on arrival.
      count(*stats_.counter_of(move.from, to),
            move.from == Tier::kHost ? token_bytes_ : compressed_token_bytes_);
      break;
    case Tier::kHost:
      move.to_slot = host_slot(Tier::kHost, layer_index, position);
      ++layer.t1_tokens;
      ++layer.unstaged;
      // A recode reads the T2 token: counted at the size read.
      count(*stats_.counter_of(move.from, to),
            move.from == Tier::kHbm ? token_bytes_ : compressed_token_bytes_);
      break;
    case Tier::kCompressed:
      move.to_slot = host_slot(Tier::kCompressed, layer_index, position);
      ++layer.t2_tokens;
      // Quantised where the data is: a T0 token crosses as compressed bytes; a recode reads the
      // full-precision T1 token.
      count(*stats_.counter_of(move.from, to),
            move.from == Tier::kHbm ? compressed_token_bytes_ : token_bytes_);
      break;
    case Tier::kEvicted: ++stats_.evicted_tokens; break;
  }
  switch (move.from) {
    case Tier::kHbm: t0_.release_later(move.from_slot); break;
    case Tier::kHost:
      release_host(Tier::kHost, move.from_slot);
      --layer.t1_tokens;
      if (layer.staged[position] != kNone) {
        staging_.release_later(layer.staged[position]);
        layer.staged[position] = kNone;
      } else {
        --layer.unstaged;
      }
      break;
    case Tier::kCompressed:
      release_host(Tier::kCompressed, move.from_slot);
      --layer.t2_tokens;
      break;
    case Tier::kEvicted: throw std::logic_error("tiered cache: an evicted token cannot come back");
  }
  layer.where[position] = to;
  layer.slot[position] = move.to_slot;
  return move;
}

MovePlan TierBook::plan_moves() {
  MovePlan plan;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<TokenMove>& moves = phase == 0 ? plan.demotions : plan.promotions;
    for (int l = 0; l < layers(); ++l) {
      const replay::LayerPlacement& placement = placement_[static_cast<std::size_t>(l)];
      const Layer& layer = state_[static_cast<std::size_t>(l)];
      if (placement.size() != layer.where.size()) {
        throw std::logic_error("tiered cache: placement and data of layer " + std::to_string(l) +
                               " differ in length");
      }
      for (std::uint64_t position = 0; position < layer.where.size(); ++position) {
        const Tier to = placement.tier(position);
        if (to != layer.where[position] && ((to == Tier::kHbm) == (phase == 1))) {
          moves.push_back(plan_move(l, position, to));
        }
      }
    }
    update_peaks(0);
    for (SlotAllocator* pool : {&t0_, &t1_, &t2_, &staging_}) {
      pool->release_deferred();
    }
    count_runs(moves);
  }
  return plan;
}

void TierBook::count_runs(const std::vector<TokenMove>& moves) {
  // The backends copy each kind of move (source tier, target tier) apart, in plan order: a move
  // joins the piece of the last move of its kind.
  std::array<const TokenMove*, replay::kTierCount * replay::kTierCount> last{};
  for (const TokenMove& move : moves) {
    CopyCounter* counter = stats_.counter_of(move.from, move.to);
    if (counter == nullptr) {
      continue;
    }
    const TokenMove*& previous = last[static_cast<std::size_t>(move.from) * replay::kTierCount +
                                      static_cast<std::size_t>(move.to)];
    const bool joined = previous != nullptr && continues(previous->from_slot, previous->to_slot,
                                                         move.from_slot, move.to_slot);
    counter->runs += joined ? 0 : 1;
    previous = &move;
  }
}

void TierBook::plan_stage(int layer_index, std::uint64_t positions, StagePlan& plan) {
  Layer& layer = state_.at(static_cast<std::size_t>(layer_index));
  if (positions != layer.where.size()) {
    throw std::logic_error("tiered cache: layer " + std::to_string(layer_index) + " holds " +
                           std::to_string(layer.where.size()) + " tokens, attention asked for " +
                           std::to_string(positions));
  }
  plan.t1_copies.clear();
  plan.t2_reads.clear();
  plan.any_evicted = false;
  plan.reads.resize(positions);
  const bool full = prefetch_ == PrefetchMode::kFull;
  const auto t1_entries = static_cast<std::uint32_t>(full ? layer.t1_tokens : 0);
  std::uint32_t next_t2 = t1_entries;
  for (std::uint64_t p = 0; p < positions; ++p) {
    ReadSlot& read = plan.reads[p];
    switch (layer.where[p]) {
      case Tier::kHbm: read = {ReadSlot::Kind::kT0, layer.slot[p]}; break;
      case Tier::kHost:
        if (full) {
          read = {ReadSlot::Kind::kTransient, static_cast<std::uint32_t>(plan.t1_copies.size())};
          plan.t1_copies.push_back({layer.slot[p], read.index});
        } else {
          if (layer.staged[p] == kNone) {
            layer.staged[p] = staging_.allocate();
            --layer.unstaged;
            plan.t1_copies.push_back({layer.slot[p], layer.staged[p]});
          }
          read = {ReadSlot::Kind::kStaged, layer.staged[p]};
        }
        break;
      case Tier::kCompressed:
        read = {ReadSlot::Kind::kTransient, next_t2};
        plan.t2_reads.push_back({layer.slot[p], next_t2++});
        break;
      case Tier::kEvicted:
        read = {ReadSlot::Kind::kNone, 0};
        plan.any_evicted = true;
        break;
    }
  }
  plan.transient_entries = next_t2;
  stats_.h2d_prefetch.runs += runs_of(plan.t1_copies);
  stats_.h2d_compressed.runs += runs_of(plan.t2_reads);
  stats_.h2d_prefetch.tokens += plan.t1_copies.size();
  stats_.h2d_prefetch.bytes += plan.t1_copies.size() * token_bytes_;
  stats_.h2d_compressed.tokens += plan.t2_reads.size();
  stats_.h2d_compressed.bytes += plan.t2_reads.size() * compressed_token_bytes_;
  update_peaks(plan.transient_entries);
}

}  // namespace kvtier::kernels
