#pragma once
// How far a tiered run's next-token distribution is from the full cache's (kernels/live.hpp).

#include <span>

namespace kvtier::kernels {

// KL(p || q) in nats between the softmax distributions of two logit vectors of one vocabulary,
// at temperature 1; the logits may be shifted by any constant. A token q gives no probability
// while p gives some makes it +inf.
[[nodiscard]] double kl_divergence(std::span<const float> p_logits,
                                   std::span<const float> q_logits);

}  // namespace kvtier::kernels
