#pragma once
// The CUDA engine's linear layers through cuBLAS, shared with the GEMV benchmark
// (bench/cuda_gemv.cpp) so that it times the very call the engine makes. Host C++.
#include <cublas_v2.h>

#include "kernels/impl/cuda_kernels.cuh"

namespace kvtier::kernels::cuda {

inline cudaDataType cublas_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBF16: return CUDA_R_16BF;
    case Dtype::kF16: return CUDA_R_16F;
    case Dtype::kF32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

// Row-major output [rows, out_features] (+)= input [rows, in_features] x weight^T, the weight
// row-major [out_features, in_features] in `dtype`, float32 accumulation and output. Column-major
// cuBLAS sees the weight as [in, out] (lda = in), the input as [in, rows] and the output as
// [out, rows]: C = op_T(W) x X.
inline cublasStatus_t cublas_linear(cublasHandle_t handle, Dtype dtype, const void* weight,
                                    int out_features, int in_features, const void* input, int rows,
                                    float* output, bool accumulate) {
  const float alpha = 1.0F;
  const float beta = accumulate ? 1.0F : 0.0F;
  const cudaDataType type = cublas_type(dtype);
  return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_features, rows, in_features, &alpha,
                      weight, type, in_features, input, type, in_features, &beta, output,
                      CUDA_R_32F, out_features, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace kvtier::kernels::cuda
