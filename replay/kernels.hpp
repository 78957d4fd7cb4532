#pragma once
// The few loops replay runs over every attention entry, written once, vectorised with Eigen
// (its reductions are explicit SIMD with a fixed order, so results do not depend on compiler
// flags). Sums are taken in float over blocks of 4,096 entries and added up in double.

#include <cstdint>
#include <span>

namespace kvtier::replay::kernels {

// Σ values[i].
[[nodiscard]] double sum(std::span<const float> values);
// Σ values[i] · weights[i].
[[nodiscard]] double dot(std::span<const float> values, std::span<const float> weights);
// accumulator[i] += values[i] · weights[i] · factor.
void accumulate(std::span<float> accumulator, std::span<const float> values,
                std::span<const float> weights, float factor);
// The index of the smallest scores[i] among i < limit with mask[i] != 0; `limit` when none.
[[nodiscard]] std::uint64_t masked_argmin(std::span<const float> scores,
                                          std::span<const float> mask, std::uint64_t limit);

}  // namespace kvtier::replay::kernels
