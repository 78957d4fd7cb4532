#pragma once
// Warp and block reductions of float32, for the engine's kernels (one order of additions, so
// that kernels sharing them sum alike). Device code: included by .cu files only.
#include <cuda_runtime.h>

#include <cmath>

namespace kvtier::kernels::cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFU;

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

// Sum (or maximum) over the block; every thread gets the result. `scratch` holds 32 floats.
// blockDim.x must be a multiple of 32.
template <bool kMax>
__device__ float block_reduce(float value, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  value = kMax ? warp_max(value) : warp_sum(value);
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) {
    scratch[warp] = value;
  }
  __syncthreads();
  if (warp == 0) {
    const float identity = kMax ? -INFINITY : 0.0F;
    value = lane < warps ? scratch[lane] : identity;
    value = kMax ? warp_max(value) : warp_sum(value);
    if (lane == 0) {
      scratch[0] = value;
    }
  }
  __syncthreads();
  return scratch[0];
}

}  // namespace kvtier::kernels::cuda
