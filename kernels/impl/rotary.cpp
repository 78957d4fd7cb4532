#include "kernels/rotary.hpp"

#include <cmath>
#include <numbers>

namespace kvtier::kernels {
namespace {

// Llama 3's frequency-dependent scaling (transformers' _compute_llama3_parameters): long
// wavelengths are divided by `factor`, short ones kept, the band between interpolated.
float llama3_scaled(float inverse_frequency, const config::RopeScaling& scaling) {
  const double factor = scaling.factor();
  const double original = scaling.original_max_position_embeddings();
  const double low_wavelength = original / scaling.low_freq_factor();
  const double high_wavelength = original / scaling.high_freq_factor();
  const double wavelength = 2.0 * std::numbers::pi / inverse_frequency;
  if (wavelength < high_wavelength) {
    return inverse_frequency;
  }
  if (wavelength > low_wavelength) {
    return static_cast<float>(inverse_frequency / factor);
  }
  const double smooth = (original / wavelength - scaling.low_freq_factor()) /
                        (scaling.high_freq_factor() - scaling.low_freq_factor());
  return static_cast<float>((1.0 - smooth) * inverse_frequency / factor +
                            smooth * inverse_frequency);
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const config::ModelSpec& spec, RopeLayout layout)
    : layout_(layout), head_dim_(static_cast<int>(spec.head_dim())) {
  const int pairs = head_dim_ / 2;
  const auto theta = static_cast<float>(spec.rope_theta());
  inverse_frequency_.resize(static_cast<std::size_t>(pairs));
  for (int pair = 0; pair < pairs; ++pair) {
    // Float arithmetic as in llama2.c's run.c and transformers, so angles agree to the bit.
    float frequency =
        1.0F / std::pow(theta, static_cast<float>(2 * pair) / static_cast<float>(head_dim_));
    if (spec.has_rope_scaling()) {
      const auto& scaling = spec.rope_scaling();
      frequency = scaling.rope_type() == "llama3"
                      ? llama3_scaled(frequency, scaling)
                      : static_cast<float>(frequency / scaling.factor());
    }
    inverse_frequency_[static_cast<std::size_t>(pair)] = frequency;
  }
  cos_.resize(inverse_frequency_.size());
  sin_.resize(inverse_frequency_.size());
}

void RotaryEmbedding::update_angles(int position) {
  if (position == cached_position_) {
    return;
  }
  for (std::size_t pair = 0; pair < inverse_frequency_.size(); ++pair) {
    const float angle = static_cast<float>(position) * inverse_frequency_[pair];
    cos_[pair] = std::cos(angle);
    sin_[pair] = std::sin(angle);
  }
  cached_position_ = position;
}

void RotaryEmbedding::apply(std::span<float> vectors, int heads, int position) {
  update_angles(position);
  const int pairs = head_dim_ / 2;
  for (int head = 0; head < heads; ++head) {
    float* vector = vectors.data() + static_cast<std::size_t>(head) * head_dim_;
    for (int pair = 0; pair < pairs; ++pair) {
      // Interleaved: (2i, 2i+1). Half-split: (i, i + head_dim/2).
      const int first = layout_ == RopeLayout::kInterleavedPairs ? 2 * pair : pair;
      const int second = layout_ == RopeLayout::kInterleavedPairs ? 2 * pair + 1 : pair + pairs;
      const float x0 = vector[first];
      const float x1 = vector[second];
      vector[first] = x0 * cos_[pair] - x1 * sin_[pair];
      vector[second] = x0 * sin_[pair] + x1 * cos_[pair];
    }
  }
}

}  // namespace kvtier::kernels
