#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "kernels/rotary.hpp"

namespace kk = kvtier::kernels;

namespace {

kvtier::config::ModelSpec rope_spec(std::uint32_t head_dim, double theta) {
  kvtier::config::ModelSpec spec;
  spec.set_head_dim(head_dim);
  spec.set_rope_theta(theta);
  return spec;
}

}  // namespace

TEST_CASE("rotary frequencies follow theta, and Llama-3 scaling bends only long wavelengths",
          "[kernels][rotary]") {
  auto spec = rope_spec(128, 500000.0);
  const kk::RotaryEmbedding plain(spec, kk::RopeLayout::kHalfSplit);
  const auto base = plain.inverse_frequencies();
  REQUIRE(base.size() == 64);
  for (std::size_t pair = 0; pair < base.size(); ++pair) {
    CHECK(base[pair] ==
          Approx(std::pow(500000.0, -2.0 * static_cast<double>(pair) / 128.0)).epsilon(1e-6));
  }
  // Llama 3.1: factor 8, low 1, high 4, original context 8192.
  auto* scaling = spec.mutable_rope_scaling();
  scaling->set_rope_type("llama3");
  scaling->set_factor(8.0);
  scaling->set_low_freq_factor(1.0);
  scaling->set_high_freq_factor(4.0);
  scaling->set_original_max_position_embeddings(8192);
  const kk::RotaryEmbedding llama3(spec, kk::RopeLayout::kHalfSplit);
  const auto scaled = llama3.inverse_frequencies();
  int kept = 0;
  int divided = 0;
  int blended = 0;
  for (std::size_t pair = 0; pair < scaled.size(); ++pair) {
    const double wavelength = 2.0 * std::numbers::pi / base[pair];
    if (wavelength < 8192.0 / 4.0) {
      CHECK(scaled[pair] == base[pair]);
      ++kept;
    } else if (wavelength > 8192.0) {
      CHECK(scaled[pair] == Approx(base[pair] / 8.0).epsilon(1e-6));
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelength - 1.0) / 3.0;
      CHECK(scaled[pair] ==
            Approx((1.0 - smooth) * base[pair] / 8.0 + smooth * base[pair]).epsilon(1e-6));
      ++blended;
    }
  }
  CHECK(kept > 0);
  CHECK(divided > 0);
  CHECK(blended > 0);

  scaling->set_rope_type("linear");
  scaling->set_factor(4.0);
  const kk::RotaryEmbedding linear(spec, kk::RopeLayout::kHalfSplit);
  CHECK(linear.inverse_frequencies()[3] == Approx(base[3] / 4.0).epsilon(1e-6));
}

TEST_CASE("both pair layouts rotate the same pairs by the same angles", "[kernels][rotary]") {
  const auto spec = rope_spec(8, 10000.0);
  kk::RotaryEmbedding interleaved(spec, kk::RopeLayout::kInterleavedPairs);
  kk::RotaryEmbedding half_split(spec, kk::RopeLayout::kHalfSplit);
  // Two heads; the half-split vector holds the interleaved one's elements 2i at i, 2i+1 at i+4.
  std::vector<float> a = {0.1F, -0.2F, 0.3F, 0.4F, -0.5F, 0.6F, 0.7F, -0.8F,
                          1.0F, 2.0F,  3.0F, 4.0F, 5.0F,  6.0F, 7.0F, 8.0F};
  std::vector<float> b(a.size());
  for (std::size_t head = 0; head < 2; ++head) {
    for (std::size_t i = 0; i < 4; ++i) {
      b[head * 8 + i] = a[head * 8 + 2 * i];
      b[head * 8 + 4 + i] = a[head * 8 + 2 * i + 1];
    }
  }
  const auto norm = [](const std::vector<float>& v) {
    double total = 0.0;
    for (const float x : v) {
      total += static_cast<double>(x) * x;
    }
    return total;
  };
  const double before = norm(a);
  interleaved.apply(a, 2, 37);
  half_split.apply(b, 2, 37);
  for (std::size_t head = 0; head < 2; ++head) {
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(b[head * 8 + i] == a[head * 8 + 2 * i]);
      CHECK(b[head * 8 + 4 + i] == a[head * 8 + 2 * i + 1]);
    }
  }
  CHECK(norm(a) == Approx(before).epsilon(1e-6));  // a rotation keeps lengths
  // Position 0 is the identity.
  std::vector<float> c = {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F, 7.0F, 8.0F};
  const std::vector<float> original = c;
  interleaved.apply(c, 1, 0);
  CHECK(c == original);
}
