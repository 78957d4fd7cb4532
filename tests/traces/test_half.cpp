// float <-> IEEE half conversion: exact for every half, round to nearest even in between.

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "traces/half.hpp"
#include "traces/impl/half_convert.hpp"

namespace {

using kvtier::traces::float_to_half;
using kvtier::traces::half_to_float;

bool is_nan_half(std::uint16_t h) {
  return (h & 0x7C00U) == 0x7C00U && (h & 0x3FFU) != 0;
}

}  // namespace

TEST_CASE("every half value converts to float and back unchanged", "[traces][half]") {
  for (std::uint32_t bits = 0; bits <= 0xFFFFU; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = half_to_float(h);
    if (is_nan_half(h)) {
      REQUIRE(std::isnan(f));
      REQUIRE(is_nan_half(float_to_half(f)));
      continue;
    }
    REQUIRE(float_to_half(f) == h);
  }
}

TEST_CASE("half values decode to the IEEE binary16 numbers", "[traces][half]") {
  CHECK(half_to_float(0x3C00) == 1.0F);
  CHECK(half_to_float(0xC000) == -2.0F);
  CHECK(half_to_float(0x7BFF) == 65504.0F);
  CHECK(half_to_float(0x0400) == 0x1.0p-14F);  // smallest normal
  CHECK(half_to_float(0x0001) == 0x1.0p-24F);  // smallest subnormal
  CHECK(half_to_float(0x03FF) == 1023 * 0x1.0p-24F);
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(std::isinf(half_to_float(0x7C00)));
  CHECK(half_to_float(0x3555) == 0x1.554p-2F);  // 0.333251953125
}

TEST_CASE("float to half rounds to nearest, ties to even", "[traces][half]") {
  // Between 1 and the next half (1 + 2^-10): the midpoint goes to the even one (1).
  CHECK(float_to_half(1.0F + 0x1.0p-11F) == 0x3C00);
  CHECK(float_to_half(1.0F + 0x1.0p-11F + 0x1.0p-20F) == 0x3C01);
  // Midpoint between 1 + 2^-10 (odd) and 1 + 2^-9 (even) goes up.
  CHECK(float_to_half(1.0F + 3 * 0x1.0p-11F) == 0x3C02);
  CHECK(float_to_half(1.0F / 3.0F) == 0x3555);
  // Overflow: 65519 rounds down to 65504, 65520 (a tie, odd below) to infinity.
  CHECK(float_to_half(65519.0F) == 0x7BFF);
  CHECK(float_to_half(65520.0F) == 0x7C00);
  CHECK(float_to_half(-1e10F) == 0xFC00);
  // Subnormals: 2^-25 is the tie between 0 and 2^-24 and goes to 0 (even); just above, to 2^-24.
  CHECK(float_to_half(0x1.0p-25F) == 0x0000);
  CHECK(float_to_half(0x1.000002p-25F) == 0x0001);
  CHECK(float_to_half(3 * 0x1.0p-25F) == 0x0002);  // tie between 1 and 2 units: even (2)
  CHECK(float_to_half(5 * 0x1.0p-25F) == 0x0002);  // tie between 2 and 3 units: even (2)
  // The largest subnormal rounds up into the smallest normal.
  CHECK(float_to_half(0x1.0p-14F - 0x1.0p-26F) == 0x0400);
  CHECK(float_to_half(1e-30F) == 0x0000);
  CHECK(float_to_half(-1e-30F) == 0x8000);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(is_nan_half(float_to_half(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("float to half matches exhaustive nearest-even rounding on a dense sample",
          "[traces][half]") {
  // Compare with a reference: the nearest representable half by exhaustive search over
  // neighbours, ties to even, for floats stepping through the whole finite half range.
  for (std::uint32_t bits = 0x33000000U; bits < 0x477FF000U; bits += 0x1357U) {
    float f = 0.0F;
    std::memcpy(&f, &bits, sizeof(f));
    const std::uint16_t got = float_to_half(f);
    const double value = f;
    const double here = half_to_float(got);
    const double below = got > 0 ? half_to_float(static_cast<std::uint16_t>(got - 1)) : -1.0;
    const double above = half_to_float(static_cast<std::uint16_t>(got + 1));
    const double error = std::fabs(value - here);
    REQUIRE(error <= std::fabs(value - above));
    if (got > 0) {
      REQUIRE(error <= std::fabs(value - below));
    }
    if (error == std::fabs(value - above) || (got > 0 && error == std::fabs(value - below))) {
      REQUIRE((got & 1U) == 0);  // a tie went to the even neighbour
    }
  }
}

TEST_CASE("bulk conversions (F16C where the CPU has it) match the scalar ones", "[traces][half]") {
  std::vector<std::uint16_t> halves(1U << 16);
  for (std::uint32_t bits = 0; bits < halves.size(); ++bits) {
    halves[bits] = static_cast<std::uint16_t>(bits);
  }
  std::vector<float> floats(halves.size());
  kvtier::traces::halves_to_floats(halves.data(), floats.data(), halves.size());
  for (std::uint32_t bits = 0; bits < halves.size(); ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if (is_nan_half(h)) {
      REQUIRE(std::isnan(floats[bits]));
    } else {
      REQUIRE(std::bit_cast<std::uint32_t>(floats[bits]) ==
              std::bit_cast<std::uint32_t>(half_to_float(h)));
    }
  }
  std::vector<float> sample;
  for (std::uint32_t bits = 0; bits < 0xFFFFFFFFU - 0x10001U; bits += 0x10001U) {
    float f = 0.0F;
    std::memcpy(&f, &bits, sizeof(f));
    sample.push_back(f);
  }
  std::vector<std::uint16_t> converted(sample.size());
  kvtier::traces::floats_to_halves(sample.data(), converted.data(), sample.size());
  for (std::size_t i = 0; i < sample.size(); ++i) {
    if (std::isnan(sample[i])) {
      REQUIRE(is_nan_half(converted[i]));
    } else {
      REQUIRE(converted[i] == float_to_half(sample[i]));
    }
  }
}
