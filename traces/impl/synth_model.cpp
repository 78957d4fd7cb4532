// The synthetic attention model: per-trace draws (heavy hitters, notes and bursts, local
// layers, head decays) in the constructor, then rows computed from them on demand.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/random.hpp"
#include "traces/synth.hpp"

namespace kvtier::traces {
namespace {

// One random stream per purpose (sim/random.hpp), so that changing how one is used never
// shifts the numbers of another.
enum Stream : std::uint64_t { kNotes = 1, kHeavy = 2, kLocal = 3, kHeads = 4 };

// Exponential recency weights over distances 0 .. band - 1, normalised to sum 1.
std::vector<double> exponential_band(double decay, std::uint64_t band) {
  std::vector<double> weights(band);
  const double ratio = std::exp(-1.0 / decay);
  double weight = 1.0;
  double total = 0.0;
  for (auto& w : weights) {
    w = weight;
    total += weight;
    weight *= ratio;
  }
  for (auto& w : weights) {
    w /= total;
  }
  return weights;
}

}  // namespace

std::vector<double> SyntheticAttentionModel::mean_band(std::uint32_t layer,
                                                       std::uint64_t band) const {
  std::vector<double> mean(band, 0.0);
  for (std::uint32_t h = 0; h < shape_.heads; ++h) {
    const std::vector<double> one = exponential_band(decay(layer, h), band);
    for (std::uint64_t d = 0; d < band; ++d) {
      mean[d] += one[d] / shape_.heads;
    }
  }
  return mean;
}

struct SyntheticAttentionModel::Row {
  std::uint64_t length = 0;
  std::uint64_t sinks = 0;
  double sink_each = 0;
  double band_mass = 0;
  std::span<const double> band;  // normalised profile over distances 0 .. band.size() - 1
  std::vector<double> band_storage;
  double heavy_scale = 0;  // multiplies a heavy hitter's Zipf weight
  double note_each = 0;    // per note token, per active burst
  std::vector<std::uint64_t> note_starts;
  double background_each = 0;
  RowMasses masses;
};

SyntheticAttentionModel::SyntheticAttentionModel(config::SyntheticAttention params,
                                                 const TraceShape& shape,
                                                 std::uint32_t model_layers)
    : params_(std::move(params)), shape_(shape) {
  const std::uint64_t seed = params_.seed();
  // Local layers: a seeded shuffle of all model layers; the first round(f · L) are local.
  std::vector<std::uint32_t> order(model_layers);
  std::iota(order.begin(), order.end(), 0U);
  sim::RandomStream local_stream(seed, kLocal);
  for (std::size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[local_stream.uniform_below(i)]);
  }
  local_.assign(model_layers, false);
  const auto local_count = static_cast<std::size_t>(
      std::llround(params_.local_layer_fraction() * static_cast<double>(model_layers)));
  for (std::size_t i = 0; i < local_count && i < order.size(); ++i) {
    local_[order[i]] = true;
  }
  // Per-head decay multipliers 2^(v · u), u uniform in [-1, 1).
  sim::RandomStream head_stream(seed, kHeads);
  head_scale_.resize(static_cast<std::size_t>(model_layers) * shape_.heads);
  for (auto& scale : head_scale_) {
    scale = std::exp2(params_.head_variation() * (2.0 * head_stream.uniform_01() - 1.0));
  }
  const std::uint64_t full_band =
      std::min<std::uint64_t>(params_.recency_band_tokens(), shape_.row_length(shape_.steps - 1));
  for (std::uint32_t layer = shape_.layers.first; layer < shape_.layers.end(); ++layer) {
    mean_band_.push_back(mean_band(layer, full_band));
  }
  // Heavy hitters: distinct prompt positions after the sinks, drawn in rank order.
  sim::RandomStream heavy_stream(seed, kHeavy);
  const std::uint64_t lowest = std::min<std::uint64_t>(params_.sink_tokens(), shape_.prompt_tokens);
  const std::uint64_t range = shape_.prompt_tokens - lowest;
  const std::uint64_t count = std::min<std::uint64_t>(params_.heavy_hitter_count(), range);
  std::vector<std::uint64_t> pool(range);
  std::iota(pool.begin(), pool.end(), lowest);
  for (std::uint64_t i = 0; i < count; ++i) {  // partial Fisher-Yates
    std::swap(pool[i], pool[i + heavy_stream.uniform_below(range - i)]);
    heavy_positions_.push_back(pool[i]);
    heavy_weights_.push_back(
        std::pow(static_cast<double>(i + 1), -params_.heavy_hitter_zipf_exponent()));
  }
  const double zipf_total = std::accumulate(heavy_weights_.begin(), heavy_weights_.end(), 0.0);
  std::vector<std::size_t> by_position(count);
  std::iota(by_position.begin(), by_position.end(), 0U);
  std::sort(by_position.begin(), by_position.end(), [&](std::size_t a, std::size_t b) {
    return heavy_positions_[a] < heavy_positions_[b];
  });
  for (const std::size_t i : by_position) {
    heavy_weights_[i] /= zipf_total;
    heavy_sorted_.push_back(heavy_positions_[i]);
    heavy_sorted_weights_.push_back(heavy_weights_[i]);
  }
  // Notes (geometric gaps with the given mean) and their re-read bursts (log-uniform delays).
  if (params_.reread_mass() > 0.0 && params_.rereads_per_note() > 0) {
    sim::RandomStream note_stream(seed, kNotes);
    const double log_min = std::log(params_.reread_delay_min_steps());
    const double log_max = std::log(params_.reread_delay_max_steps());
    std::uint64_t step = 0;
    while (true) {
      const double gap = -params_.note_interval_steps() * std::log1p(-note_stream.uniform_01());
      const std::uint64_t start = step + std::max<std::uint64_t>(1, std::llround(gap));
      if (start + params_.note_tokens() > shape_.steps) {
        break;
      }
      const auto note = static_cast<std::uint32_t>(notes_.size());
      notes_.push_back({static_cast<std::uint32_t>(start), shape_.prompt_tokens + start});
      for (std::uint32_t r = 0; r < params_.rereads_per_note(); ++r) {
        const double delay = std::exp(log_min + (log_max - log_min) * note_stream.uniform_01());
        const std::uint64_t first = start + params_.note_tokens() + std::llround(delay);
        if (first < shape_.steps) {
          bursts_.push_back({static_cast<std::uint32_t>(first), note});
        }
      }
      step = start + params_.note_tokens();
    }
    std::stable_sort(
        bursts_.begin(), bursts_.end(),
        [](const RereadBurst& a, const RereadBurst& b) { return a.first_step < b.first_step; });
  }
}

std::vector<std::uint32_t> SyntheticAttentionModel::active_notes(std::uint32_t step) const {
  // A burst is active at `step` when it started in (step - burst_steps, step].
  const std::uint64_t span = params_.reread_burst_steps();
  const auto begin = std::lower_bound(
      bursts_.begin(), bursts_.end(), step + 1 > span ? step + 1 - span : 0,
      [](const RereadBurst& burst, std::uint64_t first) { return burst.first_step < first; });
  std::vector<std::uint32_t> active;
  for (auto it = begin; it != bursts_.end() && it->first_step <= step; ++it) {
    active.push_back(it->note);
  }
  return active;
}

double SyntheticAttentionModel::decay(std::uint32_t layer, std::uint32_t head) const {
  return params_.recency_decay_tokens() * head_scale_[layer * shape_.heads + head];
}

SyntheticAttentionModel::Row SyntheticAttentionModel::row(std::uint32_t layer, std::uint64_t length,
                                                          std::int64_t step,
                                                          std::int32_t head) const {
  Row r;
  r.length = length;
  const bool local = local_[layer];
  const double long_range_scale = local ? params_.local_long_range_scale() : 1.0;
  // Sinks.
  r.sinks = std::min<std::uint64_t>(params_.sink_tokens(), length);
  r.masses.sink = r.sinks > 0 ? params_.sink_mass() : 0.0;
  r.sink_each = r.sinks > 0 ? r.masses.sink / static_cast<double>(r.sinks) : 0.0;
  // Heavy hitters inside the row (all of them in decode rows; prefill rows may be shorter).
  double present = 0.0;
  for (std::size_t i = 0; i < heavy_sorted_.size() && heavy_sorted_[i] < length; ++i) {
    present += heavy_sorted_weights_[i];
  }
  const double heavy_full = params_.heavy_hitter_mass();
  r.masses.heavy = present > 0.0 ? heavy_full * long_range_scale : 0.0;
  r.heavy_scale = present > 0.0 ? r.masses.heavy / present : 0.0;
  double recency = params_.recency_mass() + (present > 0.0 ? heavy_full - r.masses.heavy : 0.0);
  // Re-read bursts (decode rows only).
  if (step >= 0) {
    const std::vector<std::uint32_t> active = active_notes(static_cast<std::uint32_t>(step));
    if (!active.empty()) {
      // Re-reading shifts attention away from the newest tokens to the note.
      r.masses.reread = params_.reread_mass() * long_range_scale;
      recency -= r.masses.reread;
      r.note_each = r.masses.reread / static_cast<double>(active.size() * params_.note_tokens());
      for (const std::uint32_t note : active) {
        r.note_starts.push_back(notes_[note].first_position);
      }
    }
  }
  // Recency band: one head's exponential, or the mean over heads for a mean row.
  const std::uint64_t band = std::min<std::uint64_t>(params_.recency_band_tokens(), length);
  const std::vector<double>& cached = mean_band_[layer - shape_.layers.first];
  if (head < 0 && band == cached.size()) {
    r.band = cached;
  } else {
    r.band_storage = head >= 0
                         ? exponential_band(decay(layer, static_cast<std::uint32_t>(head)), band)
                         : mean_band(layer, band);
    r.band = r.band_storage;
  }
  r.band_mass = r.masses.recency = recency;
  r.masses.background =
      std::max(0.0, 1.0 - r.masses.sink - r.masses.recency - r.masses.heavy - r.masses.reread);
  r.background_each = r.masses.background / static_cast<double>(length);
  return r;
}

double SyntheticAttentionModel::weight_at(const Row& r, std::uint64_t position) const {
  double weight = r.background_each;
  if (position < r.sinks) {
    weight += r.sink_each;
  }
  const std::uint64_t distance = r.length - 1 - position;
  if (distance < r.band.size()) {
    weight += r.band_mass * r.band[distance];
  }
  const auto heavy = std::lower_bound(heavy_sorted_.begin(), heavy_sorted_.end(), position);
  if (heavy != heavy_sorted_.end() && *heavy == position) {
    weight += r.heavy_scale *
              heavy_sorted_weights_[static_cast<std::size_t>(heavy - heavy_sorted_.begin())];
  }
  for (const std::uint64_t start : r.note_starts) {
    if (position >= start && position < start + params_.note_tokens()) {
      weight += r.note_each;
    }
  }
  return weight;
}

void SyntheticAttentionModel::fill_dense(const Row& r, std::span<float> out) const {
  std::vector<double> row(r.length, r.background_each);
  for (std::uint64_t p = 0; p < r.sinks; ++p) {
    row[p] += r.sink_each;
  }
  for (std::uint64_t d = 0; d < r.band.size(); ++d) {
    row[r.length - 1 - d] += r.band_mass * r.band[d];
  }
  for (std::size_t i = 0; i < heavy_sorted_.size() && heavy_sorted_[i] < r.length; ++i) {
    row[heavy_sorted_[i]] += r.heavy_scale * heavy_sorted_weights_[i];
  }
  for (const std::uint64_t start : r.note_starts) {
    for (std::uint64_t p = start; p < start + params_.note_tokens(); ++p) {
      row[p] += r.note_each;
    }
  }
  std::transform(row.begin(), row.end(), out.begin(),
                 [](double w) { return static_cast<float>(w); });
}

RowMasses SyntheticAttentionModel::masses(std::uint32_t layer, std::uint32_t step) const {
  return row(layer, shape_.row_length(step), step, -1).masses;
}

void SyntheticAttentionModel::mean_row(std::uint32_t layer, std::uint32_t step,
                                       std::span<float> out) const {
  fill_dense(row(layer, shape_.row_length(step), step, -1), out);
}

void SyntheticAttentionModel::head_row(std::uint32_t layer, std::uint32_t step, std::uint32_t head,
                                       std::span<float> out) const {
  fill_dense(row(layer, shape_.row_length(step), step, static_cast<std::int32_t>(head)), out);
}

void SyntheticAttentionModel::prefill_row(std::uint32_t layer, std::uint32_t head,
                                          std::uint64_t position, std::span<float> out) const {
  fill_dense(row(layer, position + 1, -1, static_cast<std::int32_t>(head)), out);
}

void SyntheticAttentionModel::top_k_row(std::uint32_t layer, std::uint32_t step, std::uint32_t k,
                                        std::span<std::int32_t> indices, std::span<float> weights,
                                        float& residual) const {
  const Row r = row(layer, shape_.row_length(step), step, -1);
  // Every position that can be among the k largest: sinks, heavy hitters, re-read notes and the
  // k newest positions. Any other position holds background plus a band weight no larger than
  // that of the k newest, so these candidates contain a top k.
  std::vector<std::uint64_t> candidates;
  for (std::uint64_t p = 0; p < r.sinks; ++p) {
    candidates.push_back(p);
  }
  for (std::size_t i = 0; i < heavy_sorted_.size() && heavy_sorted_[i] < r.length; ++i) {
    candidates.push_back(heavy_sorted_[i]);
  }
  for (const std::uint64_t start : r.note_starts) {
    for (std::uint64_t p = start; p < start + params_.note_tokens(); ++p) {
      candidates.push_back(p);
    }
  }
  for (std::uint64_t d = 0; d < std::min<std::uint64_t>(k, r.length); ++d) {
    candidates.push_back(r.length - 1 - d);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::vector<std::pair<double, std::uint64_t>> scored;
  scored.reserve(candidates.size());
  for (const std::uint64_t p : candidates) {
    scored.emplace_back(weight_at(r, p), p);
  }
  const std::size_t kept = std::min<std::size_t>(k, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(kept),
                    scored.end(), [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  double total = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    indices[i] = i < kept ? static_cast<std::int32_t>(scored[i].second) : kTopKPadIndex;
    weights[i] = i < kept ? static_cast<float>(scored[i].first) : 0.0F;
    total += i < kept ? scored[i].first : 0.0;
  }
  residual = static_cast<float>(std::max(0.0, 1.0 - total));
}

}  // namespace kvtier::traces
