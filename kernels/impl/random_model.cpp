// Seeded random weights in a model's shapes (kernels/random_model.hpp).
#include "kernels/random_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvtier::kernels {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27U)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31U);
}

// Element i of tensor `stream`: uniform in [−a, a] from 24 random bits, a = 0.02·√3.
std::vector<float> random_values(std::int64_t count, std::uint64_t seed, std::uint64_t stream) {
  std::vector<float> values(static_cast<std::size_t>(count));
  const float amplitude = 0.02F * std::sqrt(3.0F);
  const std::uint64_t key = splitmix64(seed ^ splitmix64(stream));
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1U, 64U);
  const std::int64_t per_thread = (count + threads - 1) / threads;
  const auto fill = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const auto bits = static_cast<float>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 40U);
      values[static_cast<std::size_t>(i)] = amplitude * (bits / 8388608.0F - 1.0F);
    }
  };
  if (count < (std::int64_t{1} << 20) || threads == 1) {
    fill(0, count);
    return values;
  }
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    const std::int64_t begin = static_cast<std::int64_t>(t) * per_thread;
    workers.emplace_back(fill, begin, std::min(count, begin + per_thread));
  }
  for (std::thread& worker : workers) {
    worker.join();
  }
  return values;
}

class Builder {
 public:
  Builder(ModelWeights& model, std::uint64_t seed) : model_(model), seed_(seed) {}

  WeightTensor random(const std::string& name, std::int64_t rows, std::int64_t cols) {
    return {name, model_.storage.adopt(random_values(rows * cols, seed_, stream_++)), rows, cols};
  }
  WeightTensor ones(const std::string& name, std::int64_t cols) {
    ++stream_;  // a tensor's values do not depend on which tensors are ones
    return {name, model_.storage.adopt(std::vector<float>(static_cast<std::size_t>(cols), 1.0F)), 1,
            cols};
  }

 private:
  ModelWeights& model_;
  std::uint64_t seed_;
  std::uint64_t stream_ = 0;
};

LayerWeights random_layer(Builder& make, const config::ModelSpec& spec, const ExpectedShapes& shape,
                          int index) {
  const std::string prefix = "layers." + std::to_string(index) + ".";
  LayerWeights layer;
  layer.attention_norm = make.ones(prefix + "attention_norm", shape.hidden);
  layer.wq = make.random(prefix + "wq", shape.q_out, shape.hidden);
  layer.wk = make.random(prefix + "wk", shape.kv_out, shape.hidden);
  layer.wv = make.random(prefix + "wv", shape.kv_out, shape.hidden);
  layer.wo = make.random(prefix + "wo", shape.hidden, shape.q_out);
  if (spec.attention_bias()) {
    layer.q_bias = make.random(prefix + "q_bias", 1, shape.q_out);
    layer.k_bias = make.random(prefix + "k_bias", 1, shape.kv_out);
    layer.v_bias = make.random(prefix + "v_bias", 1, shape.kv_out);
  }
  if (spec.qk_norm()) {
    layer.q_norm = make.ones(prefix + "q_norm", shape.head_dim);
    layer.k_norm = make.ones(prefix + "k_norm", shape.head_dim);
  }
  layer.mlp_norm = make.ones(prefix + "mlp_norm", shape.hidden);
  layer.w_gate = make.random(prefix + "w_gate", shape.intermediate, shape.hidden);
  layer.w_up = make.random(prefix + "w_up", shape.intermediate, shape.hidden);
  layer.w_down = make.random(prefix + "w_down", shape.hidden, shape.intermediate);
  return layer;
}

}  // namespace

ModelWeights random_model(const config::ModelSpec& spec, const RandomModelOptions& options) {
  const std::string source = "random:" + spec.name();
  check_engine_spec(spec, source);
  ModelWeights model;
  model.spec = spec;
  model.source = source;
  model.rope_layout = RopeLayout::kHalfSplit;
  const ExpectedShapes shape = expected_shapes(spec);
  Builder make(model, options.seed);
  model.token_embedding = make.random("embedding", shape.vocab, shape.hidden);
  model.lm_head = spec.tie_word_embeddings() ? model.token_embedding
                                             : make.random("lm_head", shape.vocab, shape.hidden);
  model.final_norm = make.ones("norm", shape.hidden);
  const auto layers = static_cast<int>(spec.num_hidden_layers());
  if (options.share_layer_weights) {
    model.layers.assign(static_cast<std::size_t>(layers), random_layer(make, spec, shape, 0));
  } else {
    for (int index = 0; index < layers; ++index) {
      model.layers.push_back(random_layer(make, spec, shape, index));
    }
  }
  return model;
}

}  // namespace kvtier::kernels
