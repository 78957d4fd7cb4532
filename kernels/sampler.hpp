#pragma once
// Choosing the next token from logits: greedy (argmax, lowest id on ties) or temperature with
// nucleus (top-p) sampling from a seeded std::mt19937_64, so a seed fixes the whole run.

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "configs/schema/trace.pb.h"

namespace kvtier::kernels {

struct SamplingOptions {
  float temperature = 0.0F;  // 0: greedy
  float top_p = 1.0F;        // 1: the whole distribution
  std::uint64_t seed = 0;

  [[nodiscard]] static SamplingOptions greedy() { return {}; }
  [[nodiscard]] static SamplingOptions nucleus(float temperature, float top_p, std::uint64_t seed) {
    return {temperature, top_p, seed};
  }
};

class Sampler {
 public:
  // Throws ConfigError for a negative temperature or top_p outside (0, 1].
  explicit Sampler(const SamplingOptions& options);

  [[nodiscard]] std::int32_t sample(std::span<const float> logits);
  [[nodiscard]] const SamplingOptions& options() const { return options_; }

 private:
  // Uniform in [0, 1) from 24 random bits: the same on every platform, unlike
  // std::uniform_real_distribution whose algorithm the standard leaves open.
  float uniform();

  SamplingOptions options_;
  std::mt19937_64 random_;
  std::vector<float> probabilities_;
  std::vector<std::int32_t> order_;
};

// The options as trace files and live measurements record them (TraceSampling).
[[nodiscard]] config::TraceSampling sampling_record(const SamplingOptions& options);

// Index of the largest logit (the lowest index among equal maxima).
[[nodiscard]] std::int32_t argmax(std::span<const float> logits);

}  // namespace kvtier::kernels
