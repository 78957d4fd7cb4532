#include "traces/stats.hpp"

#include <bit>
#include <cmath>
#include <string>

namespace kvtier::traces {
namespace {

constexpr std::size_t kProfile = 128;   // distances kept for the decay fit
constexpr std::size_t kFitMax = 32;     // distances fitted
constexpr std::size_t kFloorFrom = 96;  // distances whose mean is the floor

std::size_t reach_bin(std::uint64_t distance) {
  return std::min<std::size_t>(std::bit_width(distance), kReachBins - 1);
}

class LayerAccumulator {
 public:
  explicit LayerAccumulator(const StatsOptions& options) : options_(options) {}

  // One row of length n given as (position, weight) entries; `missing` mass sits on
  // `missing_positions` positions not listed (top-k residual), 0 for dense rows.
  template <typename Entries>
  void add_row(std::uint64_t n, const Entries& entries, double missing,
               std::uint64_t missing_positions) {
    const bool profile_row = n >= kProfile + options_.sink_tokens;
    double sink = 0, recent = 0, far = 0, entropy = 0;
    entries([&](std::uint64_t position, double weight) {
      const std::uint64_t distance = n - 1 - position;
      const bool is_sink = position < options_.sink_tokens;
      sink += is_sink ? weight : 0.0;
      recent += distance < options_.recent_window ? weight : 0.0;
      far += (!is_sink && distance >= options_.far_distance) ? weight : 0.0;
      entropy -= weight > 0.0 ? weight * std::log2(weight) : 0.0;
      if (!is_sink && weight >= options_.reach_threshold) {
        reach_[reach_bin(distance)] += weight;
      }
      if (profile_row && distance < kProfile) {
        profile_[distance] += weight;
      }
    });
    if (missing > 0.0 && missing_positions > 0) {
      entropy -= missing * std::log2(missing / static_cast<double>(missing_positions));
    }
    sink_ += sink;
    recent_ += recent;
    far_ += far;
    entropy_ += entropy;
    ++rows_;
    profile_rows_ += profile_row ? 1 : 0;
  }

  [[nodiscard]] LayerStats result(std::uint32_t layer) const {
    LayerStats stats;
    stats.layer = layer;
    stats.rows = rows_;
    if (rows_ == 0) {
      return stats;
    }
    const auto rows = static_cast<double>(rows_);
    stats.sink_mass = sink_ / rows;
    stats.recent_mass = recent_ / rows;
    stats.far_mass = far_ / rows;
    stats.entropy_bits = entropy_ / rows;
    double reach_total = 0.0;
    for (const double mass : reach_) {
      reach_total += mass;
    }
    for (std::size_t bin = 0; bin < kReachBins && reach_total > 0.0; ++bin) {
      stats.reach[bin] = reach_[bin] / reach_total;
    }
    stats.recency_decay_tokens = fit_decay();
    return stats;
  }

 private:
  // Least-squares line through log(profile - floor) over the distances where the excess is
  // still clearly above the floor; the decay length is minus the inverse slope.
  [[nodiscard]] double fit_decay() const {
    if (profile_rows_ == 0) {
      return 0.0;
    }
    double floor = 0.0;
    for (std::size_t d = kFloorFrom; d < kProfile; ++d) {
      floor += profile_[d];
    }
    floor /= static_cast<double>(kProfile - kFloorFrom);
    const double first = profile_[0] - floor;
    if (first <= 0.0) {
      return 0.0;
    }
    double sx = 0, sy = 0, sxx = 0, sxy = 0, count = 0;
    for (std::size_t d = 0; d < kFitMax; ++d) {
      const double excess = profile_[d] - floor;
      if (excess <= 0.01 * first) {
        break;
      }
      const double x = static_cast<double>(d);
      const double y = std::log(excess);
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
      count += 1;
    }
    const double denominator = count * sxx - sx * sx;
    if (count < 3 || denominator <= 0.0) {
      return 0.0;
    }
    const double slope = (count * sxy - sx * sy) / denominator;
    return slope < 0.0 ? -1.0 / slope : 0.0;
  }

  const StatsOptions& options_;
  double sink_ = 0, recent_ = 0, far_ = 0, entropy_ = 0;
  std::uint64_t rows_ = 0;
  std::uint64_t profile_rows_ = 0;
  std::array<double, kReachBins> reach_{};
  std::array<double, kProfile> profile_{};
};

std::vector<std::uint32_t> sample(std::uint32_t steps, std::uint32_t wanted) {
  std::vector<std::uint32_t> chosen;
  if (wanted == 0 || wanted >= steps) {
    for (std::uint32_t step = 0; step < steps; ++step) {
      chosen.push_back(step);
    }
    return chosen;
  }
  for (std::uint32_t i = 0; i < wanted; ++i) {
    chosen.push_back(static_cast<std::uint32_t>(static_cast<std::uint64_t>(i) * steps / wanted));
  }
  return chosen;
}

}  // namespace

std::string reach_bin_label(std::size_t bin) {
  if (bin == 0) {
    return "0";
  }
  const std::uint64_t low = std::uint64_t{1} << (bin - 1);
  if (bin + 1 == kReachBins) {
    return std::to_string(low) + "+";
  }
  const std::uint64_t high = (std::uint64_t{1} << bin) - 1;
  return low == high ? std::to_string(low) : std::to_string(low) + "-" + std::to_string(high);
}

TraceStats compute_stats(const TraceReader& reader, const StatsOptions& options) {
  const TraceShape& shape = reader.shape();
  TraceStats stats;
  stats.from_topk = !shape.has_mean;
  stats.steps = sample(shape.steps, options.sample_steps);
  DenseRows dense;
  TopKRows topk;
  for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
    LayerAccumulator accumulator(options);
    for (const std::uint32_t step : stats.steps) {
      const std::uint64_t n = shape.row_length(step);
      if (!stats.from_topk) {
        reader.read_mean(layer, {step, 1}, dense);
        const std::span<const float> row = dense.row(0);
        accumulator.add_row(
            n,
            [&](auto&& visit) {
              for (std::uint64_t p = 0; p < n; ++p) {
                visit(p, static_cast<double>(row[p]));
              }
            },
            0.0, 0);
        continue;
      }
      reader.read_topk(layer, {step, 1}, topk);
      accumulator.add_row(
          n,
          [&](auto&& visit) {
            for (std::uint32_t i = 0; i < topk.k; ++i) {
              if (topk.indices[i] != kTopKPadIndex) {
                visit(static_cast<std::uint64_t>(topk.indices[i]),
                      static_cast<double>(topk.weights[i]));
              }
            }
          },
          static_cast<double>(topk.residual[0]), n - std::min<std::uint64_t>(n, topk.k));
    }
    stats.layers.push_back(accumulator.result(layer));
  }
  return stats;
}

}  // namespace kvtier::traces
