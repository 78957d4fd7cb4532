// The CUDA backend's host conversions for recodes in host memory (cuda_kernels.cuh): BF16 written
// in integer operations rounds exactly as CUDA's own host __float2bfloat16_rn, on every kind of
// float; both directions keep every dtype's values. Host code: no GPU needed.

#include <catch2/catch.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/impl/cuda_kernels.cuh"

namespace {

namespace cuda = kvtier::kernels::cuda;

std::uint16_t cuda_bits(float value) {
  const __nv_bfloat16 converted = __float2bfloat16_rn(value);
  std::uint16_t bits = 0;
  std::memcpy(&bits, &converted, sizeof bits);
  return bits;
}

float from_bits(std::uint32_t bits) {
  float value = 0.0F;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

}  // namespace

TEST_CASE("cuda host conversions: BF16 rounds as CUDA's __float2bfloat16_rn, every kind of float",
          "[cuda][host]") {
  std::vector<float> values;
  // Every 257th bit pattern (both signs, subnormals, infinities, NaNs), ties and their
  // neighbours (low half 0x8000 with an even and an odd kept bit), the largest finite floats.
  for (std::uint64_t bits = 0; bits <= 0xffffffffULL; bits += 257) {
    values.push_back(from_bits(static_cast<std::uint32_t>(bits)));
  }
  for (const std::uint32_t high :
       {0x3f80U, 0x3f81U, 0xbf80U, 0xbf81U, 0x7f7fU, 0xff7fU, 0x0000U, 0x0001U}) {
    for (const std::uint32_t low : {0x7fffU, 0x8000U, 0x8001U, 0xffffU, 0x0000U}) {
      values.push_back(from_bits((high << 16U) | low));
    }
  }
  std::mt19937 random(11);
  for (int i = 0; i < 1000000; ++i) {
    values.push_back(from_bits(static_cast<std::uint32_t>(random())));
  }
  std::vector<std::uint16_t> converted(values.size());
  cuda::host_from_float(cuda::Dtype::kBF16, values.data(), converted.data(),
                        static_cast<std::int64_t>(values.size()));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (converted[i] != cuda_bits(values[i]) ||
        cuda::host_bfloat16_bits(values[i]) != converted[i]) {
      if (++mismatches <= 5) {
        UNSCOPED_INFO("value " << values[i] << " wrote 0x" << std::hex << converted[i]
                               << ", CUDA 0x" << cuda_bits(values[i]));
      }
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cuda host conversions: every BF16 and F16 value reads back and writes back unchanged",
          "[cuda][host]") {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    all[i] = static_cast<std::uint16_t>(i);
  }
  for (const cuda::Dtype dtype : {cuda::Dtype::kBF16, cuda::Dtype::kF16}) {
    std::vector<float> wide(all.size());
    cuda::host_to_float(dtype, all.data(), wide.data(), static_cast<std::int64_t>(all.size()));
    std::vector<std::uint16_t> back(all.size());
    cuda::host_from_float(dtype, wide.data(), back.data(), static_cast<std::int64_t>(all.size()));
    std::size_t changed = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const bool nan =
          dtype == cuda::Dtype::kBF16 ? (all[i] & 0x7fffU) > 0x7f80U : (all[i] & 0x7fffU) > 0x7c00U;
      if (!nan && back[i] != all[i]) {
        ++changed;
      }
      if (nan) {
        CHECK(wide[i] != wide[i]);  // NaN stays NaN
      }
    }
    CHECK(changed == 0);
  }
}
