#include "replay/kernels.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <limits>

namespace kvtier::replay::kernels {
namespace {

using ConstArray = Eigen::Map<const Eigen::ArrayXf>;
using Array = Eigen::Map<Eigen::ArrayXf>;
constexpr std::size_t kBlock = 4096;

ConstArray view(std::span<const float> values, std::size_t start, std::size_t length) {
  return {values.data() + start, static_cast<Eigen::Index>(length)};
}

}  // namespace

double sum(std::span<const float> values) {
  double total = 0.0;
  for (std::size_t start = 0; start < values.size(); start += kBlock) {
    total += view(values, start, std::min(kBlock, values.size() - start)).sum();
  }
  return total;
}

double dot(std::span<const float> values, std::span<const float> weights) {
  double total = 0.0;
  for (std::size_t start = 0; start < values.size(); start += kBlock) {
    const std::size_t length = std::min(kBlock, values.size() - start);
    total += (view(values, start, length) * view(weights, start, length)).sum();
  }
  return total;
}

void accumulate(std::span<float> accumulator, std::span<const float> values,
                std::span<const float> weights, float factor) {
  const auto n = static_cast<Eigen::Index>(values.size());
  Array(accumulator.data(), n) +=
      ConstArray(values.data(), n) * ConstArray(weights.data(), n) * factor;
}

std::uint64_t masked_argmin(std::span<const float> scores, std::span<const float> mask,
                            std::uint64_t limit) {
  if (limit == 0) {
    return limit;
  }
  const auto n = static_cast<Eigen::Index>(limit);
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  const auto masked =
      (ConstArray(mask.data(), n) > 0.5F).select(ConstArray(scores.data(), n), kInfinity);
  const float lowest = masked.minCoeff();
  if (lowest == kInfinity) {
    return limit;
  }
  for (std::uint64_t i = 0; i < limit; ++i) {
    if (mask[i] > 0.5F && scores[i] == lowest) {
      return i;
    }
  }
  return limit;
}

}  // namespace kvtier::replay::kernels
