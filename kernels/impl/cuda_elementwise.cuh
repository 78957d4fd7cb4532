#pragma once
// The storage dtypes' C++ types (and launches dispatched on them), conversions between them and
// float32, and the SwiGLU activation: one definition for every kernel that must produce the same
// bits (the SwiGLU kernel and the gate/up GEMM that applies it as it writes). Device code:
// included by .cu files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/impl/cuda_kernels.cuh"

namespace kvtier::kernels::cuda {

// Runs body(T{}) for the C++ type of `dtype`.
template <typename Body>
void with_type(Dtype dtype, Body&& body) {
  switch (dtype) {
    case Dtype::kF32: body(float{}); break;
    case Dtype::kF16: body(__half{}); break;
    case Dtype::kBF16: body(__nv_bfloat16{}); break;
  }
}

__host__ __device__ __forceinline__ float to_float(float value) {
  return value;
}
__host__ __device__ __forceinline__ float to_float(__half value) {
  return __half2float(value);
}
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

template <typename T>
__host__ __device__ __forceinline__ T from_float(float value);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

// Runs launch(T{}) for the C++ type of `dtype`, then returns cudaGetLastError().
template <typename Launcher>
cudaError_t dispatch(Dtype dtype, Launcher&& launch) {
  with_type(dtype, launch);
  return cudaGetLastError();
}

// silu(gate) * up in `T`, as the MLP's input to its down projection.
template <typename T>
__device__ __forceinline__ T swiglu_of(float gate, float up) {
  return from_float<T>(gate / (1.0F + expf(-gate)) * up);
}

}  // namespace kvtier::kernels::cuda
