#pragma once
// Internal: y = W x for a row-major weight [out, in], as one dot product per row. Eigen's GEMV
// kernel is avoided here because clang's static analyzer reports uninitialised reads inside it
// (GeneralMatrixVector.h) that cannot happen; the row-wise dot products are vectorised by Eigen
// as well and cost about the same for the output projection this is used for.

#include "kernels/tensor.hpp"

namespace kvtier::kernels {

// `x` holds weight.cols values, `y` receives weight.rows.
void matrix_vector(const WeightTensor& weight, const float* x, float* y);

}  // namespace kvtier::kernels
