// The warp-per-row GEMM of the CUDA engine's small calls (cuda_kernels.cuh,
// launch_warp_rows_gemm). At decode a GEMM is a matrix-vector product that streams the whole
// weight matrix once: its speed is the rate at which the weights leave HBM. Each warp owns one
// output feature and walks its weight row in 16-byte loads, several in flight, multiplying each
// by the same slice of every input row; the input rows are small (at most kWarpRowsMaxRows rows
// of `in` elements) and stay in L1/L2 for the block's eight warps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/cuda_vector.cuh"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // output features per block
constexpr int kLanes = 32;
// 16-byte loads a lane issues before it multiplies: enough bytes in flight per SM to cover the
// HBM's latency when the grid does not fill every SM with eight blocks.
constexpr int kUnroll = 4;

__device__ __forceinline__ float lanes_sum(float value) {
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xFFFFFFFFU, value, offset);
  }
  return value;
}

// acc[r] += w . x[r] over one 16-byte slice at element `at` of the row.
template <typename T, int kRows>
__device__ __forceinline__ void multiply(const uint4& weight_bits, const T* __restrict__ input,
                                         std::int64_t in_features, std::int64_t at, float* acc) {
  constexpr int kSize = Vector<T>::kSize;
  float weights[kSize];
  Vector<T>::widen(weight_bits, weights);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float values[kSize];
    Vector<T>::widen(__ldg(reinterpret_cast<const uint4*>(input + r * in_features + at)), values);
#pragma unroll
    for (int k = 0; k < kSize; ++k) {
      acc[r] = fmaf(weights[k], values[k], acc[r]);
    }
  }
}

// out[r, o] (+)= sum_i input[r, i] * weight[o, i] for r < kRows, one warp per o; kBlockWarps
// warps a block and kRounds loads in flight per lane (other than kWarps and kUnroll only for
// the GEMV benchmark's variants).
template <typename T, int kRows, int kRounds = kUnroll, int kBlockWarps = kWarps>
__global__ void __launch_bounds__(kBlockWarps* kLanes)
    warp_rows_gemm_kernel(const T* __restrict__ weight, const T* __restrict__ input,
                          int out_features, int in_features, float* __restrict__ out,
                          bool accumulate) {
  constexpr int kSize = Vector<T>::kSize;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int feature =
      static_cast<int>(blockIdx.x) * kBlockWarps + static_cast<int>(threadIdx.x) / kLanes;
  if (feature >= out_features) {
    return;  // a whole warp: the shuffles below involve no lane of it
  }
  const std::int64_t in = in_features;
  const T* row = weight + static_cast<std::int64_t>(feature) * in;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    acc[r] = 0.0F;
  }
  constexpr std::int64_t kStride = static_cast<std::int64_t>(kLanes) * kSize;
  std::int64_t at = static_cast<std::int64_t>(lane) * kSize;
  // Full rounds of kRounds loads per lane, the loads issued before any is used.
  for (; at + (kRounds - 1) * kStride < in; at += kRounds * kStride) {
    uint4 bits[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      bits[u] = __ldg(reinterpret_cast<const uint4*>(row + at + u * kStride));
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      multiply<T, kRows>(bits[u], input, in, at + u * kStride, acc);
    }
  }
  for (; at < in; at += kStride) {
    multiply<T, kRows>(__ldg(reinterpret_cast<const uint4*>(row + at)), input, in, at, acc);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = lanes_sum(acc[r]);
    if (lane == 0) {
      float* target = out + static_cast<std::int64_t>(r) * out_features + feature;
      *target = accumulate ? *target + sum : sum;
    }
  }
}

template <typename T, int kRows, int kRounds = kUnroll, int kBlockWarps = kWarps>
cudaError_t launch_rows(const void* weight, int out_features, int in_features, const void* input,
                        float* out, bool accumulate, cudaStream_t stream) {
  const int blocks = (out_features + kBlockWarps - 1) / kBlockWarps;
  warp_rows_gemm_kernel<T, kRows, kRounds, kBlockWarps>
      <<<blocks, kBlockWarps * kLanes, 0, stream>>>(static_cast<const T*>(weight),
                                                    static_cast<const T*>(input), out_features,
                                                    in_features, out, accumulate);
  return cudaGetLastError();
}

// The kernel instantiated for `rows`, found by counting up from kRows.
template <typename T, int kRows = 1>
cudaError_t launch_typed(const void* weight, int out_features, int in_features, const void* input,
                         int rows, float* out, bool accumulate, cudaStream_t stream) {
  if constexpr (kRows > kWarpRowsMaxRows) {
    return cudaErrorInvalidValue;
  } else {
    if (rows == kRows) {
      return launch_rows<T, kRows>(weight, out_features, in_features, input, out, accumulate,
                                   stream);
    }
    return launch_typed<T, kRows + 1>(weight, out_features, in_features, input, rows, out,
                                      accumulate, stream);
  }
}

}  // namespace

cudaError_t launch_warp_rows_gemm_variant(int rounds, int warps, const void* weight,
                                          int out_features, int in_features, const void* input,
                                          float* out, cudaStream_t stream) {
  if (!warp_rows_gemm_applies(Dtype::kBF16, in_features, 1, weight, input) || out_features <= 0) {
    return cudaErrorInvalidValue;
  }
  using BF16 = __nv_bfloat16;
  if (rounds == 2 && warps == 8) {
    return launch_rows<BF16, 1, 2, 8>(weight, out_features, in_features, input, out, false, stream);
  }
  if (rounds == 8 && warps == 8) {
    return launch_rows<BF16, 1, 8, 8>(weight, out_features, in_features, input, out, false, stream);
  }
  if (rounds == 4 && warps == 4) {
    return launch_rows<BF16, 1, 4, 4>(weight, out_features, in_features, input, out, false, stream);
  }
  if (rounds == 4 && warps == 16) {
    return launch_rows<BF16, 1, 4, 16>(weight, out_features, in_features, input, out, false,
                                       stream);
  }
  return cudaErrorInvalidValue;
}

bool warp_rows_gemm_applies(Dtype dtype, int in_features, int rows, const void* weight,
                            const void* input) {
  const int elements = dtype == Dtype::kF32 ? 4 : 8;  // per 16-byte load
  const auto aligned = [](const void* pointer) {
    return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0;
  };
  return rows >= 1 && rows <= kWarpRowsMaxRows && in_features > 0 && in_features % elements == 0 &&
         aligned(weight) && aligned(input);
}

cudaError_t launch_warp_rows_gemm(const void* weight, Dtype dtype, int out_features,
                                  int in_features, const void* input, int rows, float* out,
                                  bool accumulate, cudaStream_t stream) {
  if (!warp_rows_gemm_applies(dtype, in_features, rows, weight, input) || out_features <= 0) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case Dtype::kF32:
      return launch_typed<float>(weight, out_features, in_features, input, rows, out, accumulate,
                                 stream);
    case Dtype::kF16:
      return launch_typed<__half>(weight, out_features, in_features, input, rows, out, accumulate,
                                  stream);
    case Dtype::kBF16:
      return launch_typed<__nv_bfloat16>(weight, out_features, in_features, input, rows, out,
                                         accumulate, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtier::kernels::cuda
