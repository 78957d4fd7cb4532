#pragma once
// Internal: the CPU engine's dense products against row-major weights [out, in], as Eigen
// products per block of output features. matrix_vector (the LM head) takes one dot product per
// row instead: clang's static analyzer reports uninitialised reads inside Eigen's GEMV
// (GeneralMatrixVector.h) for it that cannot happen.
//
// Work is cut into blocks of output features whose bounds depend on the weight's shape alone, so
// the same inputs give the same bits whatever the pool's thread count.

#include "kernels/impl/worker_pool.hpp"
#include "kernels/tensor.hpp"

namespace kvtier::kernels {

// `x` holds weight.cols values, `y` receives weight.rows.
void matrix_vector(const WeightTensor& weight, const float* x, float* y, WorkerPool& pool);

enum class Product { kAssign, kAccumulate };

// y = x · weightᵀ (kAssign; y is resized) or y += x · weightᵀ (kAccumulate; y has its shape).
void multiply_transposed(const RowMajorMatrix& x, const WeightTensor& weight, RowMajorMatrix& y,
                         Product product, WorkerPool& pool);

}  // namespace kvtier::kernels
