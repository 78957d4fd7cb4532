// KL divergence between next-token distributions (kernels/divergence.hpp).
#include "kernels/divergence.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kvtier::kernels {
namespace {

// In double: a vocabulary of 10^5 float probabilities sums with visible rounding error.
std::vector<double> log_softmax(std::span<const float> logits) {
  double top = -std::numeric_limits<double>::infinity();
  for (const float value : logits) {
    top = std::max(top, static_cast<double>(value));
  }
  double sum = 0.0;
  for (const float value : logits) {
    sum += std::exp(static_cast<double>(value) - top);
  }
  const double log_sum = top + std::log(sum);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<double>(logits[i]) - log_sum;
  }
  return out;
}

}  // namespace

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  if (p_logits.size() != q_logits.size()) {
    throw std::logic_error("kl_divergence: logit vectors of different vocabularies");
  }
  const std::vector<double> log_p = log_softmax(p_logits);
  const std::vector<double> log_q = log_softmax(q_logits);
  double kl = 0.0;
  for (std::size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p > 0.0) {
      kl += p * (log_p[i] - log_q[i]);
    }
  }
  // Rounding can leave identical-looking distributions a hair below zero.
  return std::max(kl, 0.0);
}

}  // namespace kvtier::kernels
