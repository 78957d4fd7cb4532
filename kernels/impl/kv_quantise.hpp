#pragma once
// The T2 format's arithmetic, one definition for the CPU backend of the tiered cache and the
// CUDA kernels (docs/LIVE.md, "T2 format"): per token, per KV head, separately for K and V, a
// group of head_dim values gets scale = absmax / 127 and codes q = clamp(round_half_even(x /
// scale), -127, 127), read back as q * scale; an all-zero group has scale 0 and codes 0.
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

KVTIER_QUANTISE_FN std::int8_t code_of(float x, float scale) {
  if (!(scale > 0.0F)) {
    return 0;
  }
  // rintf rounds half to even in the default rounding mode, on the host and on the device.
  float code = rintf(x / scale);
  code = code < -127.0F ? -127.0F : (code > 127.0F ? 127.0F : code);
  return static_cast<std::int8_t>(code);
}

KVTIER_QUANTISE_FN float value_of(std::int8_t code, float scale) {
  return static_cast<float>(code) * scale;
}

// Bytes of one compressed token-layer: codes, then one float32 scale per group.
KVTIER_QUANTISE_FN std::uint64_t compressed_bytes(int kv_heads, int head_dim) {
  const auto groups = 2 * static_cast<std::uint64_t>(kv_heads);
  return groups * static_cast<std::uint64_t>(head_dim) + groups * sizeof(float);
}

// A whole token-layer on the host: `values` holds 2 * kv_heads groups of head_dim (K of every KV
// head, then V), `compressed` compressed_bytes(kv_heads, head_dim) bytes.
inline void quantise_token(const float* values, int kv_heads, int head_dim,
                           std::int8_t* compressed) {
  const int groups = 2 * kv_heads;
  std::int8_t* scales = compressed + static_cast<std::ptrdiff_t>(groups) * head_dim;
  for (int group = 0; group < groups; ++group) {
    const float* x = values + static_cast<std::ptrdiff_t>(group) * head_dim;
    float absmax = 0.0F;
    for (int i = 0; i < head_dim; ++i) {
      absmax = std::fmax(absmax, std::fabs(x[i]));
    }
    const float scale = scale_of(absmax);
    std::int8_t* codes = compressed + static_cast<std::ptrdiff_t>(group) * head_dim;
    for (int i = 0; i < head_dim; ++i) {
      codes[i] = code_of(x[i], scale);
    }
    std::memcpy(scales + static_cast<std::ptrdiff_t>(group) * sizeof(float), &scale, sizeof(float));
  }
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

}  // namespace kvtier::kernels::quantise
