#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "common/errors.hpp"
#include "kernels/tensor.hpp"

namespace kk = kvtier::kernels;

TEST_CASE("half and bfloat16 convert exactly to float32", "[kernels][tensor]") {
  CHECK(kk::half_to_float(0x3C00) == 1.0F);
  CHECK(kk::half_to_float(0xC000) == -2.0F);
  CHECK(kk::half_to_float(0x7BFF) == 65504.0F);
  CHECK(kk::half_to_float(0x0001) == std::ldexp(1.0F, -24));  // smallest subnormal
  CHECK(kk::half_to_float(0x0400) == std::ldexp(1.0F, -14));  // smallest normal
  CHECK(std::isinf(kk::half_to_float(0x7C00)));
  CHECK(std::isnan(kk::half_to_float(0x7E00)));
  CHECK(kk::bfloat16_to_float(0x3F80) == 1.0F);
  CHECK(kk::bfloat16_to_float(0xC040) == -3.0F);
  // Every half value survives a round trip through float32.
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = kk::half_to_float(half);
    if (!std::isnan(value)) {
      REQUIRE(kk::float_to_half(value) == half);
    }
    if (!std::isnan(kk::bfloat16_to_float(half))) {
      REQUIRE(kk::float_to_bfloat16(kk::bfloat16_to_float(half)) == half);
    }
  }
  // Round to nearest, ties to even.
  CHECK(kk::float_to_half(1.0F + std::ldexp(1.0F, -11)) == 0x3C00);
  CHECK(kk::float_to_half(1.0F + 3 * std::ldexp(1.0F, -11)) == 0x3C02);
  CHECK(kk::float_to_half(1e6F) == 0x7C00);
  CHECK(kk::float_to_bfloat16(1.0F + std::ldexp(1.0F, -8)) == 0x3F80);
}

TEST_CASE("to_float_weight checks shape and size and converts 16-bit data", "[kernels][tensor]") {
  kk::WeightStorage storage;
  const std::vector<std::uint16_t> halves = {0x3C00, 0x4000, 0xC000, 0x3800, 0x0000, 0x4200};
  kk::RawTensor raw{
      "w", kk::TensorDtype::kF16, {2, 3}, std::as_bytes(std::span<const std::uint16_t>(halves))};
  const kk::WeightTensor weight =
      kk::to_float_weight(raw, std::vector<std::int64_t>{2, 3}, storage, "file");
  CHECK(weight.rows == 2);
  CHECK(weight.cols == 3);
  CHECK(weight.matrix()(1, 2) == 3.0F);
  CHECK(storage.converted_bytes() == 6 * sizeof(float));
  CHECK_THROWS_WITH(kk::to_float_weight(raw, std::vector<std::int64_t>{3, 2}, storage, "file"),
                    "tensor 'w' has shape [2, 3]; the model's configuration implies [3, 2]");
  raw.bytes = raw.bytes.first(10);
  CHECK_THROWS_AS(kk::to_float_weight(raw, std::vector<std::int64_t>{2, 3}, storage, "file"),
                  kvtier::DataError);
  // float32 data that is aligned is used in place.
  const std::vector<float> floats = {1.0F, 2.0F};
  const kk::RawTensor direct{
      "v", kk::TensorDtype::kF32, {2}, std::as_bytes(std::span<const float>(floats))};
  CHECK(kk::to_float_weight(direct, std::vector<std::int64_t>{2}, storage, "file").data ==
        floats.data());
}
