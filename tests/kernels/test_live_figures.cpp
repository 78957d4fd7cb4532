// The figures a live run reports beside its tokens: the KL divergence of next-token
// distributions (kernels/divergence.hpp) and step-latency percentiles (kernels/live.hpp).

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/divergence.hpp"
#include "kernels/live.hpp"

namespace {

namespace kk = kvtier::kernels;

}  // namespace

TEST_CASE("KL is zero between one distribution's logits, shifted or not", "[kernels][live]") {
  const std::vector<float> logits = {1.5F, -2.0F, 0.25F, 3.0F};
  const std::vector<float> shifted = {11.5F, 8.0F, 10.25F, 13.0F};
  CHECK(kk::kl_divergence(logits, logits) == 0.0);
  CHECK(kk::kl_divergence(logits, shifted) == Approx(0.0).margin(1e-12));
}

TEST_CASE("KL(p || q) is taken in nats with p first, and is not symmetric", "[kernels][live]") {
  // p = (1/4, 3/4), q = (1/2, 1/2).
  const std::vector<float> p = {0.0F, static_cast<float>(std::log(3.0))};
  const std::vector<float> q = {0.0F, 0.0F};
  const double p_given_q = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
  const double q_given_p = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  CHECK(kk::kl_divergence(p, q) == Approx(p_given_q).epsilon(1e-6));
  CHECK(kk::kl_divergence(q, p) == Approx(q_given_p).epsilon(1e-6));
  CHECK(p_given_q != Approx(q_given_p).epsilon(1e-3));
}

TEST_CASE("KL is infinite where q rules out a token p can choose", "[kernels][live]") {
  const float ruled_out = -std::numeric_limits<float>::infinity();
  const std::vector<float> p = {0.0F, 0.0F};
  const std::vector<float> q = {0.0F, ruled_out};
  CHECK(std::isinf(kk::kl_divergence(p, q)));
  // The other way round the impossible token carries no weight.
  CHECK(kk::kl_divergence(q, p) == Approx(std::log(2.0)).epsilon(1e-12));
}

TEST_CASE("step percentiles follow the nearest-rank rule", "[kernels][live]") {
  CHECK(kk::percentile({}, 0.5) == 0.0);
  CHECK(kk::percentile({0.020, 0.050, 0.015, 0.035}, 0.5) == 0.020);   // rank ceil(2) = 2
  CHECK(kk::percentile({0.020, 0.050, 0.015, 0.035}, 0.3) == 0.020);   // rank ceil(1.2) = 2
  CHECK(kk::percentile({0.020, 0.050, 0.015, 0.035}, 0.0) == 0.015);   // the minimum
  CHECK(kk::percentile({0.020, 0.050, 0.015, 0.035}, 1.0) == 0.050);   // the maximum
  CHECK(kk::percentile({0.020, 0.050, 0.015, 0.035}, 0.99) == 0.050);  // rank ceil(3.96) = 4
  std::vector<double> hundred;
  for (int i = 100; i >= 1; --i) {
    hundred.push_back(static_cast<double>(i));
  }
  // 0.07 · 100 computes 7.000000000000001: still rank 7.
  CHECK(kk::percentile(hundred, 0.07) == 7.0);
  CHECK(kk::percentile(hundred, 0.99) == 99.0);
}
