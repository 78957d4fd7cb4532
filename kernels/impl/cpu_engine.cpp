// The CPU reference forward pass: Llama-family decoder layers in float32 with Eigen. Every token
// of a call goes through each layer together, so a prompt's projections and MLP are matrix-matrix
// products; a decode step is the same code with one row (one dot product per output feature).
// The products and attention heads are spread over a WorkerPool in chunks fixed by the model's
// shape, so the thread count never changes a result.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/impl/dense.hpp"
#include "kernels/impl/worker_pool.hpp"
#include "kernels/rotary.hpp"

namespace kvtier::kernels {
namespace {

using Eigen::Map;
using Eigen::VectorXf;

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<const ModelWeights> weights, const CpuEngineOptions& options)
      : weights_(std::move(weights)),
        spec_(weights_->spec),
        hidden_(static_cast<int>(spec_.hidden_size())),
        heads_(static_cast<int>(spec_.num_attention_heads())),
        kv_heads_(static_cast<int>(spec_.num_key_value_heads())),
        head_dim_(static_cast<int>(spec_.head_dim())),
        group_(heads_ / kv_heads_),
        max_positions_(static_cast<int>(spec_.max_position_embeddings())),
        window_(spec_.has_sliding_window() ? static_cast<int>(spec_.sliding_window()) : 0),
        eps_(static_cast<float>(spec_.rms_norm_eps())),
        rotary_(spec_, weights_->rope_layout),
        cache_(static_cast<std::size_t>(spec_.num_hidden_layers()) * kv_heads_),
        pool_(options.threads) {
    check_engine_spec(spec_, weights_->source);
  }

  [[nodiscard]] const config::ModelSpec& spec() const override { return spec_; }
  [[nodiscard]] std::string_view backend() const override { return "cpu"; }
  [[nodiscard]] int position() const override { return position_; }

  std::span<const float> prefill(std::span<const std::int32_t> tokens) override {
    return run(tokens, true);
  }
  std::span<const float> decode(std::int32_t token) override { return run({&token, 1}, false); }

  void reset() override { position_ = 0; }
  void reserve(int positions) override { ensure_capacity(std::min(positions, max_positions_)); }
  void set_observer(ForwardObserver* observer) override { observer_ = observer; }
  void set_kv_store(KeyValueStore* store) override {
    kv_store_ = store;
    layer_kv_ = {};
  }

 private:
  // One layer's cache for one KV head: [capacity][head_dim] keys and values.
  struct HeadCache {
    std::vector<float> keys;
    std::vector<float> values;
  };

  std::span<const float> run(std::span<const std::int32_t> tokens, bool prefill);
  void ensure_capacity(int positions);
  void rms_norm_rows(const WeightTensor& weight);
  void head_rms_norm(float* vectors, int heads, const WeightTensor& weight) const;
  void attention_block(int layer, int rows, bool prefill);
  void attention_rows(int layer, int rows, bool prefill);
  void attend(int layer, int row, int position, int query_head, float* probabilities);
  void observe_attention(int layer, int row, int position, bool prefill,
                         std::span<const float> probabilities);
  [[nodiscard]] int first_key(int position) const {
    return window_ > 0 ? std::max(0, position - window_ + 1) : 0;
  }
  void mlp_block(int layer);

  std::shared_ptr<const ModelWeights> weights_;
  const config::ModelSpec& spec_;
  int hidden_;
  int heads_;
  int kv_heads_;
  int head_dim_;
  int group_;  // query heads per KV head
  int max_positions_;
  int window_;  // sliding window in tokens; 0 when attention is global
  float eps_;
  RotaryEmbedding rotary_;
  ForwardObserver* observer_ = nullptr;
  KeyValueStore* kv_store_ = nullptr;  // the live tiered cache, when attached
  LayerKeyValues layer_kv_;            // what kv_store_ gave for the current layer
  int position_ = 0;
  int capacity_ = 0;
  std::vector<HeadCache> cache_;  // [layer * kv_heads + kv_head]
  WorkerPool pool_;

  // Scratch, one row per token of the current call; reused across calls.
  RowMajorMatrix x_, normed_, q_, k_, v_, attention_out_, gate_, up_;
  std::vector<float> probabilities_;  // [row of a block][query head][key]
  VectorXf normed_last_;
  VectorXf logits_;
};

void CpuEngine::ensure_capacity(int positions) {
  if (positions <= capacity_) {
    return;
  }
  // Grow geometrically so a long decode reallocates O(log n) times.
  capacity_ = std::min(max_positions_, std::max(positions, 2 * capacity_));
  const auto floats = static_cast<std::size_t>(capacity_) * head_dim_;
  for (HeadCache& head : cache_) {
    head.keys.resize(floats);
    head.values.resize(floats);
  }
}

std::span<const float> CpuEngine::run(std::span<const std::int32_t> tokens, bool prefill) {
  check_forward_tokens(spec_, position_, tokens);
  const int rows = static_cast<int>(tokens.size());
  if (rows < 1) {  // check_forward_tokens refuses this already; stated again for the analyzer
    throw DataError("no tokens to run", spec_.name());
  }
  if (kv_store_ == nullptr) {
    ensure_capacity(position_ + rows);
  }
  const ConstMatrixMap embedding = weights_->token_embedding.matrix();
  x_.resize(rows, hidden_);
  for (int row = 0; row < rows; ++row) {
    x_.row(row) = embedding.row(tokens[static_cast<std::size_t>(row)]);
  }
  for (int layer = 0; layer < static_cast<int>(weights_->layers.size()); ++layer) {
    attention_block(layer, rows, prefill);
    mlp_block(layer);
  }
  position_ += rows;
  // Only the last token's logits are needed: normalise and project that row alone.
  const auto last = x_.row(rows - 1);
  const float inverse_rms =
      1.0F / std::sqrt(last.squaredNorm() / static_cast<float>(hidden_) + eps_);
  normed_last_ = (last.transpose() * inverse_rms).cwiseProduct(weights_->final_norm.vector());
  logits_.resize(weights_->lm_head.rows);
  matrix_vector(weights_->lm_head, normed_last_.data(), logits_.data(), pool_);
  return {logits_.data(), static_cast<std::size_t>(logits_.size())};
}

void CpuEngine::rms_norm_rows(const WeightTensor& weight) {
  normed_.resize(x_.rows(), x_.cols());
  const auto gain = weight.vector().transpose();
  for (Eigen::Index row = 0; row < x_.rows(); ++row) {
    const float inverse_rms =
        1.0F / std::sqrt(x_.row(row).squaredNorm() / static_cast<float>(hidden_) + eps_);
    normed_.row(row) = (x_.row(row) * inverse_rms).cwiseProduct(gain);
  }
}

void CpuEngine::head_rms_norm(float* vectors, int heads, const WeightTensor& weight) const {
  const ConstVectorMap gain = weight.vector();
  for (int head = 0; head < heads; ++head) {
    Map<VectorXf> vector(vectors + static_cast<std::ptrdiff_t>(head) * head_dim_, head_dim_);
    const float inverse_rms =
        1.0F / std::sqrt(vector.squaredNorm() / static_cast<float>(head_dim_) + eps_);
    vector = (vector * inverse_rms).cwiseProduct(gain);
  }
}

void CpuEngine::attention_block(int layer, int rows, bool prefill) {
  const LayerWeights& weights = weights_->layers[static_cast<std::size_t>(layer)];
  rms_norm_rows(weights.attention_norm);
  multiply_transposed(normed_, weights.wq, q_, Product::kAssign, pool_);
  multiply_transposed(normed_, weights.wk, k_, Product::kAssign, pool_);
  multiply_transposed(normed_, weights.wv, v_, Product::kAssign, pool_);
  if (weights.q_bias.present()) {
    q_.rowwise() += weights.q_bias.vector().transpose();
    k_.rowwise() += weights.k_bias.vector().transpose();
    v_.rowwise() += weights.v_bias.vector().transpose();
  }
  for (int row = 0; row < rows; ++row) {
    const int position = position_ + row;
    float* q_row = q_.row(row).data();
    float* k_row = k_.row(row).data();
    if (weights.q_norm.present()) {
      head_rms_norm(q_row, heads_, weights.q_norm);
      head_rms_norm(k_row, kv_heads_, weights.k_norm);
    }
    rotary_.apply({q_row, static_cast<std::size_t>(heads_) * head_dim_}, heads_, position);
    rotary_.apply({k_row, static_cast<std::size_t>(kv_heads_) * head_dim_}, kv_heads_, position);
    const float* v_row = v_.row(row).data();
    if (kv_store_ != nullptr) {
      const auto width = static_cast<std::size_t>(kv_heads_) * head_dim_;
      kv_store_->store({layer, position, kv_heads_, head_dim_, {k_row, width}, {v_row, width}});
    }
    for (int kv_head = 0; kv_store_ == nullptr && kv_head < kv_heads_; ++kv_head) {
      HeadCache& head = cache_[static_cast<std::size_t>(layer) * kv_heads_ + kv_head];
      const auto offset = static_cast<std::ptrdiff_t>(kv_head) * head_dim_;
      const auto slot = static_cast<std::ptrdiff_t>(position) * head_dim_;
      std::copy_n(k_row + offset, head_dim_, head.keys.begin() + slot);
      std::copy_n(v_row + offset, head_dim_, head.values.begin() + slot);
    }
    if (observer_ != nullptr) {
      const auto width = static_cast<std::size_t>(kv_heads_) * head_dim_;
      observer_->on_key_value(
          {layer, position, kv_heads_, head_dim_, {k_row, width}, {v_row, width}});
    }
  }
  if (kv_store_ != nullptr) {
    layer_kv_ = kv_store_->load(layer, position_ + rows);
  }
  attention_rows(layer, rows, prefill);
  multiply_transposed(attention_out_, weights.wo, x_, Product::kAccumulate, pool_);
}

// Rows go through attention in blocks; within a block every (row, query head) pair is a chunk of
// its own. A block's probabilities are kept until the observer has seen each of its rows, in
// order, so a block is as many rows as fit kProbabilityBudget floats (at least one).
void CpuEngine::attention_rows(int layer, int rows, bool prefill) {
  constexpr std::size_t kProbabilityBudget = std::size_t{1} << 22;
  constexpr int kMaxBlockRows = 64;
  // Sliding-window or not, the last row sees the most keys.
  const int last_position = position_ + rows - 1;
  const auto row_stride =
      static_cast<std::size_t>(heads_) * (last_position - first_key(last_position) + 1);
  const int block_rows = static_cast<int>(std::clamp<std::size_t>(
      kProbabilityBudget / row_stride, 1, static_cast<std::size_t>(std::min(rows, kMaxBlockRows))));
  probabilities_.resize(row_stride * static_cast<std::size_t>(block_rows));
  attention_out_.resize(rows, static_cast<Eigen::Index>(heads_) * head_dim_);
  for (int block = 0; block < rows; block += block_rows) {
    const int count = std::min(block_rows, rows - block);
    const std::int64_t work =
        std::int64_t{2} * count * static_cast<std::int64_t>(row_stride) * head_dim_;
    pool_.for_each_chunk(count * heads_, work, [&](int chunk) {
      const int row = block + chunk / heads_;
      const int query_head = chunk % heads_;
      const int position = position_ + row;
      const int keys = position - first_key(position) + 1;
      float* row_probabilities = probabilities_.data() + row_stride * (row - block);
      attend(layer, row, position, query_head,
             row_probabilities + static_cast<std::ptrdiff_t>(query_head) * keys);
    });
    for (int row = block; observer_ != nullptr && row < block + count; ++row) {
      const int position = position_ + row;
      const auto keys = static_cast<std::size_t>(position - first_key(position)) + 1;
      observe_attention(layer, row, position, prefill,
                        {probabilities_.data() + row_stride * (row - block), heads_ * keys});
    }
  }
}

// One query head of one row: softmax(q·Kᵀ/√d) into `probabilities` ([keys]), then V-weighted
// into the row's output for that head.
void CpuEngine::attend(int layer, int row, int position, int query_head, float* probabilities) {
  const int first = first_key(position);
  const int keys = position - first + 1;
  const int kv_head = query_head / group_;
  const float scale = 1.0F / std::sqrt(static_cast<float>(head_dim_));
  const auto start = static_cast<std::ptrdiff_t>(first) * head_dim_;
  const float* key_base = nullptr;
  const float* value_base = nullptr;
  if (kv_store_ == nullptr) {
    const HeadCache& head = cache_[static_cast<std::size_t>(layer) * kv_heads_ + kv_head];
    key_base = head.keys.data();
    value_base = head.values.data();
  } else {
    key_base = layer_kv_.keys[static_cast<std::size_t>(kv_head)];
    value_base = layer_kv_.values[static_cast<std::size_t>(kv_head)];
  }
  const ConstMatrixMap cached_keys(key_base + start, keys, head_dim_);
  const ConstMatrixMap cached_values(value_base + start, keys, head_dim_);
  const auto head_offset = static_cast<std::ptrdiff_t>(query_head) * head_dim_;
  const ConstVectorMap query(q_.row(row).data() + head_offset, head_dim_);
  Map<VectorXf> weights(probabilities, keys);
  weights.noalias() = cached_keys * query;
  weights *= scale;
  if (!layer_kv_.readable.empty() && kv_store_ != nullptr) {
    // Evicted tokens are left out of the softmax (their weight is exactly 0).
    const std::span<const std::uint8_t> readable =
        layer_kv_.readable.subspan(static_cast<std::size_t>(first));
    for (int key = 0; key < keys; ++key) {
      if (readable[static_cast<std::size_t>(key)] == 0) {
        weights[key] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  const float max_score = weights.maxCoeff();
  weights = (weights.array() - max_score).exp();
  weights /= weights.sum();
  Map<VectorXf> out(attention_out_.row(row).data() + head_offset, head_dim_);
  out.noalias() = cached_values.transpose() * weights;
}

void CpuEngine::observe_attention(int layer, int row, int position, bool prefill,
                                  std::span<const float> probabilities) {
  AttentionStep step;
  step.layer = layer;
  step.query_position = position;
  step.prefill = prefill;
  step.first_key_position = first_key(position);
  step.key_count = position - step.first_key_position + 1;
  step.query_heads = heads_;
  step.kv_heads = kv_heads_;
  step.head_dim = head_dim_;
  step.queries = {q_.row(row).data(), static_cast<std::size_t>(heads_) * head_dim_};
  step.probabilities = probabilities;
  observer_->on_attention(step);
}

void CpuEngine::mlp_block(int layer) {
  const LayerWeights& weights = weights_->layers[static_cast<std::size_t>(layer)];
  rms_norm_rows(weights.mlp_norm);
  multiply_transposed(normed_, weights.w_gate, gate_, Product::kAssign, pool_);
  multiply_transposed(normed_, weights.w_up, up_, Product::kAssign, pool_);
  // SwiGLU: silu(gate) * up.
  gate_.array() = gate_.array() / (1.0F + (-gate_.array()).exp()) * up_.array();
  multiply_transposed(gate_, weights.w_down, x_, Product::kAccumulate, pool_);
}

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ModelWeights> weights,
                                        const CpuEngineOptions& options) {
  return std::make_unique<CpuEngine>(std::move(weights), options);
}

}  // namespace kvtier::kernels
