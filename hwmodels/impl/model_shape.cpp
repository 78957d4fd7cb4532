#include "hwmodels/model_shape.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <string>

#include "common/errors.hpp"
#include "configs/dtype.hpp"

namespace kvtier::hw {

namespace {

// A parameter count whose arithmetic refuses to wrap: absurd dimensions (a hidden size and a
// vocabulary of billions each) would otherwise wrap 64 bits into a small, plausible model.
class Count {
 public:
  Count(uint64_t value, const config::ModelSpec& model) : value_(value), model_(&model) {}
  Count(const Count&) = default;
  Count& operator=(const Count&) = default;

  Count operator*(uint64_t other) const {
    uint64_t product = 0;
    if (__builtin_mul_overflow(value_, other, &product)) {
      overflow();
    }
    return {product, *model_};
  }
  Count operator*(const Count& other) const { return *this * other.value_; }
  Count operator+(uint64_t other) const {
    uint64_t sum = 0;
    if (__builtin_add_overflow(value_, other, &sum)) {
      overflow();
    }
    return {sum, *model_};
  }
  Count operator+(const Count& other) const { return *this + other.value_; }
  Count& operator+=(const Count& other) { return *this = *this + other; }
  [[nodiscard]] uint64_t value() const noexcept { return value_; }

 private:
  [[noreturn]] void overflow() const {
    throw ConfigError("model " + model_->name() +
                          " has more than 2^64 parameters: its dimensions (hidden_size, "
                          "vocab_size, intermediate sizes, heads, experts, layers) are out of "
                          "any model's range",
                      "model " + model_->name());
  }

  uint64_t value_;
  const config::ModelSpec* model_;
};

// The projections to the latents and the latents' norms, replicated over tensor parallelism
// (vLLM's fused_qkv_a_proj).
Count latent_down_projection_parameters(const config::ModelSpec& model) {
  const config::MultiHeadLatentAttention& mla = model.mla();
  const uint64_t latents = static_cast<uint64_t>(mla.kv_lora_rank()) + mla.q_lora_rank();
  return Count(model.hidden_size(), model) * (latents + mla.qk_rope_head_dim()) + latents;
}

// DeepSeek-V2's attention: queries straight from the hidden state or through a low-rank
// latent (q_a_proj, its norm, q_b_proj), the keys' and values' latent with the shared RoPE key
// (kv_a_proj_with_mqa) and its norm, their up-projection to every head (kv_b_proj), and the
// output projection from the heads' values.
Count latent_attention_parameters(const config::ModelSpec& model) {
  const config::MultiHeadLatentAttention& mla = model.mla();
  const Count hidden(model.hidden_size(), model);
  const Count heads(model.num_attention_heads(), model);
  const uint64_t q_head = static_cast<uint64_t>(mla.qk_nope_head_dim()) + mla.qk_rope_head_dim();
  Count count(0, model);
  if (mla.has_q_lora_rank()) {
    count += hidden * mla.q_lora_rank() + mla.q_lora_rank() + heads * mla.q_lora_rank() * q_head;
  } else {
    count += hidden * heads * q_head;
  }
  count += hidden * (static_cast<uint64_t>(mla.kv_lora_rank()) + mla.qk_rope_head_dim()) +
           mla.kv_lora_rank();
  count += heads * mla.kv_lora_rank() *
           (static_cast<uint64_t>(mla.qk_nope_head_dim()) + mla.v_head_dim());
  count += heads * mla.v_head_dim() * hidden;
  return count;
}

}  // namespace

ParameterCount count_parameters(const config::ModelSpec& model) {
  const Count hidden(model.hidden_size(), model);
  const Count q_width = Count(model.num_attention_heads(), model) * model.head_dim();
  const Count kv_width = Count(model.num_key_value_heads(), model) * model.head_dim();
  ParameterCount count;
  count.embedding = (hidden * model.vocab_size()).value();
  Count attention(0, model);
  if (model.has_mla()) {
    attention = latent_attention_parameters(model);
  } else {
    attention = hidden * q_width + hidden * kv_width * 2 + q_width * hidden;
  }
  if (model.attention_bias()) {
    attention += q_width + kv_width * 2;
  }
  if (model.qk_norm()) {
    attention += Count(model.head_dim(), model) * 2;
  }
  count.attention_per_layer = attention.value();
  const Count layers(model.num_hidden_layers(), model);
  Count mlp_layers = layers;
  Count dense_layers(0, model);
  Count mlp(0, model);
  Count dense_mlp(0, model);
  if (model.has_moe()) {
    const config::MixtureOfExperts& moe = model.moe();
    const Count expert = hidden * moe.expert_intermediate_size() * 3;
    const Count router = hidden * moe.num_experts();
    const Count shared = hidden * moe.shared_expert_intermediate_size() * 3;
    mlp = expert * moe.num_experts() + router + shared;
    count.expert = expert.value();
    count.router = router.value();
    count.shared_expert = shared.value();
    count.mlp_per_layer = mlp.value();
    count.active_mlp_per_layer = (expert * moe.experts_per_token() + router + shared).value();
    count.dense_mlp_layers = moe.first_dense_layers();
    dense_mlp = hidden * model.intermediate_size() * 3;
    count.dense_mlp_per_layer = dense_mlp.value();
    const uint64_t dense = std::min<uint64_t>(moe.first_dense_layers(), layers.value());
    dense_layers = Count(dense, model);
    mlp_layers = Count(layers.value() - dense, model);
  } else {
    mlp = hidden * model.intermediate_size() * 3;
    count.mlp_per_layer = mlp.value();
    count.active_mlp_per_layer = count.mlp_per_layer;
  }
  const Count norms = hidden * 2;
  count.norms_per_layer = norms.value();
  count.final_norm = hidden.value();
  count.lm_head = model.tie_word_embeddings() ? 0 : count.embedding;
  const Count all_layers =
      layers * (attention + norms) + mlp_layers * mlp + dense_layers * dense_mlp;
  count.layers = all_layers.value();
  Count replicated = mlp_layers * count.router;
  if (model.has_mla()) {
    replicated += layers * latent_down_projection_parameters(model);
  }
  count.replicated = replicated.value();
  count.total = (all_layers + count.embedding + count.final_norm + count.lm_head).value();
  count.active =
      count.total - mlp_layers.value() * (count.mlp_per_layer - count.active_mlp_per_layer);
  return count;
}

double embedding_bytes_per_weight(config::DType dtype) {
  return std::max(config::dtype_bytes(dtype), 2.0);
}

double weight_bytes(const config::ModelSpec& model, config::DType dtype) {
  return weight_bytes_per_gpu(model, dtype, Parallelism{});
}

double weight_bytes_per_gpu(const config::ModelSpec& model, config::DType dtype,
                            uint32_t tensor_parallel, AttentionSplit split) {
  return weight_bytes_per_gpu(model, dtype, Parallelism{tensor_parallel, split});
}

std::vector<uint32_t> pipeline_stage_layers(uint32_t layers, uint32_t stages) {
  std::vector<uint32_t> split(stages, layers / stages);
  for (uint32_t i = 0; i < layers % stages; ++i) {
    ++split[stages - 2 - i];
  }
  return split;
}

uint32_t largest_pipeline_stage_layers(uint32_t layers, uint32_t stages) {
  const std::vector<uint32_t> split = pipeline_stage_layers(layers, stages);
  return *std::max_element(split.begin(), split.end());
}

std::vector<uint32_t> pipeline_stage_of_layers(uint32_t layers, uint32_t stages) {
  std::vector<uint32_t> stage_of;
  stage_of.reserve(layers);
  const std::vector<uint32_t> split = pipeline_stage_layers(layers, stages);
  for (uint32_t s = 0; s < stages; ++s) {
    stage_of.insert(stage_of.end(), split[s], s);
  }
  return stage_of;
}

config::ModelSpec pipeline_stage_model(const config::ModelSpec& model, uint32_t stages,
                                       uint32_t stage) {
  const std::vector<uint32_t> split = pipeline_stage_layers(model.num_hidden_layers(), stages);
  uint32_t first = 0;
  for (uint32_t s = 0; s < stage; ++s) {
    first += split[s];
  }
  config::ModelSpec part = model;
  part.set_num_hidden_layers(split[stage]);
  if (model.has_moe() && model.moe().has_first_dense_layers()) {
    const uint32_t dense = model.moe().first_dense_layers();
    part.mutable_moe()->set_first_dense_layers(dense > first ? std::min(dense - first, split[stage])
                                                             : 0);
  }
  return part;
}

namespace {

// What one GPU of pipeline stage `stage` keeps.
double stage_weight_bytes_per_gpu(const config::ModelSpec& model, config::DType dtype,
                                  const Parallelism& parallelism, uint32_t stage) {
  const uint32_t stages = parallelism.pipeline_stages;
  Parallelism one_stage = parallelism;
  one_stage.pipeline_stages = 1;
  const double with_tables =
      weight_bytes_per_gpu(pipeline_stage_model(model, stages, stage), dtype, one_stage);
  // Less the tables the stage does not hold, split over its GPUs (vocabulary-parallel).
  const ParameterCount count = count_parameters(model);
  const bool last = stage + 1 == stages;
  const bool tied = count.lm_head == 0;
  const uint64_t missing =
      (stage == 0 || (tied && last) ? 0 : count.embedding) + (last ? 0 : count.lm_head);
  return with_tables -
         static_cast<double>(missing) / parallelism.gpus * embedding_bytes_per_weight(dtype);
}

}  // namespace

double weight_bytes_per_gpu(const config::ModelSpec& model, config::DType dtype,
                            const Parallelism& parallelism) {
  if (parallelism.pipeline_stages > 1) {
    double most = 0.0;
    for (uint32_t stage = 0; stage < parallelism.pipeline_stages; ++stage) {
      most = std::max(most, stage_weight_bytes_per_gpu(model, dtype, parallelism, stage));
    }
    return most;
  }
  const ParameterCount count = count_parameters(model);
  const uint64_t layers = model.num_hidden_layers();
  uint64_t replicated = count.replicated;
  if (parallelism.attention == AttentionSplit::kRequests) {
    // The whole of every layer's attention, of which latent attention's down-projections were
    // replicated already, and the input embedding (SGLang's, under data-parallel attention).
    replicated += layers * count.attention_per_layer + count.embedding;
    if (model.has_mla()) {
      replicated -= layers * latent_down_projection_parameters(model).value();
    }
  }
  // Routed experts kept whole: out of the split weights, the busiest GPU's share in whole.
  uint64_t routed = 0;
  uint64_t routed_on_gpu = 0;
  if (parallelism.experts == ExpertSplit::kWhole && model.has_moe()) {
    const uint64_t expert_layers = layers - std::min(count.dense_mlp_layers, layers);
    routed = expert_layers * model.moe().num_experts() * count.expert;
    routed_on_gpu = expert_layers * experts_on_busiest_gpu(model, parallelism) * count.expert;
    if (parallelism.attention == AttentionSplit::kRequests) {
      replicated += expert_layers * count.shared_expert;
    }
  }
  // More GPUs than KV heads: each keeps the K and V projections of its one head (with their
  // biases), which tp / kv_heads GPUs share, on top of its share of everything else.
  double kv_head_copies = 0.0;
  const uint32_t shards = kv_shards(model, parallelism.gpus, parallelism.attention);
  if (parallelism.attention == AttentionSplit::kHeads && !model.has_mla() &&
      shards < parallelism.gpus) {
    const double kv_width = static_cast<double>(model.num_key_value_heads()) * model.head_dim();
    const double per_layer =
        2.0 * kv_width *
        (static_cast<double>(model.hidden_size()) + (model.attention_bias() ? 1 : 0));
    kv_head_copies = static_cast<double>(layers) * per_layer *
                     (1.0 / shards - 1.0 / static_cast<double>(parallelism.gpus));
  }
  // The embedding and LM head (vocabulary-parallel, the embedding whole under data-parallel
  // attention) at their own format, the rest at `dtype`.
  const uint64_t whole_tables =
      parallelism.attention == AttentionSplit::kRequests ? count.embedding : 0;
  const uint64_t split_tables = count.embedding + count.lm_head - whole_tables;
  const double tp = parallelism.gpus;
  const double layers_and_norms =
      static_cast<double>(count.total - replicated - split_tables - routed) / tp +
      static_cast<double>(replicated - whole_tables) + static_cast<double>(routed_on_gpu) +
      kv_head_copies;
  const double tables = static_cast<double>(split_tables) / tp + static_cast<double>(whole_tables);
  const double bytes =
      layers_and_norms * config::dtype_bytes(dtype) + tables * embedding_bytes_per_weight(dtype);
  if (!model.has_moe() || model.moe().expert_weight_dtype() == config::DTYPE_UNSPECIFIED) {
    return bytes;
  }
  // The routed experts this GPU keeps (whole, or its slice of each) in their own format.
  const uint64_t expert_layers = layers - std::min(count.dense_mlp_layers, layers);
  const double experts_on_gpu =
      parallelism.experts == ExpertSplit::kWhole
          ? static_cast<double>(routed_on_gpu)
          : static_cast<double>(expert_layers * model.moe().num_experts() * count.expert) / tp;
  return bytes + experts_on_gpu * (config::dtype_bytes(model.moe().expert_weight_dtype()) -
                                   config::dtype_bytes(dtype));
}

uint32_t experts_on_busiest_gpu(const config::ModelSpec& model, const Parallelism& parallelism) {
  const uint32_t experts = model.moe().num_experts();
  if (parallelism.experts == ExpertSplit::kSliced) {
    return experts;
  }
  return (experts + parallelism.gpus - 1) / parallelism.gpus;
}

namespace {

// log C(n, k).
double log_choose(double n, double k) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
}

// `draws` distinct picks of `population` of which `marked` are a GPU's: how many are.
PicksOnGpu hypergeometric(double population, double marked, double draws) {
  PicksOnGpu picks;
  const double share = marked / population;
  picks.mean = draws * share;
  picks.variance = population > 1.0
                       ? draws * share * (1.0 - share) * (population - draws) / (population - 1.0)
                       : 0.0;
  picks.none = 1.0;
  for (double i = 0; i < draws; ++i) {
    picks.none *= std::max(population - marked - i, 0.0) / (population - i);
  }
  return picks;
}

}  // namespace

PicksOnGpu picks_on_busiest_gpu(const config::ModelSpec& model, const Parallelism& parallelism) {
  const config::MixtureOfExperts& moe = model.moe();
  const double experts = moe.num_experts();
  const double picks = std::min<double>(moe.experts_per_token(), experts);
  const uint32_t on_gpu = experts_on_busiest_gpu(model, parallelism);
  const uint32_t groups = moe.expert_groups();
  if (parallelism.experts == ExpertSplit::kSliced || groups <= 1 ||
      moe.num_experts() % groups != 0) {
    return hypergeometric(experts, on_gpu, picks);
  }
  // The first GPU's experts, dealt out from the first group on: `whole` groups and `partial`
  // (0 or 1) group of which it holds `rest` experts. Of the groups chosen, J whole and R partial
  // are the GPU's (multivariate hypergeometric over the groups), and the picks fall uniformly on
  // the chosen groups' experts, J · group + R · rest of them the GPU's.
  const uint32_t group = moe.num_experts() / groups;
  const uint32_t whole_groups = on_gpu / group;
  const uint32_t rest_experts = on_gpu % group;
  const double whole = whole_groups;
  const double rest = rest_experts;
  const double partial = rest_experts > 0 ? 1.0 : 0.0;
  const double others = groups - whole - partial;
  const double chosen = std::min(moe.groups_per_token(), groups);
  const double reachable = chosen * group;
  PicksOnGpu total;
  double second_moment = 0.0;
  for (double j = 0; j <= std::min(whole, chosen); ++j) {
    for (double r = 0; r <= partial && j + r <= chosen; ++r) {
      if (chosen - j - r > others) {
        continue;  // the other groups cannot fill the rest of the choice
      }
      const double chance =
          std::exp(log_choose(whole, j) + log_choose(partial, r) +
                   log_choose(others, chosen - j - r) - log_choose(groups, chosen));
      const PicksOnGpu given = hypergeometric(reachable, j * group + r * rest, picks);
      total.mean += chance * given.mean;
      second_moment += chance * (given.variance + given.mean * given.mean);
      total.none += chance * given.none;
    }
  }
  total.variance = std::max(second_moment - total.mean * total.mean, 0.0);
  return total;
}

double expert_rows_on_busiest_gpu(const config::ModelSpec& model, const Parallelism& parallelism,
                                  double tokens) {
  const config::MixtureOfExperts& moe = model.moe();
  const double experts = moe.num_experts();
  const double picks = std::min<double>(moe.experts_per_token(), experts);
  if (parallelism.experts == ExpertSplit::kSliced) {
    return tokens * picks;
  }
  const double on_gpu = experts_on_busiest_gpu(model, parallelism);
  const double mean = tokens * picks * on_gpu / experts;
  const double most = tokens * std::min(picks, on_gpu);
  if (parallelism.expert_load_imbalance > 0.0) {
    return std::min(mean * parallelism.expert_load_imbalance, most);
  }
  const double gpus = parallelism.gpus;
  if (gpus <= 1.0) {
    return mean;
  }
  // The GPUs' sums add up to every pick, so they are correlated −1/(n − 1): each is the mean
  // plus σ·√(n/(n−1)) times a standard normal less the mean of all n of them, whose largest
  // expected value is E[max of n standard normals].
  const double variance = picks_on_busiest_gpu(model, parallelism).variance;
  const double spread = std::sqrt(tokens * variance * gpus / (gpus - 1.0));
  return std::min(mean + spread * expected_max_standard_normal(parallelism.gpus), most);
}

double tokens_reaching_busiest_gpu(const config::ModelSpec& model, const Parallelism& parallelism,
                                   double tokens) {
  const double reach = 1.0 - picks_on_busiest_gpu(model, parallelism).none;
  const double mean = tokens * reach;
  if (parallelism.expert_load_imbalance > 0.0) {
    return std::min(mean * parallelism.expert_load_imbalance, tokens);
  }
  // Unlike the rows, the GPUs' counts do not add up to a fixed total (a token reaches a varying
  // number of GPUs), so they are taken as independent. Under group-limited routing they are
  // slightly anti-correlated (a token reaches few GPUs), which lifts the true largest: this
  // understates it by up to 1% (1.5% at 16 tokens).
  const double spread = std::sqrt(tokens * reach * (1.0 - reach));
  return std::min(mean + spread * expected_max_standard_normal(parallelism.gpus), tokens);
}

namespace {

// ∫ x · n·φ(x)·Φ(x)^(n−1) dx by Simpson's rule over [−12, 12], where the tails are < 1e-30.
double integrate_expected_max(uint32_t n) {
  constexpr int kIntervals = 4800;
  constexpr double kFrom = -12.0;
  constexpr double kTo = 12.0;
  constexpr double kStep = (kTo - kFrom) / kIntervals;
  const double exponent = static_cast<double>(n) - 1.0;
  const auto integrand = [&](double x) {
    const double density = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
    const double below = 0.5 * std::erfc(-x / std::numbers::sqrt2);
    return x * static_cast<double>(n) * density * std::pow(below, exponent);
  };
  double sum = integrand(kFrom) + integrand(kTo);
  for (int i = 1; i < kIntervals; ++i) {
    sum += (i % 2 == 1 ? 4.0 : 2.0) * integrand(kFrom + i * kStep);
  }
  return sum * kStep / 3.0;
}

}  // namespace

double expected_max_standard_normal(uint32_t n) {
  if (n <= 1) {
    return 0.0;
  }
  // Every iteration's cost asks for it: the group sizes a run can have (at most 64 GPUs) are
  // integrated once.
  constexpr uint32_t kTabulated = 64;
  static const std::array<double, kTabulated + 1> table = [] {
    std::array<double, kTabulated + 1> values{};
    for (uint32_t i = 2; i <= kTabulated; ++i) {
      values[i] = integrate_expected_max(i);
    }
    return values;
  }();
  return n <= kTabulated ? table[n] : integrate_expected_max(n);
}

KvVectors kv_vectors_per_token_per_layer(const config::ModelSpec& model) {
  if (model.has_mla()) {
    return {1, static_cast<uint64_t>(model.mla().kv_lora_rank()) + model.mla().qk_rope_head_dim()};
  }
  return {2ULL * model.num_key_value_heads(), model.head_dim()};
}

uint32_t kv_shards(const config::ModelSpec& model, uint32_t tensor_parallel, AttentionSplit split) {
  if (split == AttentionSplit::kRequests) {
    return tensor_parallel;
  }
  if (model.has_mla()) {
    return 1;
  }
  return std::min(tensor_parallel, std::max(model.num_key_value_heads(), 1U));
}

double kv_bytes_per_token_per_layer(const config::ModelSpec& model) {
  return static_cast<double>(kv_vectors_per_token_per_layer(model).values()) *
         config::dtype_bytes(model.kv_dtype());
}

double kv_bytes_per_token(const config::ModelSpec& model) {
  return kv_bytes_per_token_per_layer(model) * model.num_hidden_layers();
}

double kv_bytes_per_token_per_layer_per_gpu(const config::ModelSpec& model,
                                            uint32_t tensor_parallel, AttentionSplit split) {
  return kv_bytes_per_token_per_layer(model) / kv_shards(model, tensor_parallel, split);
}

double kv_bytes_per_token_per_gpu(const config::ModelSpec& model, uint32_t tensor_parallel,
                                  AttentionSplit split) {
  return kv_bytes_per_token(model) / kv_shards(model, tensor_parallel, split);
}

double linear_flops_per_token(const config::ModelSpec& model) {
  const ParameterCount count = count_parameters(model);
  const uint64_t layers = model.num_hidden_layers();
  const uint64_t dense_layers = std::min(count.dense_mlp_layers, layers);
  const uint64_t matrix_weights = layers * count.attention_per_layer +
                                  (layers - dense_layers) * count.active_mlp_per_layer +
                                  dense_layers * count.dense_mlp_per_layer;
  // The LM head multiplies by a vocab x hidden matrix whether or not it is tied.
  return 2.0 * (static_cast<double>(matrix_weights) + static_cast<double>(count.embedding));
}

double attention_flops_per_context_token(const config::ModelSpec& model) {
  if (model.has_mla()) {
    // Scores over the latent and the RoPE key, then the latent weighted by them.
    const config::MultiHeadLatentAttention& mla = model.mla();
    return 2.0 * model.num_hidden_layers() * model.num_attention_heads() *
           (2.0 * mla.kv_lora_rank() + mla.qk_rope_head_dim());
  }
  return 4.0 * model.num_hidden_layers() * model.num_attention_heads() * model.head_dim();
}

double flops_per_token(const config::ModelSpec& model, uint64_t context_tokens) {
  uint64_t attended = context_tokens;
  if (model.has_sliding_window()) {
    attended = std::min<uint64_t>(attended, model.sliding_window());
  }
  if (has_hybrid_attention(model)) {
    // The layers' mean: the global ones attend the whole context.
    const uint32_t layers = model.num_hidden_layers();
    const uint32_t global = global_attention_layers(model, layers);
    const double per_layer =
        (static_cast<double>(global) * static_cast<double>(context_tokens) +
         static_cast<double>(layers - global) * static_cast<double>(attended)) /
        layers;
    return linear_flops_per_token(model) + attention_flops_per_context_token(model) * per_layer;
  }
  return linear_flops_per_token(model) +
         attention_flops_per_context_token(model) * static_cast<double>(attended);
}

namespace {

// The loader holds the pattern to at least 2; a model built in code too.
uint32_t checked_pattern(const config::ModelSpec& model) {
  if (model.sliding_window_pattern() < 2) {
    throw ConfigError("sliding_window_pattern " + std::to_string(model.sliding_window_pattern()) +
                          " of model " + model.name() + " must be at least 2",
                      "field model.sliding_window_pattern");
  }
  return model.sliding_window_pattern();
}

}  // namespace

bool attends_globally(const config::ModelSpec& model, uint32_t layer) {
  if (!model.has_sliding_window()) {
    return true;
  }
  return model.has_sliding_window_pattern() && (layer + 1) % checked_pattern(model) == 0;
}

uint32_t global_attention_layers(const config::ModelSpec& model, uint32_t layers) {
  if (!model.has_sliding_window()) {
    return layers;
  }
  return model.has_sliding_window_pattern() ? layers / checked_pattern(model) : 0;
}

}  // namespace kvtier::hw
