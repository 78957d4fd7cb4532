#include "replay/impl/mlp.hpp"

#include <cmath>
#include <stdexcept>

#include "sim/random.hpp"

namespace kvtier::replay::detail {
namespace {

void glorot(Eigen::Ref<Eigen::MatrixXd> weights, Eigen::Index fan_in, Eigen::Index fan_out,
            sim::RandomStream& random) {
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  for (Eigen::Index c = 0; c < weights.cols(); ++c) {
    for (Eigen::Index r = 0; r < weights.rows(); ++r) {
      weights(r, c) = limit * (2.0 * random.uniform_01() - 1.0);
    }
  }
}

double sigmoid(double z) {
  return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
}

// Adam's state for one parameter block.
struct Moments {
  Eigen::ArrayXXd first;
  Eigen::ArrayXXd second;
};

template <typename Parameter>
void adam_step(Parameter& parameter, const Eigen::MatrixXd& gradient, Moments& moments,
               double learning_rate, int step) {
  constexpr double kBeta1 = 0.9;
  constexpr double kBeta2 = 0.999;
  constexpr double kEpsilon = 1e-8;
  if (moments.first.size() == 0) {
    moments.first = Eigen::ArrayXXd::Zero(gradient.rows(), gradient.cols());
    moments.second = Eigen::ArrayXXd::Zero(gradient.rows(), gradient.cols());
  }
  moments.first = kBeta1 * moments.first + (1 - kBeta1) * gradient.array();
  moments.second = kBeta2 * moments.second + (1 - kBeta2) * gradient.array().square();
  const double correct1 = 1 - std::pow(kBeta1, step);
  const double correct2 = 1 - std::pow(kBeta2, step);
  parameter.array() -=
      learning_rate * (moments.first / correct1) / ((moments.second / correct2).sqrt() + kEpsilon);
}

}  // namespace

MlpClassifier::MlpClassifier(Eigen::Index inputs, Eigen::Index hidden, std::uint64_t seed)
    : w1_(inputs, hidden), b1_(Eigen::RowVectorXd::Zero(hidden)), w2_(hidden) {
  if (inputs < 1 || hidden < 1) {
    throw std::invalid_argument("MlpClassifier needs at least one input and one hidden unit");
  }
  sim::RandomStream random(seed, 0x4D4C50);  // stream id "MLP"
  glorot(w1_, inputs, hidden, random);
  glorot(w2_, hidden, 1, random);
}

void MlpClassifier::train(const Eigen::MatrixXd& features, const Eigen::VectorXd& labels,
                          const MlpTraining& options) {
  const Eigen::Index samples = features.rows();
  if (samples == 0 || labels.size() != samples || features.cols() != w1_.rows()) {
    throw std::invalid_argument("MlpClassifier::train: features and labels do not match");
  }
  // Class-balanced sample weights, normalised so that they sum to 1.
  const double positives = labels.sum();
  const double negatives = static_cast<double>(samples) - positives;
  Eigen::VectorXd weight(samples);
  for (Eigen::Index i = 0; i < samples; ++i) {
    const bool positive = labels(i) > 0.5;
    const double count = positive ? positives : negatives;
    const double classes = (positives > 0 ? 1.0 : 0.0) + (negatives > 0 ? 1.0 : 0.0);
    weight(i) = 1.0 / (classes * count);
  }

  Moments m_w1;
  Moments m_b1;
  Moments m_w2;
  Moments m_b2;
  Eigen::MatrixXd b2(1, 1);
  b2(0, 0) = b2_;
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    const Eigen::MatrixXd hidden =
        ((features * w1_).rowwise() + b1_).array().tanh().matrix();  // samples × hidden
    Eigen::VectorXd output = hidden * w2_;
    // d(loss)/d(logit) for cross-entropy through a sigmoid is (p − y), times the sample weight.
    Eigen::VectorXd delta(samples);
    for (Eigen::Index i = 0; i < samples; ++i) {
      delta(i) = weight(i) * (sigmoid(output(i) + b2(0, 0)) - labels(i));
    }
    const Eigen::MatrixXd grad_w2 = hidden.transpose() * delta + options.l2 * w2_;
    Eigen::MatrixXd grad_b2(1, 1);
    grad_b2(0, 0) = delta.sum();
    const Eigen::MatrixXd back =
        (delta * w2_.transpose()).array() * (1.0 - hidden.array().square());
    const Eigen::MatrixXd grad_w1 = features.transpose() * back + options.l2 * w1_;
    const Eigen::MatrixXd grad_b1 = back.colwise().sum();
    adam_step(w1_, grad_w1, m_w1, options.learning_rate, epoch);
    adam_step(b1_, grad_b1, m_b1, options.learning_rate, epoch);
    adam_step(w2_, grad_w2, m_w2, options.learning_rate, epoch);
    adam_step(b2, grad_b2, m_b2, options.learning_rate, epoch);
  }
  b2_ = b2(0, 0);
}

Eigen::VectorXd MlpClassifier::predict(const Eigen::MatrixXd& features) const {
  const Eigen::MatrixXd hidden = ((features * w1_).rowwise() + b1_).array().tanh().matrix();
  Eigen::VectorXd output = hidden * w2_;
  for (Eigen::Index i = 0; i < output.size(); ++i) {
    output(i) = sigmoid(output(i) + b2_);
  }
  return output;
}

}  // namespace kvtier::replay::detail
