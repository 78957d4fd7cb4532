#pragma once
// A small attention source for policy tests: sinks, a recency band and a few heavy hitters per
// layer, with seeded noise; each row sums to 1.

#include <cmath>

#include "replay/attention.hpp"
#include "sim/random.hpp"

namespace kvtier::test {

inline replay::InMemoryAttention synthetic_attention(std::uint32_t layers, std::uint64_t prompt,
                                                     std::uint64_t steps, std::uint64_t seed) {
  sim::RandomStream random(seed);
  std::vector<std::vector<std::vector<float>>> rows(steps);
  for (std::uint64_t step = 0; step < steps; ++step) {
    rows[step].resize(layers);
    const std::uint64_t visible = prompt + step + 1;
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      std::vector<double> weights(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        const double distance = static_cast<double>(visible - 1 - token);
        double weight = 0.05 * random.uniform_01() + std::exp(-distance / (8.0 + 4.0 * layer));
        if (token < 2) {
          weight += 2.0;  // sinks
        }
        if (token % 17 == 5) {
          weight += 0.5;  // heavy hitters
        }
        weights[token] = weight;
      }
      double total = 0.0;
      for (const double w : weights) {
        total += w;
      }
      rows[step][layer].resize(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        rows[step][layer][token] = static_cast<float>(weights[token] / total);
      }
    }
  }
  return replay::InMemoryAttention(layers, prompt, std::move(rows));
}

}  // namespace kvtier::test
