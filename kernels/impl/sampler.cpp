#include "kernels/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), random_(options.seed) {
  if (!(options.temperature >= 0.0F) || !std::isfinite(options.temperature)) {
    throw ConfigError("sampling temperature must be 0 (greedy) or positive, not " +
                      std::to_string(options.temperature));
  }
  if (!(options.top_p > 0.0F && options.top_p <= 1.0F)) {
    throw ConfigError("sampling top_p must be in (0, 1], not " + std::to_string(options.top_p));
  }
}

float Sampler::uniform() {
  return static_cast<float>(random_() >> 40) * (1.0F / 16777216.0F);
}

std::int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.temperature == 0.0F) {
    return argmax(logits);
  }
  // Softmax of logits / temperature.
  probabilities_.assign(logits.begin(), logits.end());
  const float max_logit = *std::max_element(probabilities_.begin(), probabilities_.end());
  double total = 0.0;
  for (float& value : probabilities_) {
    value = std::exp((value - max_logit) / options_.temperature);
    total += value;
  }
  for (float& value : probabilities_) {
    value = static_cast<float>(value / total);
  }
  const float coin = uniform();
  order_.resize(probabilities_.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::size_t kept = order_.size();
  if (options_.top_p < 1.0F) {
    // Nucleus: the most probable tokens whose mass first exceeds top_p. Ties keep id order.
    std::stable_sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
      return probabilities_[static_cast<std::size_t>(a)] >
             probabilities_[static_cast<std::size_t>(b)];
    });
    double mass = 0.0;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      mass += probabilities_[static_cast<std::size_t>(order_[i])];
      if (mass > options_.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_mass = 0.0;
  for (std::size_t i = 0; i < kept; ++i) {
    kept_mass += probabilities_[static_cast<std::size_t>(order_[i])];
  }
  const double target = coin * kept_mass;
  double cumulative = 0.0;
  for (std::size_t i = 0; i < kept; ++i) {
    cumulative += probabilities_[static_cast<std::size_t>(order_[i])];
    if (target < cumulative) {
      return order_[i];
    }
  }
  return order_[kept - 1];  // rounding left the target at the very end
}

config::TraceSampling sampling_record(const SamplingOptions& options) {
  config::TraceSampling record;
  record.set_temperature(options.temperature);
  record.set_top_p(options.top_p);
  record.set_seed(options.seed);
  return record;
}

}  // namespace kvtier::kernels
