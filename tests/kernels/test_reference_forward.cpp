// The CPU engine against a forward pass written here from the architectures' definitions, in
// double precision, one position at a time over the whole sequence with no KV cache, no Eigen
// and none of the engine's helpers (its RoPE included). Random weights exercise every
// architecture's options (GQA, biases, q/k norms, sliding window, tied head, both RoPE layouts,
// llama3 and linear scaling); norm gains and biases are drawn too, since random models have
// ones and zeros there. A large rms_norm_eps makes the epsilon itself visible in the logits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/engine.hpp"
#include "kernels/random_model.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace {

namespace kk = kvtier::kernels;
namespace kc = kvtier::config;
using Vector = std::vector<double>;

// y = W·x for a [rows, cols] weight, plus an optional bias.
Vector project(const kk::WeightTensor& weight, const Vector& x, const kk::WeightTensor& bias = {}) {
  Vector y(static_cast<std::size_t>(weight.rows));
  for (std::int64_t row = 0; row < weight.rows; ++row) {
    double sum = bias.present() ? bias.data[row] : 0.0;
    for (std::int64_t col = 0; col < weight.cols; ++col) {
      sum += static_cast<double>(weight.data[row * weight.cols + col]) * x[col];
    }
    y[static_cast<std::size_t>(row)] = sum;
  }
  return y;
}

// RMSNorm of `size` elements from `first`, in place: x / sqrt(mean(x²) + eps) · gain.
void rms_norm(double* first, std::size_t size, const kk::WeightTensor& gain, double eps) {
  double mean_square = 0.0;
  for (std::size_t i = 0; i < size; ++i) {
    mean_square += first[i] * first[i];
  }
  mean_square /= static_cast<double>(size);
  const double inverse_rms = 1.0 / std::sqrt(mean_square + eps);
  for (std::size_t i = 0; i < size; ++i) {
    first[i] = first[i] * inverse_rms * gain.data[i];
  }
}

// The rotary frequency of pair i, from the definitions in transformers' rope utilities.
double inverse_frequency(const kc::ModelSpec& spec, int pair) {
  const double dim = static_cast<double>(spec.head_dim());
  const double base = 1.0 / std::pow(spec.rope_theta(), 2.0 * pair / dim);
  if (!spec.has_rope_scaling()) {
    return base;
  }
  const kc::RopeScaling& scaling = spec.rope_scaling();
  if (scaling.rope_type() != "llama3") {
    return base / scaling.factor();
  }
  const double wavelength = 2.0 * std::numbers::pi / base;
  const double original = scaling.original_max_position_embeddings();
  if (wavelength < original / scaling.high_freq_factor()) {
    return base;
  }
  if (wavelength > original / scaling.low_freq_factor()) {
    return base / scaling.factor();
  }
  const double smooth = (original / wavelength - scaling.low_freq_factor()) /
                        (scaling.high_freq_factor() - scaling.low_freq_factor());
  return (1.0 - smooth) * base / scaling.factor() + smooth * base;
}

void rotate(double* head, const kc::ModelSpec& spec, kk::RopeLayout layout, int position) {
  const int dim = static_cast<int>(spec.head_dim());
  for (int pair = 0; pair < dim / 2; ++pair) {
    const int a = layout == kk::RopeLayout::kInterleavedPairs ? 2 * pair : pair;
    const int b = layout == kk::RopeLayout::kInterleavedPairs ? 2 * pair + 1 : pair + dim / 2;
    const double angle = position * inverse_frequency(spec, pair);
    const double x = head[a];
    const double y = head[b];
    head[a] = x * std::cos(angle) - y * std::sin(angle);
    head[b] = x * std::sin(angle) + y * std::cos(angle);
  }
}

// The logits after every token of `tokens`: [position][vocab].
std::vector<Vector> reference_logits(const kk::ModelWeights& model,
                                     std::span<const std::int32_t> tokens) {
  const kc::ModelSpec& spec = model.spec;
  const auto hidden = static_cast<std::size_t>(spec.hidden_size());
  const int heads = static_cast<int>(spec.num_attention_heads());
  const int kv_heads = static_cast<int>(spec.num_key_value_heads());
  const auto dim = static_cast<std::size_t>(spec.head_dim());
  const double eps = spec.rms_norm_eps();
  const auto count = static_cast<int>(tokens.size());

  std::vector<Vector> x(tokens.size(), Vector(hidden));
  for (int t = 0; t < count; ++t) {
    for (std::size_t i = 0; i < hidden; ++i) {
      x[t][i] = model.token_embedding.data[tokens[t] * static_cast<std::int64_t>(hidden) + i];
    }
  }
  for (const kk::LayerWeights& layer : model.layers) {
    std::vector<Vector> q(tokens.size());
    std::vector<Vector> k(tokens.size());
    std::vector<Vector> v(tokens.size());
    for (int t = 0; t < count; ++t) {
      Vector normed = x[t];
      rms_norm(normed.data(), hidden, layer.attention_norm, eps);
      q[t] = project(layer.wq, normed, layer.q_bias);
      k[t] = project(layer.wk, normed, layer.k_bias);
      v[t] = project(layer.wv, normed, layer.v_bias);
      for (int h = 0; h < heads; ++h) {
        if (layer.q_norm.present()) {
          rms_norm(&q[t][h * dim], dim, layer.q_norm, eps);
        }
        rotate(&q[t][h * dim], spec, model.rope_layout, t);
      }
      for (int h = 0; h < kv_heads; ++h) {
        if (layer.k_norm.present()) {
          rms_norm(&k[t][h * dim], dim, layer.k_norm, eps);
        }
        rotate(&k[t][h * dim], spec, model.rope_layout, t);
      }
    }
    for (int t = 0; t < count; ++t) {
      const int first = spec.has_sliding_window()
                            ? std::max(0, t - static_cast<int>(spec.sliding_window()) + 1)
                            : 0;
      Vector attended(static_cast<std::size_t>(heads) * dim, 0.0);
      for (int h = 0; h < heads; ++h) {
        const int kv = h / (heads / kv_heads);  // consecutive query heads share a KV head
        Vector scores;
        for (int key = first; key <= t; ++key) {
          double dot = 0.0;
          for (std::size_t i = 0; i < dim; ++i) {
            dot += q[t][h * dim + i] * k[key][kv * dim + i];
          }
          scores.push_back(dot / std::sqrt(static_cast<double>(dim)));
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double total = 0.0;
        for (double& score : scores) {
          score = std::exp(score - top);
          total += score;
        }
        for (int key = first; key <= t; ++key) {
          for (std::size_t i = 0; i < dim; ++i) {
            attended[h * dim + i] += scores[key - first] / total * v[key][kv * dim + i];
          }
        }
      }
      const Vector out = project(layer.wo, attended);
      for (std::size_t i = 0; i < hidden; ++i) {
        x[t][i] += out[i];
      }
    }
    for (int t = 0; t < count; ++t) {
      Vector normed = x[t];
      rms_norm(normed.data(), hidden, layer.mlp_norm, eps);
      Vector gate = project(layer.w_gate, normed);
      const Vector up = project(layer.w_up, normed);
      for (std::size_t i = 0; i < gate.size(); ++i) {
        gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];  // SwiGLU
      }
      const Vector down = project(layer.w_down, gate);
      for (std::size_t i = 0; i < hidden; ++i) {
        x[t][i] += down[i];
      }
    }
  }
  std::vector<Vector> logits;
  for (int t = 0; t < count; ++t) {
    Vector normed = x[t];
    rms_norm(normed.data(), hidden, model.final_norm, eps);
    logits.push_back(project(model.lm_head, normed));
  }
  return logits;
}

// Replaces `tensor`'s values by draws uniform in [low, high), kept alive by the model.
void redraw(kk::ModelWeights& model, kk::WeightTensor& tensor, std::mt19937_64& random, double low,
            double high) {
  if (!tensor.present()) {
    return;
  }
  std::uniform_real_distribution<double> draw(low, high);
  std::vector<float> values(static_cast<std::size_t>(tensor.rows * tensor.cols));
  for (float& value : values) {
    value = static_cast<float>(draw(random));
  }
  tensor.data = model.storage.adopt(std::move(values));
}

// A random model of `spec` with drawn norm gains and biases, and larger weights than
// random_model's (so that attention is far from uniform and every term moves the logits).
kk::ModelWeights varied_model(const kc::ModelSpec& spec, kk::RopeLayout layout) {
  kk::ModelWeights model = kk::random_model(spec, {.seed = 11, .share_layer_weights = false});
  model.rope_layout = layout;
  std::mt19937_64 random(29);
  redraw(model, model.token_embedding, random, -1.0, 1.0);
  for (kk::LayerWeights& layer : model.layers) {
    for (kk::WeightTensor* gain :
         {&layer.attention_norm, &layer.mlp_norm, &layer.q_norm, &layer.k_norm}) {
      redraw(model, *gain, random, 0.5, 1.5);
    }
    for (kk::WeightTensor* bias : {&layer.q_bias, &layer.k_bias, &layer.v_bias}) {
      redraw(model, *bias, random, -0.5, 0.5);
    }
    for (kk::WeightTensor* weight : {&layer.wq, &layer.wk}) {
      redraw(model, *weight, random, -0.5, 0.5);
    }
  }
  redraw(model, model.final_norm, random, 0.5, 1.5);
  if (!spec.tie_word_embeddings()) {
    redraw(model, model.lm_head, random, -1.0, 1.0);
  } else {
    model.lm_head = model.token_embedding;
  }
  return model;
}

// Runs `tokens` through a fresh engine as a prefill of `prompt` tokens and then decode steps, and
// returns the largest difference from the reference over every call's logits, relative to the
// largest reference logit of that call.
double largest_relative_gap(const std::shared_ptr<const kk::ModelWeights>& model,
                            std::span<const std::int32_t> tokens, std::size_t prompt) {
  const std::vector<Vector> expected = reference_logits(*model, tokens);
  const auto engine = kk::make_cpu_engine(model);
  double gap = 0.0;
  const auto compare = [&](std::span<const float> logits, std::size_t position) {
    REQUIRE(logits.size() == expected[position].size());
    double scale = 0.0;
    for (const double value : expected[position]) {
      scale = std::max(scale, std::abs(value));
    }
    for (std::size_t i = 0; i < logits.size(); ++i) {
      const double difference = std::abs(logits[i] - expected[position][i]) / scale;
      gap = std::isnan(difference) ? std::numeric_limits<double>::infinity()
                                   : std::max(gap, difference);
    }
  };
  compare(engine->prefill(tokens.first(prompt)), prompt - 1);
  for (std::size_t position = prompt; position < tokens.size(); ++position) {
    compare(engine->decode(tokens[position]), position);
  }
  return gap;
}

const std::vector<std::int32_t> kTokens = {1, 17, 5, 40, 63, 2, 9, 9, 30, 51, 0, 22, 8, 33};

}  // namespace

TEST_CASE("the CPU engine computes what the architectures define", "[kernels][reference]") {
  struct Case {
    const char* name;
    kc::Architecture architecture;
    kk::RopeLayout layout;
    double eps;
    const char* scaling;  // "", "llama3" or "linear"
  };
  const Case cases[] = {
      {"llama", kc::LLAMA, kk::RopeLayout::kHalfSplit, 1e-6, ""},
      {"llama, interleaved pairs, llama3 scaling", kc::LLAMA, kk::RopeLayout::kInterleavedPairs,
       1e-6, "llama3"},
      {"llama, linear scaling, eps 1", kc::LLAMA, kk::RopeLayout::kHalfSplit, 1.0, "linear"},
      {"mistral (sliding window 4)", kc::MISTRAL, kk::RopeLayout::kHalfSplit, 1e-6, ""},
      {"qwen2 (biases, tied head)", kc::QWEN2, kk::RopeLayout::kHalfSplit, 1e-6, ""},
      {"qwen3 (q/k norms), eps 1", kc::QWEN3, kk::RopeLayout::kHalfSplit, 1.0, ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    kc::ModelSpec spec = kk::testing::small_spec(c.architecture);
    spec.set_rms_norm_eps(c.eps);
    if (std::string_view(c.scaling) == "llama3") {
      // Pair wavelengths of 6 to 14,000 positions against a band of 128..512: every pair kept,
      // interpolated or divided is among them.
      kc::RopeScaling& scaling = *spec.mutable_rope_scaling();
      scaling.set_rope_type("llama3");
      scaling.set_factor(8.0);
      scaling.set_low_freq_factor(1.0);
      scaling.set_high_freq_factor(4.0);
      scaling.set_original_max_position_embeddings(512);
    } else if (std::string_view(c.scaling) == "linear") {
      spec.mutable_rope_scaling()->set_rope_type("linear");
      spec.mutable_rope_scaling()->set_factor(2.0);
    }
    const auto model = std::make_shared<const kk::ModelWeights>(varied_model(spec, c.layout));
    // Float32 against double: a few parts in ten million of the largest logit. Leaving the
    // epsilon out of any one RMSNorm moves the eps-1 cases' logits by 1e-2 or more.
    REQUIRE(largest_relative_gap(model, kTokens, 5) < 5e-6);
  }
}

TEST_CASE("the CPU engine computes stories260K as the Llama definition does",
          "[kernels][reference]") {
  const std::shared_ptr<const kk::ModelWeights> model = kk::testing::stories_model();
  REQUIRE(model->rope_layout == kk::RopeLayout::kInterleavedPairs);
  const std::vector<std::int32_t> tokens = kk::testing::stories_prompt(
      "Once upon a time, there was a little girl named Lily who loved the sun");
  REQUIRE(tokens.size() > 8);
  REQUIRE(largest_relative_gap(model, tokens, tokens.size() - 4) < 5e-6);
}
