#include "replay/impl/layer_profile.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvtier::replay::detail {
namespace {

struct Segment {
  std::size_t layer = 0;
  double from = 0.0;  // budget where the segment starts
  double length = 0.0;
  double slope = 0.0;  // recall per token
};

// The upper concave envelope of one layer's samples from the floor on, as segments whose slopes
// fall (monotone chain over the samples sorted by budget). Negative slopes (noise: more budget
// never loses recall under an eviction policy) are treated as flat.
std::vector<Segment> envelope(std::size_t layer, std::vector<RecallSample> samples, double floor) {
  std::sort(samples.begin(), samples.end(), [](const RecallSample& a, const RecallSample& b) {
    return a.budget != b.budget ? a.budget < b.budget : a.recall > b.recall;
  });
  std::vector<RecallSample> hull;
  for (const RecallSample& sample : samples) {
    if (sample.budget < floor || (!hull.empty() && sample.budget == hull.back().budget)) {
      continue;  // below the floor cannot be chosen; equal budgets: the best recall came first
    }
    while (hull.size() >= 2) {
      const RecallSample& a = hull[hull.size() - 2];
      const RecallSample& b = hull.back();
      // b lies on or below the chord from a to the new sample: not on the upper envelope.
      const double cross = (b.budget - a.budget) * (sample.recall - a.recall) -
                           (b.recall - a.recall) * (sample.budget - a.budget);
      if (cross < 0) {
        break;
      }
      hull.pop_back();
    }
    hull.push_back(sample);
  }
  std::vector<Segment> segments;
  for (std::size_t k = 1; k < hull.size(); ++k) {
    const double length = hull[k].budget - hull[k - 1].budget;
    const double slope = std::max(0.0, (hull[k].recall - hull[k - 1].recall) / length);
    segments.push_back({layer, hull[k - 1].budget, length, slope});
  }
  return segments;
}

}  // namespace

std::vector<std::uint64_t> profile_allocation(const std::vector<std::vector<RecallSample>>& samples,
                                              std::uint64_t mean_budget,
                                              const BudgetBounds& bounds) {
  const std::size_t layers = samples.size();
  const auto floor = static_cast<double>(bounds.floor);
  if (layers == 0 || mean_budget < bounds.floor || mean_budget > bounds.cap) {
    throw std::invalid_argument("profile_allocation: no layers or a mean outside the bounds");
  }
  std::vector<Segment> segments;
  for (std::size_t l = 0; l < layers; ++l) {
    auto own = envelope(l, samples[l], floor);
    segments.insert(segments.end(), own.begin(), own.end());
  }
  std::stable_sort(segments.begin(), segments.end(), [](const Segment& a, const Segment& b) {
    if (a.slope != b.slope) {
      return a.slope > b.slope;
    }
    return a.layer != b.layer ? a.layer < b.layer : a.from < b.from;
  });
  std::vector<double> budgets(layers, floor);
  double left = static_cast<double>(mean_budget - bounds.floor) * static_cast<double>(layers);
  for (const Segment& segment : segments) {
    if (left <= 0) {
      break;
    }
    // Segments of one layer have falling slopes, so they are taken in order and each starts
    // where the layer's budget stands.
    const double take = std::min(segment.length, left);
    budgets[segment.layer] += take;
    left -= take;
  }
  // Beyond the envelopes: the rest evenly, up to the cap (it fits: mean ≤ cap).
  while (left > 1e-9) {
    std::size_t open = 0;
    for (const double b : budgets) {
      open += b < static_cast<double>(bounds.cap) ? 1 : 0;
    }
    const double share = left / static_cast<double>(open);
    for (double& b : budgets) {
      const double take = std::min(share, static_cast<double>(bounds.cap) - b);
      if (take > 0) {
        b += take;
        left -= take;
      }
    }
  }
  // Budgets are whole tokens but for the one segment filled in part (and the even spread);
  // rescaling the rounded shape to the mean gives the exact total within the bounds.
  std::vector<std::uint64_t> rounded(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    rounded[l] = static_cast<std::uint64_t>(std::llround(budgets[l]));
  }
  return rescale_budgets(rounded, mean_budget, bounds);
}

}  // namespace kvtier::replay::detail
