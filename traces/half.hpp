#pragma once
// IEEE 754 binary16 ("half") <-> binary32 conversion for trace storage.
//
// Why our own: HDF5 1.10 has no native half type and C++20 has no std::float16_t, and the
// conversion is on the hot path of every trace read and write. float -> half rounds to nearest,
// ties to even, as IEEE requires (and as numpy/PyTorch do), so a trace written here matches one
// written by the capture tools bit for bit. Both directions are exact for every half value
// (tests/traces/test_half.cpp checks all 65,536).

#include <bit>
#include <cstdint>

namespace kvtier::traces {

[[nodiscard]] inline float half_to_float(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000U) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1FU;
  const std::uint32_t mantissa = half & 0x3FFU;
  if (exponent == 0x1FU) {  // infinity or NaN: keep the payload
    return std::bit_cast<float>(sign | 0x7F800000U | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias the exponent from 15 to 127
    return std::bit_cast<float>(sign | ((exponent + 112U) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, computed exactly in float (no float subnormals involved).
  const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24F;
  return sign != 0 ? -magnitude : magnitude;
}

[[nodiscard]] inline std::uint16_t float_to_half(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (magnitude >= 0x7F800000U) {  // infinity stays infinity; NaN stays a (quiet) NaN
    return static_cast<std::uint16_t>(
        sign | (magnitude > 0x7F800000U ? 0x7E00U | ((magnitude >> 13) & 0x3FFU) : 0x7C00U));
  }
  if (magnitude >= 0x477FF000U) {  // rounds to above 65504: overflow to infinity
    return static_cast<std::uint16_t>(sign | 0x7C00U);
  }
  if (magnitude < 0x38800000U) {    // below 2^-14: a half subnormal (or zero)
    if (magnitude < 0x33000000U) {  // at most half of the smallest subnormal 2^-24: to zero
      return sign;
    }
    // Shift the 24-bit significand (with its implicit one) into subnormal position, rounding
    // to nearest even on the bits shifted out.
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t significand = (magnitude & 0x7FFFFFU) | 0x800000U;
    const std::uint32_t shift = 126U - exponent;  // 14..24
    const std::uint32_t kept = significand >> shift;
    const std::uint32_t rest = significand & ((1U << shift) - 1U);
    const std::uint32_t halfway = 1U << (shift - 1U);
    const std::uint32_t rounded =
        kept + ((rest > halfway || (rest == halfway && (kept & 1U))) ? 1U : 0U);
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // Normal: rebias, then round the 13 dropped mantissa bits to nearest even. A carry out of the
  // mantissa correctly bumps the exponent.
  const std::uint32_t rebased = magnitude - (112U << 23);
  const std::uint32_t kept = rebased >> 13;
  const std::uint32_t rest = rebased & 0x1FFFU;
  const std::uint32_t rounded =
      kept + ((rest > 0x1000U || (rest == 0x1000U && (kept & 1U))) ? 1U : 0U);
  return static_cast<std::uint16_t>(sign | rounded);
}

}  // namespace kvtier::traces
