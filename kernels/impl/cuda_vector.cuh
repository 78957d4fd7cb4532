#pragma once
// 16-byte loads widened to float32, for kernels that stream rows of float32, FP16 or BF16
// (the warp-per-row GEMM, the split-key attention). Device code: included by .cu files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace kvtier::kernels::cuda {

// Elements of T in one 16-byte load, widened to float32.
template <typename T>
struct Vector;
template <>
struct Vector<float> {
  static constexpr int kSize = 4;
  __device__ static void widen(const uint4& bits, float* out) {
    out[0] = __uint_as_float(bits.x);
    out[1] = __uint_as_float(bits.y);
    out[2] = __uint_as_float(bits.z);
    out[3] = __uint_as_float(bits.w);
  }
};
template <>
struct Vector<__nv_bfloat16> {
  static constexpr int kSize = 8;
  __device__ static void widen(const uint4& bits, float* out) {
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
    for (int i = 0; i < 4; ++i) {
      // A bfloat16 is the high half of the float32 with the same bits.
      out[2 * i] = __uint_as_float(words[i] << 16U);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000U);
    }
  }
};
template <>
struct Vector<__half> {
  static constexpr int kSize = 8;
  __device__ static void widen(const uint4& bits, float* out) {
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
    for (int i = 0; i < 4; ++i) {
      // The element at the lower address is the word's low half.
      out[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i])));
      out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16U)));
    }
  }
};

}  // namespace kvtier::kernels::cuda
