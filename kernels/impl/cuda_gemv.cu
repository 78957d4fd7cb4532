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
#include <type_traits>

#include "kernels/impl/cuda_elementwise.cuh"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/cuda_launch.cuh"
#include "kernels/impl/cuda_reduce.cuh"
#include "kernels/impl/cuda_vector.cuh"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // output features per block
constexpr int kLanes = 32;
// 16-byte loads a lane issues before it multiplies: enough bytes in flight per SM to cover the
// HBM's latency when the grid does not fill every SM with eight blocks.
constexpr int kUnroll = 4;

// 16 bytes of the input rows. Through the read-only cache, except in a kernel launched early:
// its predecessor writes the input while this kernel runs (before its wait), which the
// read-only cache's contract excludes, so it loads them through L1 (ld.global.ca). No line of
// the input is read before the wait, which makes the predecessor's writes visible.
__device__ __forceinline__ uint4 load_input(const uint4* at, bool early) {
  return early ? __ldca(at) : __ldg(at);
}

// acc[r] += w . x[r] over one 16-byte slice at element `at` of the row.
template <typename T, int kRows>
__device__ __forceinline__ void multiply(const uint4& weight_bits, const T* __restrict__ input,
                                         std::int64_t in_features, std::int64_t at, bool early,
                                         float* acc) {
  constexpr int kSize = Vector<T>::kSize;
  float weights[kSize];
  Vector<T>::widen(weight_bits, weights);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float values[kSize];
    Vector<T>::widen(
        load_input(reinterpret_cast<const uint4*>(input + r * in_features + at), early), values);
#pragma unroll
    for (int k = 0; k < kSize; ++k) {
      acc[r] = fmaf(weights[k], values[k], acc[r]);
    }
  }
}

// acc[r] = lane's part of row . input[r] for r < kRows, over a weight row of `in` elements:
// kRounds loads in flight per lane. The order of the additions is fixed by the lane and `in`
// alone, so every kernel that calls this gets the same sums for the same row.
template <typename T, int kRows, int kRounds>
__device__ __forceinline__ void row_products(const T* __restrict__ row, const T* __restrict__ input,
                                             std::int64_t in, int lane, bool early, float* acc) {
  constexpr int kSize = Vector<T>::kSize;
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
      multiply<T, kRows>(bits[u], input, in, at + u * kStride, early, acc);
    }
  }
  for (; at < in; at += kStride) {
    multiply<T, kRows>(__ldg(reinterpret_cast<const uint4*>(row + at)), input, in, at, early, acc);
  }
}

// A warp's weight row asked of L2 by its lane 0, before a kernel launched early waits for the
// previous one: weights are never written, so they are the one thing it may read before.
template <typename T>
__device__ __forceinline__ void prefetch_rows(const T* weight, std::int64_t in, int row, int lane) {
  if (lane == 0) {
    prefetch_to_l2(weight + static_cast<std::int64_t>(row) * in,
                   static_cast<unsigned>(in * static_cast<std::int64_t>(sizeof(T))));
  }
}

// out[r, o] (+)= sum_i input[r, i] * weight[o, i] for r < kRows, one warp per o; kBlockWarps
// warps a block and kRounds loads in flight per lane (other than kWarps and kUnroll only for
// the GEMV benchmark's variants). `early` (a launch made early): the warp's weight row is asked
// of L2 before the kernel waits for the previous one, and the input loaded coherently.
template <typename T, int kRows, int kRounds = kUnroll, int kBlockWarps = kWarps>
__global__ void __launch_bounds__(kBlockWarps* kLanes)
    warp_rows_gemm_kernel(const T* __restrict__ weight, const T* __restrict__ input,
                          int out_features, int in_features, float* __restrict__ out,
                          bool accumulate, bool early) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int feature =
      static_cast<int>(blockIdx.x) * kBlockWarps + static_cast<int>(threadIdx.x) / kLanes;
  const std::int64_t in = in_features;
  if (early && feature < out_features) {
    prefetch_rows(weight, in, feature, lane);
  }
  await_previous_kernel();
  release_next_kernel();
  if (feature >= out_features) {
    return;  // a whole warp: the shuffles below involve no lane of it
  }
  float acc[kRows];
  row_products<T, kRows, kRounds>(weight + static_cast<std::int64_t>(feature) * in, input, in, lane,
                                  early, acc);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0) {
      float* target = out + static_cast<std::int64_t>(r) * out_features + feature;
      *target = accumulate ? *target + sum : sum;
    }
  }
}

// out[r, c] = swiglu_of(gate, up) for r < kRows, one warp per c: gate = input[r] . weight[c] and
// up = input[r] . weight[intermediate + c], each summed as warp_rows_gemm_kernel sums it.
template <typename T, int kRows>
__global__ void __launch_bounds__(kWarps* kLanes)
    warp_rows_swiglu_kernel(const T* __restrict__ weight, const T* __restrict__ input,
                            int intermediate, int in_features, T* __restrict__ out, bool early) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int feature =
      static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kLanes;
  const std::int64_t in = in_features;
  if (early && feature < intermediate) {
    prefetch_rows(weight, in, feature, lane);
    prefetch_rows(weight, in, intermediate + feature, lane);
  }
  await_previous_kernel();
  release_next_kernel();
  if (feature >= intermediate) {
    return;
  }
  float gate[kRows];
  float up[kRows];
  row_products<T, kRows, kUnroll>(weight + static_cast<std::int64_t>(feature) * in, input, in, lane,
                                  early, gate);
  row_products<T, kRows, kUnroll>(weight + (static_cast<std::int64_t>(intermediate) + feature) * in,
                                  input, in, lane, early, up);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float gate_sum = warp_sum(gate[r]);
    const float up_sum = warp_sum(up[r]);
    if (lane == 0) {
      out[static_cast<std::int64_t>(r) * intermediate + feature] = swiglu_of<T>(gate_sum, up_sum);
    }
  }
}

template <typename T, int kRows, int kRounds = kUnroll, int kBlockWarps = kWarps>
cudaError_t launch_rows(const void* weight, int out_features, int in_features, const void* input,
                        float* out, bool accumulate, const Launch& launch) {
  const int blocks = (out_features + kBlockWarps - 1) / kBlockWarps;
  return start_kernel(warp_rows_gemm_kernel<T, kRows, kRounds, kBlockWarps>,
                      dim3(static_cast<unsigned>(blocks)), dim3(kBlockWarps * kLanes), 0, launch,
                      static_cast<const T*>(weight), static_cast<const T*>(input), out_features,
                      in_features, out, accumulate, launch.early);
}

// body(std::integral_constant<int, kRows>{}) for kRows = rows, counting up from kRows;
// cudaErrorInvalidValue past kWarpRowsMaxRows.
template <int kRows = 1, typename Body>
cudaError_t with_rows(int rows, Body&& body) {
  if constexpr (kRows > kWarpRowsMaxRows) {
    return cudaErrorInvalidValue;
  } else {
    if (rows == kRows) {
      return body(std::integral_constant<int, kRows>{});
    }
    return with_rows<kRows + 1>(rows, body);
  }
}

// body(T{}, rows constant) for the dtype's type and the row count; its status.
template <typename Body>
cudaError_t with_type_and_rows(Dtype dtype, int rows, Body&& body) {
  cudaError_t status = cudaErrorInvalidValue;
  with_type(dtype, [&](auto tag) {
    status = with_rows(rows, [&](auto row_count) { return body(tag, row_count); });
  });
  return status;
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
                                  bool accumulate, const Launch& launch) {
  if (!warp_rows_gemm_applies(dtype, in_features, rows, weight, input) || out_features <= 0) {
    return cudaErrorInvalidValue;
  }
  return with_type_and_rows(dtype, rows, [&](auto tag, auto row_count) {
    return launch_rows<decltype(tag), decltype(row_count)::value>(weight, out_features, in_features,
                                                                  input, out, accumulate, launch);
  });
}

cudaError_t launch_warp_rows_swiglu(const void* weight, Dtype dtype, int intermediate,
                                    int in_features, const void* input, int rows, void* out,
                                    const Launch& launch) {
  if (!warp_rows_gemm_applies(dtype, in_features, rows, weight, input) || intermediate <= 0) {
    return cudaErrorInvalidValue;
  }
  const int blocks = (intermediate + kWarps - 1) / kWarps;
  return with_type_and_rows(dtype, rows, [&](auto tag, auto row_count) {
    using T = decltype(tag);
    return start_kernel(warp_rows_swiglu_kernel<T, decltype(row_count)::value>,
                        dim3(static_cast<unsigned>(blocks)), dim3(kWarps * kLanes), 0, launch,
                        static_cast<const T*>(weight), static_cast<const T*>(input), intermediate,
                        in_features, static_cast<T*>(out), launch.early);
  });
}

}  // namespace kvtier::kernels::cuda
