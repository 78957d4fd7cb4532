#include "replay/engine.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"

#include "replay/kernels.hpp"

namespace kvtier::replay {
namespace {

// The step's attention on each tier: sums against the placement's masks.
std::array<double, kTierCount> mass_by_tier(const std::vector<float>& row,
                                            const LayerPlacement& tiers) {
  const double total = kernels::sum(row);
  std::array<double, kTierCount> mass{};
  if (tiers.count(Tier::kHbm) == tiers.size()) {
    mass[0] = total;
    return mass;
  }
  const double held = kernels::dot(row, tiers.resident_mask());
  const double hbm = kernels::dot(row, tiers.hbm_mask());
  mass[0] = hbm;
  mass[3] = total - held;
  // Sums against masks rather than a scan of the tiers, whatever the policy puts in T2.
  const double compressed =
      tiers.count(Tier::kCompressed) == 0 ? 0.0 : kernels::dot(row, tiers.compressed_mask());
  mass[2] = compressed;
  mass[1] = held - hbm - compressed;
  return mass;
}

// The record's shares of the step's attention from its masses by tier. `bounded`: the masses
// are a policy's own bound (kept, 0, 0, rest), whose T3 is a difference that rounding can make
// slightly negative. A row without a positive finite total is recorded as it is (a NaN stays
// visible in the summary).
std::array<float, kTierCount> attention_shares(const std::array<double, kTierCount>& mass,
                                               const LayerPlacement& tiers, bool bounded) {
  const double all = mass[0] + mass[1] + mass[2] + mass[3];
  std::array<float, kTierCount> shares{};
  if (!(std::isfinite(all) && all > 0.0)) {
    for (std::size_t tier = 0; tier < kTierCount; ++tier) {
      shares[tier] = static_cast<float>(mass[tier]);
    }
    return shares;
  }
  for (std::size_t tier = 0; tier < kTierCount; ++tier) {
    shares[tier] = static_cast<float>(std::clamp(mass[tier] / all, 0.0, 1.0));
  }
  if (!bounded && tiers.count(Tier::kEvicted) == 0) {
    shares[3] = 0.0F;
  }
  return shares;
}

// A layer's tokens by tier and the moves since its last reset, into `record` (mass untouched).
void record_placement(const LayerPlacement& tiers, StepLayerRecord& record) {
  for (std::size_t tier = 0; tier < kTierCount; ++tier) {
    record.tokens[tier] = static_cast<std::uint32_t>(tiers.count(static_cast<Tier>(tier)));
  }
  const TierMoves& moves = tiers.moves();
  record.promoted = static_cast<std::uint32_t>(moves.promoted);
  record.demoted = static_cast<std::uint32_t>(moves.demoted);
  record.compressed = static_cast<std::uint32_t>(moves.compressed);
  record.evicted = static_cast<std::uint32_t>(moves.evicted);
  record.newly_host = static_cast<std::uint32_t>(moves.newly_host);
  record.promoted_from_compressed = static_cast<std::uint32_t>(moves.promoted_from_compressed);
  record.compressed_from_hbm = static_cast<std::uint32_t>(moves.compressed_from_hbm);
}

bool source_has(AttentionSource& source, PolicyInput input) {
  switch (input) {
    case PolicyInput::kHeadRows: return source.heads() > 0;
    case PolicyInput::kPrefillWindow: return source.prefill_window() > 0;
    case PolicyInput::kKeyNorms: return source.kv_heads() > 0;
  }
  return false;
}

}  // namespace

std::string_view describe(PolicyInput input) {
  switch (input) {
    case PolicyInput::kHeadRows:
      return "per-head decode rows (/attention/heads: capture with --granularity heads)";
    case PolicyInput::kPrefillWindow:
      return "prefill window attention (/prefill/window: capture with --window W)";
    case PolicyInput::kKeyNorms: return "key norms (/keys/norm: capture with --key-norms)";
  }
  return "unknown input";
}

std::vector<PolicyInput> Policy::inputs() const {
  return {};
}

void Policy::load_inputs(AttentionSource& /*source*/) {}

void Policy::start(const ReplayShape& /*shape*/, std::vector<LayerPlacement>& /*placement*/) {}

double Policy::own_kept_mass(const StepView& /*view*/, std::uint32_t /*layer*/) const {
  return -1.0;
}

ReplayDemand::ReplayDemand(std::uint32_t layers, std::uint64_t steps)
    : layers_(layers),
      steps_(steps),
      records_(static_cast<std::size_t>(layers) * steps),
      start_(layers) {}

void ReplayDemand::record_start(const std::vector<LayerPlacement>& placement) {
  if (placement.size() != layers_) {
    throw std::logic_error("ReplayDemand::record_start: one placement per layer expected");
  }
  for (std::uint32_t layer = 0; layer < layers_; ++layer) {
    start_[layer].mass = {};
    record_placement(placement[layer], start_[layer]);
  }
}

ReplaySummary ReplayDemand::summary() const {
  ReplaySummary summary;
  if (records_.empty()) {
    return summary;
  }
  double kept = 0.0;
  double hbm = 0.0;
  for (const StepLayerRecord& record : records_) {
    const double step_kept = record.kept_share();
    kept += step_kept;
    summary.min_kept_mass = std::min(summary.min_kept_mass, step_kept);
    double total = 0.0;
    for (const auto count : record.tokens) {
      total += count;
    }
    hbm += total > 0 ? record.tokens[0] / total : 0.0;
    summary.promoted += record.promoted;
    summary.demoted += record.demoted;
    summary.evicted += record.evicted;
    summary.newly_host += record.newly_host;
    summary.host_token_steps += record.tokens[1];
  }
  const auto count = static_cast<double>(records_.size());
  summary.mean_kept_mass = kept / count;
  summary.mean_hbm_fraction = hbm / count;
  double final_total = 0.0;
  double final_hbm = 0.0;
  double final_evicted = 0.0;
  for (std::uint32_t layer = 0; layer < layers_; ++layer) {
    const StepLayerRecord& last = at(steps_ - 1, layer);
    for (const auto tokens : last.tokens) {
      final_total += tokens;
    }
    final_hbm += last.tokens[0];
    final_evicted += last.tokens[3];
  }
  summary.final_hbm_fraction = final_total > 0 ? final_hbm / final_total : 0.0;
  summary.final_evicted_fraction = final_total > 0 ? final_evicted / final_total : 0.0;
  return summary;
}

ReplayStepper::ReplayStepper(Policy& policy, std::uint32_t layers)
    : policy_(policy), kept_(layers), total_(layers) {}

void ReplayStepper::step(std::uint64_t step, const std::vector<std::vector<float>>& rows,
                         const std::vector<std::vector<float>>& head_rows, std::uint32_t heads,
                         std::vector<LayerPlacement>& placement, std::span<StepLayerRecord> records,
                         bool append_token) {
  const auto layers = static_cast<std::uint32_t>(kept_.size());
  if (rows.size() != layers || placement.size() != layers || records.size() != layers) {
    throw std::logic_error(
        "ReplayStepper: rows, placement and records must have one entry per layer");
  }
  const StepView view{step, rows, kept_, total_, head_rows, heads};
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    if (append_token) {
      placement[layer].append();
    }
    StepLayerRecord& record = records[layer];
    const std::vector<float>& row = rows[layer];
    if (row.size() != placement[layer].size()) {
      throw std::logic_error("ReplayStepper: layer " + std::to_string(layer) + "'s row covers " +
                             std::to_string(row.size()) + " tokens, its placement " +
                             std::to_string(placement[layer].size()));
    }
    const std::array<double, kTierCount> tier_mass = mass_by_tier(row, placement[layer]);
    std::array<double, kTierCount> mass = tier_mass;
    const double bound = policy_.own_kept_mass(view, layer);
    if (bound >= 0.0) {
      // Not a plain placement: what it keeps is held in HBM, the rest counts as lost.
      const double all = mass[0] + mass[1] + mass[2] + mass[3];
      mass = {bound, 0.0, 0.0, all - bound};
    }
    record.mass = attention_shares(mass, placement[layer], bound >= 0.0);
    // The policy sees the row's own sums, not the recorded shares.
    kept_[layer] = mass[0] + mass[1] + mass[2];
    total_[layer] = tier_mass[0] + tier_mass[1] + tier_mass[2] + tier_mass[3];
  }
  policy_.observe(view, placement);
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    record_placement(placement[layer], records[layer]);
    placement[layer].reset_moves();
  }
}

void check_inputs(AttentionSource& source, const Policy& policy) {
  for (const PolicyInput input : policy.inputs()) {
    if (!source_has(source, input)) {
      throw DataError(source.name() + ": the policy reads " + std::string(describe(input)) +
                      ", which this trace does not hold");
    }
  }
}

ReplayDemand replay(AttentionSource& source, Policy& policy) {
  const ReplayShape shape{source.layers(), source.prompt_tokens(), source.steps()};
  check_inputs(source, policy);
  const std::vector<PolicyInput> inputs = policy.inputs();
  bool wants_heads = false;
  for (const PolicyInput input : inputs) {
    wants_heads = wants_heads || input == PolicyInput::kHeadRows;
  }
  if (!inputs.empty()) {
    policy.load_inputs(source);
  }
  ReplayDemand demand(shape.layers, shape.steps);
  demand.set_compressed_format(policy.compressed_format());
  demand.set_attends_compressed(policy.attends_compressed());
  std::vector<LayerPlacement> placement(shape.layers);
  for (auto& layer : placement) {
    for (std::uint64_t token = 0; token < shape.prompt_tokens; ++token) {
      layer.append();
    }
  }
  // Moves made at start (a window dropping old prompt tokens) are reported with step 0, as the
  // live cache's are; the start's placement and moves are also kept on their own.
  policy.start(shape, placement);
  demand.record_start(placement);
  ReplayStepper stepper(policy, shape.layers);
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<float>> head_rows;
  for (std::uint64_t step = 0; step < shape.steps; ++step) {
    source.read_step(step, rows);
    if (wants_heads) {
      source.read_head_step(step, head_rows);
    }
    stepper.step(step, rows, head_rows, wants_heads ? source.heads() : 0U, placement,
                 demand.step_records(step), true);
  }
  return demand;
}

}  // namespace kvtier::replay
