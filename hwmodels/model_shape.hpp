#pragma once
// Quantities that follow from a model's architecture: parameter counts, weight and KV bytes,
// FLOPs per token. Computed from the spec every time; never typed into a preset.

#include <cstdint>
#include <vector>

#include "configs/schema/model.pb.h"

namespace kvtier::hw {

// How a tensor-parallel group splits attention: every GPU takes a share of every request's heads
// (Megatron's split), or all heads of its own share of the requests (data-parallel attention,
// SGLang's --enable-dp-attention), keeping only their KV and the attention weights whole.
enum class AttentionSplit { kHeads, kRequests };

// How a tensor-parallel group holds a mixture of experts' routed experts: each expert sliced over
// every GPU (Megatron's split, vLLM's and SGLang's default), or whole, the experts spread over
// the GPUs (expert parallelism: vLLM's --enable-expert-parallel, SGLang's --ep-size).
enum class ExpertSplit { kSliced, kWhole };

// How an engine's GPUs share the model.
struct Parallelism {
  uint32_t gpus = 1;  // the tensor-parallel group
  AttentionSplit attention = AttentionSplit::kHeads;
  ExpertSplit experts = ExpertSplit::kSliced;
  // With whole experts: the rows the busiest GPU's experts take over those of a GPU with the
  // mean share; 0 takes what uniformly random routing gives (expert_rows_on_busiest_gpu).
  double expert_load_imbalance = 0.0;
  // With whole experts and data-parallel attention: the fixed time of each all-to-all (a
  // dispatch or a combine) beyond moving its bytes, in seconds.
  double expert_all_to_all_overhead_s = 0.0;
  // Pipeline parallelism: stages of `gpus` GPUs each, every stage holding a contiguous slice of
  // the layers (pipeline_stage_layers); 1: no pipeline.
  uint32_t pipeline_stages = 1;
};

// The decoder layers of each of `stages` pipeline stages, as vLLM splits them (get_pp_indices):
// layers / stages each, the remainder one more on each stage before the last, nearest it first
// (the last holds the LM head).
[[nodiscard]] std::vector<uint32_t> pipeline_stage_layers(uint32_t layers, uint32_t stages);
// The most layers any of those stages holds.
[[nodiscard]] uint32_t largest_pipeline_stage_layers(uint32_t layers, uint32_t stages);
// The stage holding each of `layers` layers, in layer order.
[[nodiscard]] std::vector<uint32_t> pipeline_stage_of_layers(uint32_t layers, uint32_t stages);
// The model as one pipeline stage of `stages` sees it: its layers, and of a mixture of experts'
// first dense layers those that fall in it. (Its embedding and LM head are the whole model's:
// which stage holds them is the caller's to say.)
[[nodiscard]] config::ModelSpec pipeline_stage_model(const config::ModelSpec& model,
                                                     uint32_t stages, uint32_t stage);

// Whether layer `layer` (from 0) attends the whole context: every layer without a sliding
// window, none with one alone, every sliding_window_pattern-th with hybrid attention.
[[nodiscard]] bool attends_globally(const config::ModelSpec& model, uint32_t layer);
// How many of the first `layers` layers attend the whole context.
[[nodiscard]] uint32_t global_attention_layers(const config::ModelSpec& model, uint32_t layers);
// Whether the model mixes sliding-window and global layers (model.sliding_window_pattern).
[[nodiscard]] inline bool has_hybrid_attention(const config::ModelSpec& model) {
  return model.has_sliding_window() && model.has_sliding_window_pattern();
}

struct ParameterCount {
  uint64_t embedding = 0;  // token embedding table
  // q, k, v, o projections (+ biases, + q/k norms); with latent attention, its down and up
  // projections and the latents' norms
  uint64_t attention_per_layer = 0;
  uint64_t mlp_per_layer = 0;  // gate, up, down; with experts, all of them and the router
  // A mixture of experts whose first layers keep a dense MLP: how many, and one such MLP.
  uint64_t dense_mlp_layers = 0;
  uint64_t dense_mlp_per_layer = 0;
  // A mixture of experts' (0 without): one expert MLP, the router, the shared expert, and what
  // one token uses of a layer's MLP (its experts, the router and the shared expert; the whole
  // MLP of a dense model).
  uint64_t expert = 0;
  uint64_t router = 0;
  uint64_t shared_expert = 0;
  uint64_t active_mlp_per_layer = 0;
  uint64_t norms_per_layer = 0;  // the two RMSNorm weight vectors
  // Of all layers' weights, those every GPU of a tensor-parallel group keeps whole (as vLLM
  // does): the routers, and latent attention's down-projections with their norms.
  uint64_t replicated = 0;
  uint64_t final_norm = 0;
  uint64_t lm_head = 0;  // 0 when tied to the embedding
  uint64_t layers = 0;   // all decoder layers together
  uint64_t total = 0;
  uint64_t active = 0;  // what one token uses: total less the experts it is not routed to
};

[[nodiscard]] ParameterCount count_parameters(const config::ModelSpec& model);

// Weight bytes when the weights are stored as `dtype` (norm vectors included; they are < 0.01%
// of any preset model), the routed experts as moe.expert_weight_dtype where the model gives one.
// Quantised checkpoints (FP8, INT8, INT4: AWQ, GPTQ, FP8 and DeepSeek-V3's own) keep the
// embedding and the LM head in 16 bits, as vLLM and SGLang load them.
[[nodiscard]] double weight_bytes(const config::ModelSpec& model, config::DType dtype);
// Bytes per weight of the embedding and the LM head: `dtype`'s, at least 2.
[[nodiscard]] double embedding_bytes_per_weight(config::DType dtype);
// What one GPU of a tensor-parallel group keeps: its share of the split weights and the
// replicated ones whole (with data-parallel attention, all attention weights and the input
// embedding; with more GPUs than KV heads, its KV head's K and V projections).
[[nodiscard]] double weight_bytes_per_gpu(const config::ModelSpec& model, config::DType dtype,
                                          uint32_t tensor_parallel, AttentionSplit split);
// The same for any parallelism. With whole experts, the GPU holding the most routed experts
// (ceil(experts / GPUs) of them); with data-parallel attention as well, the shared expert whole
// on every GPU (SGLang's, whose expert-parallel all-to-all leaves each GPU its own tokens). With
// pipeline stages, the GPU of the stage whose weights take the most: its layers, the input
// embedding on the first stage, the LM head on the last (and the embedding there too when the
// LM head is tied to it, as vLLM loads them).
[[nodiscard]] double weight_bytes_per_gpu(const config::ModelSpec& model, config::DType dtype,
                                          const Parallelism& parallelism);

// Routed experts on the GPU that holds the most of them: ceil(experts / GPUs) with whole
// experts, every expert's slice otherwise.
[[nodiscard]] uint32_t experts_on_busiest_gpu(const config::ModelSpec& model,
                                              const Parallelism& parallelism);

// How one token's picks fall on the GPU holding the most routed experts (m of them, whole, the
// experts dealt out to the GPUs in order): their mean and variance, and the chance that none
// does. Uniform over the experts (hypergeometric), or, with group-limited routing, uniform over
// the experts of groups_per_token groups chosen uniformly, for the first GPU's experts (whole
// groups from the first on, then part of one).
struct PicksOnGpu {
  double mean = 0.0;
  double variance = 0.0;
  double none = 0.0;  // the chance that no pick lands on the GPU
};
[[nodiscard]] PicksOnGpu picks_on_busiest_gpu(const config::ModelSpec& model,
                                              const Parallelism& parallelism);

// The (token, expert) rows that the busiest GPU's routed experts take when `tokens` tokens each
// pick experts_per_token distinct experts, with whole experts spread over the GPUs. Given an
// imbalance, that times the mean; otherwise routing is taken as uniformly random: a token sends
// picks_on_busiest_gpu of its picks to one GPU, the sum over tokens is taken as normal, and
// the busiest GPU is the expected largest of `gpus` such sums, which add up to every pick (mean
// + σ·√(n/(n−1))·E[max of n standard normals]), at most tokens · min(picks, experts on the GPU).
[[nodiscard]] double expert_rows_on_busiest_gpu(const config::ModelSpec& model,
                                                const Parallelism& parallelism, double tokens);

// Of `tokens` tokens on the other GPUs of the group (data-parallel attention), those the busiest
// GPU receives when a token is sent once to every GPU its picks land on (DeepEP's normal
// dispatch). Each token reaches the GPU holding the most routed experts unless none of its
// picks lands there (picks_on_busiest_gpu's `none`): the count is binomial, taken as normal,
// and the busiest GPU is the expected largest of `gpus` such counts (mean + σ·E[max of n
// standard normals]), at most every token. Given an imbalance, that times the mean instead.
[[nodiscard]] double tokens_reaching_busiest_gpu(const config::ModelSpec& model,
                                                 const Parallelism& parallelism, double tokens);

// E[max of n independent standard normal variables] (0 for n = 1; 0.5642 for 2, 1.4236 for 8).
[[nodiscard]] double expected_max_standard_normal(uint32_t n);

// The vectors one token keeps in one layer's KV cache: K and V of every KV head (2 · kv_heads of
// head_dim), or multi-head latent attention's one latent with its RoPE key (kv_lora_rank +
// qk_rope_head_dim). A compressed tier stores each with its own scale.
struct KvVectors {
  uint64_t count = 0;
  uint64_t width = 0;
  [[nodiscard]] uint64_t values() const noexcept { return count * width; }
};
[[nodiscard]] KvVectors kv_vectors_per_token_per_layer(const config::ModelSpec& model);

// Over how many GPUs of a tensor-parallel group the KV of its tokens is spread: all of them when
// each holds its share of the KV heads, or its share of the requests (data-parallel attention,
// on average); the KV heads' count when there are more GPUs than KV heads, each GPU keeping one
// head that TP / kv_heads of them share (vLLM replicates them so); one with latent attention
// split by heads, whose latent every head reads, so that every GPU keeps it whole (vLLM's and
// SGLang's MLA under tensor parallelism).
[[nodiscard]] uint32_t kv_shards(const config::ModelSpec& model, uint32_t tensor_parallel,
                                 AttentionSplit split);

// One token's KV in one layer, and in all layers: kv_vectors_per_token_per_layer · bytes(kv_dtype).
[[nodiscard]] double kv_bytes_per_token_per_layer(const config::ModelSpec& model);
[[nodiscard]] double kv_bytes_per_token(const config::ModelSpec& model);
// What one GPU of a tensor-parallel group keeps of them, on average.
[[nodiscard]] double kv_bytes_per_token_per_layer_per_gpu(const config::ModelSpec& model,
                                                          uint32_t tensor_parallel,
                                                          AttentionSplit split);
[[nodiscard]] double kv_bytes_per_token_per_gpu(const config::ModelSpec& model,
                                                uint32_t tensor_parallel, AttentionSplit split);

// Matrix-multiply FLOPs for one token excluding attention over the context:
// 2 FLOPs per weight of every projection, MLP and the LM head (the embedding is a lookup); of a
// mixture of experts, the experts a token is routed to.
[[nodiscard]] double linear_flops_per_token(const config::ModelSpec& model);
// Attention FLOPs one token spends per context token it attends to (QKᵀ and AV, all layers);
// with latent attention, as decoding computes it: every head over the cached latent.
[[nodiscard]] double attention_flops_per_context_token(const config::ModelSpec& model);
// Total FLOPs for one token attending to `context_tokens` earlier tokens (capped by the
// sliding window in the layers that attend within one).
[[nodiscard]] double flops_per_token(const config::ModelSpec& model, uint64_t context_tokens);

}  // namespace kvtier::hw
