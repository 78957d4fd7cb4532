#pragma once
// The T2 format's arithmetic, one definition for the CPU backend of the tiered cache and the
// CUDA kernels (docs/LIVE.md, "T2 format"): per token, per KV head, separately for K and V, a
// group of head_dim values gets scale = absmax / 127 and codes q = clamp(round_half_even(x /
// scale), -127, 127), read back as q * scale; an all-zero group has scale 0 and codes 0, and a
// NaN value has code 0 (the group's absmax passes over it).
// A compressed token-layer is the codes of every group (K heads, then V heads, as in a
// full-precision slot), then the groups' float32 scales in the same order.

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KVTIER_QUANTISE_FN __host__ __device__ inline
#else
#define KVTIER_QUANTISE_FN inline
#endif

namespace kvtier::kernels::quantise {

KVTIER_QUANTISE_FN float scale_of(float absmax) {
  return absmax / 127.0F;
}

KVTIER_QUANTISE_FN std::uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t bits = 0;  // memcpy rather than std::bit_cast: nvcc compiles this as C++17
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

KVTIER_QUANTISE_FN float float_of(std::uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float x = 0.0F;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// The code of a ratio y = x / scale: clamp(round_half_even(y), -127, 127), NaN read as 0.
// For |y| <= 256, adding 1.5 * 2^23 rounds y to a whole number, ties to even, exactly as rintf
// does in the default rounding mode, and leaves it in the low bits; a larger |y| is first made
// ±256 (±127 either way) and NaN 0. Written so that compilers vectorise it on any x86-64:
// libm's rintf, float selects, or a select after the addition (which GCC turns into a branch
// it cannot undo while it assumes floating point may trap) kept GCC from it, and the plain
// form below quantises a token-layer about eight times slower (bench/kv_quantise.cpp).
KVTIER_QUANTISE_FN std::int8_t code_of_ratio(float y) {
  constexpr std::uint32_t kSign = 0x80000000U;
  constexpr std::uint32_t kInfinity = 0x7f800000U;
  constexpr std::uint32_t k256 = 0x43800000U;        // 256.0F
  constexpr float kShift = 12582912.0F;              // 1.5 * 2^23
  constexpr std::uint32_t kShiftBits = 0x4b400000U;  // its bits
  const std::uint32_t bits = bits_of(y);
  const std::uint32_t magnitude = bits & ~kSign;
  const std::uint32_t near = 0U - static_cast<std::uint32_t>(magnitude <= k256);
  const std::uint32_t number = 0U - static_cast<std::uint32_t>(magnitude <= kInfinity);
  const std::uint32_t bounded = (bits & near) | (((bits & kSign) | k256) & number & ~near);
  auto code = static_cast<std::int32_t>(bits_of(float_of(bounded) + kShift) - kShiftBits);
  code = code > 127 ? 127 : code;
  code = code < -127 ? -127 : code;
  return static_cast<std::int8_t>(code);
}

KVTIER_QUANTISE_FN std::int8_t code_of(float x, float scale) {
  return scale > 0.0F ? code_of_ratio(x / scale) : std::int8_t{0};
}

KVTIER_QUANTISE_FN float value_of(std::int8_t code, float scale) {
  return static_cast<float>(code) * scale;
}

// Bytes of one compressed token-layer: codes, then one float32 scale per group.
KVTIER_QUANTISE_FN std::uint64_t compressed_bytes(int kv_heads, int head_dim) {
  const auto groups = 2 * static_cast<std::uint64_t>(kv_heads);
  return groups * static_cast<std::uint64_t>(head_dim) + groups * sizeof(float);
}

// The largest |x[i]| of a group, passing over NaN as fmax does. On the magnitudes' bits, in
// integers: they order as the magnitudes do (+inf included), and compilers vectorise an integer
// maximum where a float one (NaN's rules) keeps them from it.
inline float absmax_of(const float* x, int count) {
  // Signed: SSE2 compares signed 32-bit integers only, and no magnitude reaches 2^31.
  constexpr std::int32_t kInfinity = 0x7f800000;
  std::int32_t largest = 0;
  for (int i = 0; i < count; ++i) {
    std::int32_t magnitude = static_cast<std::int32_t>(bits_of(x[i]) & 0x7fffffffU);
    magnitude = magnitude > kInfinity ? 0 : magnitude;  // NaN
    largest = magnitude > largest ? magnitude : largest;
  }
  return float_of(static_cast<std::uint32_t>(largest));
}

// The compressed layout of a token-layer: each group's scale from `absmax(x, head_dim)`, its codes
// written by `codes(x, head_dim, scale, out)`, then the scales after all the codes.
template <typename Absmax, typename Codes>
void quantise_groups(const float* values, int kv_heads, int head_dim, std::int8_t* compressed,
                     Absmax&& absmax, Codes&& codes) {
  const int groups = 2 * kv_heads;
  std::int8_t* scales = compressed + static_cast<std::ptrdiff_t>(groups) * head_dim;
  for (int group = 0; group < groups; ++group) {
    const float* x = values + static_cast<std::ptrdiff_t>(group) * head_dim;
    const float scale = scale_of(absmax(x, head_dim));
    codes(x, head_dim, scale, compressed + static_cast<std::ptrdiff_t>(group) * head_dim);
    std::memcpy(scales + static_cast<std::ptrdiff_t>(group) * sizeof(float), &scale, sizeof(float));
  }
}

// A whole token-layer on the host: `values` holds 2 * kv_heads groups of head_dim (K of every KV
// head, then V), `compressed` compressed_bytes(kv_heads, head_dim) bytes.
inline void quantise_token(const float* values, int kv_heads, int head_dim,
                           std::int8_t* compressed) {
  quantise_groups(values, kv_heads, head_dim, compressed, absmax_of,
                  [](const float* x, int count, float scale, std::int8_t* out) {
                    if (!(scale > 0.0F)) {
                      std::memset(out, 0, static_cast<std::size_t>(count));
                      return;
                    }
                    for (int i = 0; i < count; ++i) {
                      out[i] = code_of_ratio(x[i] / scale);
                    }
                  });
}

inline void dequantise_token(const std::int8_t* compressed, int kv_heads, int head_dim,
                             float* values) {
  const int groups = 2 * kv_heads;
  const std::int8_t* scales = compressed + static_cast<std::ptrdiff_t>(groups) * head_dim;
  for (int group = 0; group < groups; ++group) {
    float scale = 0.0F;
    std::memcpy(&scale, scales + static_cast<std::ptrdiff_t>(group) * sizeof(float), sizeof(float));
    const std::int8_t* codes = compressed + static_cast<std::ptrdiff_t>(group) * head_dim;
    float* x = values + static_cast<std::ptrdiff_t>(group) * head_dim;
    for (int i = 0; i < head_dim; ++i) {
      x[i] = value_of(codes[i], scale);
    }
  }
}

// The format written plainly, as its definition reads (rintf, fmax, one value at a time): what
// the tests and bench/kv_quantise.cpp hold the functions above to, byte for byte.
namespace plain {

inline std::int8_t code_of(float x, float scale) {
  if (!(scale > 0.0F)) {
    return 0;
  }
  const float ratio = x / scale;
  if (std::isnan(ratio)) {
    return 0;
  }
  return static_cast<std::int8_t>(std::fmin(std::fmax(std::rint(ratio), -127.0F), 127.0F));
}

inline void quantise_token(const float* values, int kv_heads, int head_dim,
                           std::int8_t* compressed) {
  quantise_groups(
      values, kv_heads, head_dim, compressed,
      [](const float* x, int count) {
        float absmax = 0.0F;
        for (int i = 0; i < count; ++i) {
          absmax = std::fmax(absmax, std::fabs(x[i]));
        }
        return absmax;
      },
      [](const float* x, int count, float scale, std::int8_t* out) {
        for (int i = 0; i < count; ++i) {
          out[i] = code_of(x[i], scale);
        }
      });
}

}  // namespace plain

}  // namespace kvtier::kernels::quantise
