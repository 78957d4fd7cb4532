#pragma once
// Rotary position embeddings (RoPE): the model's theta, Llama-3 or linear frequency scaling, and
// either pairing of a head's elements (see RopeLayout).

#include <span>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

class RotaryEmbedding {
 public:
  RotaryEmbedding(const config::ModelSpec& spec, RopeLayout layout);

  // Rotates `heads` consecutive vectors of head_dim elements for position `position`.
  void apply(std::span<float> vectors, int heads, int position);

  // The angular frequency of each rotary pair, after scaling (head_dim / 2 entries).
  [[nodiscard]] std::span<const float> inverse_frequencies() const { return inverse_frequency_; }

 private:
  void update_angles(int position);

  RopeLayout layout_;
  int head_dim_;
  std::vector<float> inverse_frequency_;
  int cached_position_ = -1;
  std::vector<float> cos_;
  std::vector<float> sin_;
};

}  // namespace kvtier::kernels
