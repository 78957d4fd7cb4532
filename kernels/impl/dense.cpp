#include "kernels/impl/dense.hpp"

namespace kvtier::kernels {

void matrix_vector(const WeightTensor& weight, const float* x, float* y) {
  const ConstMatrixMap matrix = weight.matrix();
  const ConstVectorMap input(x, weight.cols);
  for (Eigen::Index row = 0; row < weight.rows; ++row) {
    y[row] = matrix.row(row).dot(input.transpose());
  }
}

}  // namespace kvtier::kernels
