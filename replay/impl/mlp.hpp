#pragma once
// A small binary classifier for the budget search's proposal screening: one hidden tanh layer
// and a sigmoid output, trained full-batch with Adam on class-balanced cross-entropy. Written
// out with Eigen rather than taken from a library so that it is seeded, single-threaded and
// gives the same weights on every run: the search's output must not change between runs.

#include <Eigen/Dense>

#include <cstdint>

namespace kvtier::replay::detail {

struct MlpTraining {
  int epochs = 300;
  double learning_rate = 0.02;
  double l2 = 1e-4;  // weight decay on the weights (not the biases)
};

class MlpClassifier {
 public:
  // Weights drawn uniformly in ±√(6 / (fan_in + fan_out)) (Glorot) from `seed`.
  MlpClassifier(Eigen::Index inputs, Eigen::Index hidden, std::uint64_t seed);

  // Rows of `features` are samples; labels are 0 or 1. Each class weighs half of the loss, so
  // a rare class is not ignored. Continues from the current weights.
  void train(const Eigen::MatrixXd& features, const Eigen::VectorXd& labels,
             const MlpTraining& options = {});
  // P(label 1) for every row.
  [[nodiscard]] Eigen::VectorXd predict(const Eigen::MatrixXd& features) const;

 private:
  Eigen::MatrixXd w1_;  // inputs × hidden
  Eigen::RowVectorXd b1_;
  Eigen::VectorXd w2_;  // hidden
  double b2_ = 0.0;
};

}  // namespace kvtier::replay::detail
