#include <catch2/catch.hpp>
#include <cmath>

#include "common/errors.hpp"
#include "kernels/sampler.hpp"

namespace kk = kvtier::kernels;

TEST_CASE("greedy sampling takes the largest logit, the lowest id on ties", "[kernels][sampler]") {
  kk::Sampler sampler(kk::SamplingOptions::greedy());
  const std::vector<float> logits = {0.5F, 2.0F, -1.0F, 2.0F};
  CHECK(sampler.sample(logits) == 1);
  CHECK(kk::argmax(logits) == 1);
}

TEST_CASE("seeded sampling is reproducible and follows the distribution", "[kernels][sampler]") {
  const std::vector<float> logits = {std::log(0.5F), std::log(0.3F), std::log(0.2F)};
  const auto draw = [&](std::uint64_t seed, int n) {
    kk::Sampler sampler(kk::SamplingOptions::nucleus(1.0F, 1.0F, seed));
    std::vector<std::int32_t> tokens;
    tokens.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      tokens.push_back(sampler.sample(logits));
    }
    return tokens;
  };
  CHECK(draw(42, 200) == draw(42, 200));
  CHECK(draw(42, 200) != draw(43, 200));
  const auto tokens = draw(1, 20000);
  std::array<int, 3> counts{};
  for (const std::int32_t token : tokens) {
    ++counts[static_cast<std::size_t>(token)];
  }
  CHECK(counts[0] / 20000.0 == Approx(0.5).margin(0.02));
  CHECK(counts[1] / 20000.0 == Approx(0.3).margin(0.02));
  CHECK(counts[2] / 20000.0 == Approx(0.2).margin(0.02));
}

TEST_CASE("top-p keeps only the nucleus", "[kernels][sampler]") {
  const std::vector<float> logits = {std::log(0.2F), std::log(0.5F), std::log(0.3F)};
  // 0.5 alone does not exceed 0.6; 0.5 + 0.3 does: tokens 1 and 2 only.
  kk::Sampler sampler(kk::SamplingOptions::nucleus(1.0F, 0.6F, 9));
  std::array<int, 3> counts{};
  for (int i = 0; i < 5000; ++i) {
    ++counts[static_cast<std::size_t>(sampler.sample(logits))];
  }
  CHECK(counts[0] == 0);
  CHECK(counts[1] / 5000.0 == Approx(0.625).margin(0.03));
  // A tiny top-p is greedy.
  kk::Sampler narrow(kk::SamplingOptions::nucleus(0.8F, 0.01F, 9));
  for (int i = 0; i < 100; ++i) {
    CHECK(narrow.sample(logits) == 1);
  }
}

TEST_CASE("invalid sampling settings are configuration errors", "[kernels][sampler][errors]") {
  CHECK_THROWS_AS(kk::Sampler(kk::SamplingOptions::nucleus(-1.0F, 0.9F, 1)), kvtier::ConfigError);
  CHECK_THROWS_AS(kk::Sampler(kk::SamplingOptions::nucleus(1.0F, 0.0F, 1)), kvtier::ConfigError);
  CHECK_THROWS_AS(kk::Sampler(kk::SamplingOptions::nucleus(1.0F, 1.5F, 1)), kvtier::ConfigError);
}
