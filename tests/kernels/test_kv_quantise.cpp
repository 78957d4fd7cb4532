// The T2 format's arithmetic (kernels/impl/kv_quantise.hpp): the vectorised codes and absmax give
// what the format's plain definition (rintf, fmax) gives, byte for byte, on every kind of float
// — ties, the clamp's edges, the range where the rounding trick stops being exact, infinities,
// NaN, subnormals — and a token-layer reads back within half a step of its group.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/impl/kv_quantise.hpp"

namespace {

namespace q = kvtier::kernels::quantise;

float from_bits(std::uint32_t bits) {
  float x = 0.0F;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Ratios around every edge of code_of_ratio and of the plain definition.
std::vector<float> edge_ratios() {
  std::vector<float> ratios;
  const auto both_signs = [&](float x) {
    ratios.push_back(x);
    ratios.push_back(-x);
    ratios.push_back(std::nextafter(x, 0.0F));
    ratios.push_back(-std::nextafter(x, 0.0F));
    ratios.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
    ratios.push_back(-std::nextafter(x, std::numeric_limits<float>::infinity()));
  };
  for (int k = 0; k <= 300; ++k) {
    both_signs(static_cast<float>(k));
    both_signs(static_cast<float>(k) + 0.5F);  // ties: to even
  }
  for (const float x :
       {0.25F, 0.75F, 126.5F, 127.49F, 127.5F, 128.0F, 255.5F, 256.0F, 256.5F, 4194304.0F,
        4194304.5F, 8388608.0F, 12582912.0F, 16777216.0F, 1.0e30F,
        std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity()}) {
    both_signs(x);
  }
  ratios.push_back(std::numeric_limits<float>::quiet_NaN());
  ratios.push_back(-std::numeric_limits<float>::quiet_NaN());
  ratios.push_back(std::numeric_limits<float>::signaling_NaN());
  return ratios;
}

}  // namespace

TEST_CASE("kv_quantise: a ratio's code is the plain definition's, at every edge",
          "[live][quantise]") {
  for (const float ratio : edge_ratios()) {
    CAPTURE(ratio);
    CHECK(q::code_of_ratio(ratio) == q::plain::code_of(ratio, 1.0F));
  }
  // Ties go to even, and the clamp is symmetric.
  CHECK(q::code_of_ratio(2.5F) == 2);
  CHECK(q::code_of_ratio(3.5F) == 4);
  CHECK(q::code_of_ratio(-2.5F) == -2);
  CHECK(q::code_of_ratio(127.5F) == 127);
  CHECK(q::code_of_ratio(-127.5F) == -127);
  CHECK(q::code_of_ratio(-1.0e30F) == -127);
  CHECK(q::code_of_ratio(std::numeric_limits<float>::quiet_NaN()) == 0);
}

TEST_CASE("kv_quantise: every ratio in a sweep of float bit patterns codes as the plain definition",
          "[live][quantise]") {
  // Every 4099th bit pattern (a prime stride, through both signs, subnormals, infinities and
  // NaNs), then a million random patterns from a fixed seed. (All 2^32 agree: checked once,
  // 45 s in Release; too long for a test under the sanitizers.)
  std::size_t mismatches = 0;
  const auto check = [&](std::uint32_t bits) {
    const float ratio = from_bits(bits);
    if (q::code_of_ratio(ratio) != q::plain::code_of(ratio, 1.0F)) {
      if (++mismatches <= 5) {
        UNSCOPED_INFO("bits 0x" << std::hex << bits << " ratio " << ratio);
      }
    }
  };
  for (std::uint64_t bits = 0; bits <= 0xffffffffULL; bits += 4099) {
    check(static_cast<std::uint32_t>(bits));
  }
  std::mt19937 random(7);
  for (int i = 0; i < 1000000; ++i) {
    check(static_cast<std::uint32_t>(random()));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("kv_quantise: code_of divides by the scale, and no positive scale codes 0",
          "[live][quantise]") {
  CHECK(q::code_of(5.0F, 2.0F) == 2);  // 2.5, to even
  CHECK(q::code_of(7.0F, 2.0F) == 4);  // 3.5
  CHECK(q::code_of(5.0F, 0.0F) == 0);
  CHECK(q::code_of(5.0F, -1.0F) == 0);
  CHECK(q::code_of(5.0F, std::numeric_limits<float>::quiet_NaN()) == 0);
  for (const float x : edge_ratios()) {
    for (const float scale : {0.5F, 1.0F / 127.0F, 3.0e-40F, 1.0e30F}) {
      CAPTURE(x, scale);
      CHECK(q::code_of(x, scale) == q::plain::code_of(x, scale));
    }
  }
}

TEST_CASE("kv_quantise: token-layers quantise as the plain definition does, byte for byte",
          "[live][quantise]") {
  constexpr int kKvHeads = 4;
  for (const int head_dim : {1, 3, 8, 64, 128, 130}) {
    CAPTURE(head_dim);
    const int values = 2 * kKvHeads * head_dim;
    std::mt19937 random(static_cast<std::mt19937::result_type>(head_dim));
    std::normal_distribution<float> normal(0.0F, 2.0F);
    std::vector<float> token(static_cast<std::size_t>(values));
    for (float& x : token) {
      x = normal(random);
    }
    // Groups of every kind: all zero, NaN among numbers, an infinity, subnormals only, exact
    // ties (absmax 127 makes the scale 1), negative zero.
    const auto group = [&](int g) {
      return token.data() + static_cast<std::ptrdiff_t>(g) * head_dim;
    };
    std::fill(group(0), group(0) + head_dim, 0.0F);
    group(1)[0] = std::numeric_limits<float>::quiet_NaN();
    group(2)[head_dim - 1] = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < head_dim; ++i) {
      group(3)[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i % 7 - 3);
      group(4)[i] = i == 0 ? 127.0F : static_cast<float>(i % 9) - 4.5F;
    }
    group(5)[0] = -0.0F;

    const auto bytes = static_cast<std::size_t>(q::compressed_bytes(kKvHeads, head_dim));
    std::vector<std::int8_t> fast(bytes, 1);
    std::vector<std::int8_t> plain(bytes, 2);
    q::quantise_token(token.data(), kKvHeads, head_dim, fast.data());
    q::plain::quantise_token(token.data(), kKvHeads, head_dim, plain.data());
    CHECK(fast == plain);

    // Finite groups read back within half a step (scale / 2) of every value.
    std::vector<float> back(static_cast<std::size_t>(values));
    q::dequantise_token(fast.data(), kKvHeads, head_dim, back.data());
    for (const int g : {0, 4, 6, 7}) {
      const float* x = group(g);
      float scale = 0.0F;
      std::memcpy(&scale, fast.data() + 2 * kKvHeads * head_dim + g * 4, sizeof scale);
      for (int i = 0; i < head_dim; ++i) {
        CAPTURE(g, i, x[i], scale);
        CHECK(std::fabs(back[static_cast<std::size_t>(g * head_dim + i)] - x[i]) <=
              scale * 0.5F * (1.0F + 1.0e-6F));
      }
    }
  }
}
