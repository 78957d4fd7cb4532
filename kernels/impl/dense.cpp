#include "kernels/impl/dense.hpp"

#include <algorithm>

namespace kvtier::kernels {
namespace {

// Output features per chunk: a single row's chunk reads 64 weight rows (512 KB of a 2,048-wide
// matrix); a matrix product's chunk is wide enough for Eigen's GEMM to block well.
constexpr Eigen::Index kVectorBlock = 64;
constexpr Eigen::Index kMatrixBlock = 256;
int chunk_count(Eigen::Index features, Eigen::Index block) {
  return static_cast<int>((features + block - 1) / block);
}

void for_each_block(Eigen::Index features, Eigen::Index block, Eigen::Index work, WorkerPool& pool,
                    const std::function<void(Eigen::Index, Eigen::Index)>& run) {
  pool.for_each_chunk(chunk_count(features, block), work, [&](int chunk) {
    const Eigen::Index first = static_cast<Eigen::Index>(chunk) * block;
    run(first, std::min(block, features - first));
  });
}

}  // namespace

void matrix_vector(const WeightTensor& weight, const float* x, float* y, WorkerPool& pool) {
  const ConstMatrixMap matrix = weight.matrix();
  const ConstVectorMap input(x, weight.cols);
  for_each_block(weight.rows, kVectorBlock, weight.rows * weight.cols, pool,
                 [&](Eigen::Index first, Eigen::Index count) {
                   for (Eigen::Index row = first; row < first + count; ++row) {
                     y[row] = matrix.row(row).dot(input.transpose());
                   }
                 });
}

void multiply_transposed(const RowMajorMatrix& x, const WeightTensor& weight, RowMajorMatrix& y,
                         Product product, WorkerPool& pool) {
  const ConstMatrixMap matrix = weight.matrix();
  if (product == Product::kAssign) {
    y.resize(x.rows(), weight.rows);
  }
  const Eigen::Index work = x.rows() * weight.rows * weight.cols;
  // One row is a matrix-vector product per block; Eigen's GEMV streams several weight rows at
  // once, about a quarter faster than a dot product per row on one core.
  const Eigen::Index block_size = x.rows() == 1 ? kVectorBlock : kMatrixBlock;
  for_each_block(weight.rows, block_size, work, pool, [&](Eigen::Index first, Eigen::Index count) {
    auto block = y.middleCols(first, count);
    const auto weights = matrix.middleRows(first, count).transpose();
    if (product == Product::kAssign) {
      block.noalias() = x * weights;
    } else {
      block.noalias() += x * weights;
    }
  });
}

}  // namespace kvtier::kernels
