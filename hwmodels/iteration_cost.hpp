#pragma once
// The cost of one engine iteration of a decoder-only transformer on one GPU of a
// tensor-parallel group: every layer's projections, attention, elementwise kernels and
// all-reduces, then the final norm and LM head. Weights are read once per iteration whatever
// the batch; attention reads each request's KV.

#include <cstdint>
#include <vector>

#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "hwmodels/gpu_model.hpp"
#include "hwmodels/model_shape.hpp"
#include "sim/tick.hpp"

namespace kvtier::hw {

// A chunk whose micro-batch the caller leaves to split_into_micro_batches.
inline constexpr std::uint32_t kAnyMicroBatch = UINT32_MAX;
// A chunk that data-parallel attention deals to a GPU in turn (no request dispatched to one).
inline constexpr std::uint32_t kAnyGpu = UINT32_MAX;

struct PrefillChunk {
  std::uint64_t tokens = 0;          // prompt tokens processed in this iteration
  std::uint64_t context_before = 0;  // tokens of the same request already in the KV cache
  // With pipeline stages, the micro-batch the engine put it in (kAnyMicroBatch: not chosen).
  std::uint32_t micro_batch = kAnyMicroBatch;
  // With data-parallel attention, the GPU its request was dispatched to (kAnyGpu: dealt out in
  // turn).
  std::uint32_t gpu = kAnyGpu;
};

// With data-parallel attention, one GPU's own decoding requests (BatchShape's fields of the
// same names, over them).
struct GpuDecodes {
  std::uint64_t decode_tokens = 0;
  std::uint64_t decode_context_tokens = 0;
  std::uint64_t decode_draft_tokens = 0;
  // The query tokens they verify: their newest and their drafts.
  [[nodiscard]] std::uint64_t queries() const { return decode_tokens + decode_draft_tokens; }
};

// What one iteration processes (the same on every GPU of the TP group).
struct BatchShape {
  std::uint64_t decode_tokens = 0;  // one per decoding request
  // Σ over decoding requests of the KV tokens their attention reads (window-capped).
  std::uint64_t decode_context_tokens = 0;
  // With hybrid attention (model.sliding_window_pattern): the same in the layers that attend
  // globally, Σ of the requests' whole contexts (decode_context_tokens being the windowed
  // layers'). Unused otherwise.
  std::uint64_t decode_global_context_tokens = 0;
  // Speculative decoding: draft tokens verified beside the decoding requests' newest tokens,
  // each attending its request's KV (read once a request) as the newest does. Not costed in
  // pipeline micro-batches, which the engine refuses with drafts.
  std::uint64_t decode_draft_tokens = 0;
  std::vector<PrefillChunk> prefill;
  // Tokens whose logits are computed: decode tokens (drafts too) plus prompts finishing this
  // iteration.
  std::uint64_t logits_tokens = 0;
  // With data-parallel attention and requests dispatched to GPUs (engine.data_parallel_dispatch):
  // each GPU's decoding requests, one entry a GPU of the group (their sums the fields above);
  // then each prefill chunk names its GPU too. Empty: the decoding requests are taken as spread
  // evenly, each GPU ceil(D / TP) of the mean request, and the chunks dealt out in turn.
  std::vector<GpuDecodes> decodes_by_gpu;

  // Every token it processes: the decode tokens (drafts too) and the prefill chunks'.
  [[nodiscard]] std::uint64_t tokens() const {
    std::uint64_t sum = decode_tokens + decode_draft_tokens;
    for (const PrefillChunk& chunk : prefill) {
      sum += chunk.tokens;
    }
    return sum;
  }
};

struct IterationCost {
  sim::Tick total;
  sim::Tick gemm;  // projections, MLP and LM head
  sim::Tick attention;
  sim::Tick elementwise;  // norms, RoPE, activation, embedding
  sim::Tick all_reduce;   // tensor-parallel all-reduces on the GPU interconnect
  // One decoder layer and what follows them (embedding, final norm, LM head). Every layer costs
  // the same but for a mixture of experts' first dense layers and hybrid attention's global
  // layers, where `layer` is their mean: total == layer × layers + head within a picosecond per
  // layer. The tier-aware engine pipelines prefetches against the layers.
  sim::Tick layer;
  sim::Tick layer_attention;  // the attention part of `layer` (the layers' mean, as `layer`)
  // With data-parallel dispatch (BatchShape::decodes_by_gpu), one a GPU: by how much its own
  // part of every layer (its input norm and the attention of its own requests and chunks) is
  // shorter than the slowest GPU's, which `layer` holds (0 for the slowest). Empty otherwise.
  std::vector<sim::Tick> layer_lighter_by_gpu;
  sim::Tick head;
  // Of the totals below, the head's share (a pipeline stage without the LM head leaves it out).
  sim::Tick head_gemm;
  double head_flops = 0.0;
  double head_hbm_bytes = 0.0;
  std::uint32_t head_kernels = 0;
  double flops = 0.0;               // per GPU
  double hbm_bytes = 0.0;           // per GPU
  double interconnect_bytes = 0.0;  // per GPU, sent over the GPU link within its node
  double network_bytes = 0.0;       // per GPU, sent over its adapter to other nodes
  std::uint32_t kernels = 0;
  // The micro-batches the host schedules for it: 1, or with pipeline stages those with work.
  std::uint32_t micro_batches = 1;
};

// The links a tensor-parallel group's collectives cross.
struct GroupLinks {
  const config::LinkSpec* gpu_link = nullptr;  // within a node; may be null for one GPU
  const config::LinkSpec* network = nullptr;   // between nodes, each GPU's adapter
  // GPUs of one node; 0 takes the whole group to be within one node. A group of more GPUs
  // than this spans whole nodes and needs `network`.
  std::uint32_t gpus_per_node = 0;
};

class IterationCostModel {
 public:
  // `gpu_link` may be null when `tensor_parallel` is 1. Attention split by heads.
  IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                     const config::LinkSpec* gpu_link, std::uint32_t tensor_parallel);
  // Splitting by requests (data-parallel attention) needs a model with latent attention.
  IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                     const config::LinkSpec* gpu_link, std::uint32_t tensor_parallel,
                     AttentionSplit split);
  // Any parallelism; whole experts need a mixture of experts.
  IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                     const config::LinkSpec* gpu_link, const Parallelism& parallelism);
  // A group that may span nodes.
  IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                     const GroupLinks& links, const Parallelism& parallelism);

  [[nodiscard]] IterationCost cost(const BatchShape& batch) const;
  [[nodiscard]] const GpuModel& gpu() const noexcept { return gpu_; }

 private:
  struct Accumulator;
  struct LayerOps;
  enum class Mlp { kDense, kExperts };
  // `global`: a layer of a hybrid-attention model that attends the whole context.
  void add_layer(const BatchShape& batch, Mlp mlp, bool global, Accumulator& layer) const;
  // Multi-head latent attention after the input norm, on the GPUs `ops` splits it over:
  // `decode` requests' `queries` tokens (their newest, and any drafts) attend over their
  // `context` cached latents with the up-projections absorbed into the query and the output,
  // prefill chunks expand their keys' latents into every head's K and V (vLLM's MLA backends).
  void add_latent_attention(double decode, double queries, double context,
                            const std::vector<PrefillChunk>& chunks, const LayerOps& ops) const;
  // Data-parallel attention: every GPU its own requests', the layer waiting for the slowest.
  void add_data_parallel_attention(const BatchShape& batch, Accumulator& layer) const;
  // Each GPU's own part of a layer with data-parallel attention (its input norm and the
  // attention of its own decodes and chunks), or of as many GPUs as hold the slowest without
  // decodes_by_gpu.
  [[nodiscard]] std::vector<Accumulator> gpu_attention_parts(const BatchShape& batch) const;
  // The prefill chunks each GPU attends with data-parallel attention: dealt out in turn.
  [[nodiscard]] std::vector<std::vector<PrefillChunk>> chunks_per_gpu(
      const BatchShape& batch) const;
  // The decoding requests of the busiest GPU with data-parallel attention, ceil(D / TP) whole
  // ones, and the query tokens they verify: their newest and the mean request's drafts (which
  // requests draft how many is not in a BatchShape). For the even spread: without
  // decodes_by_gpu.
  struct BusiestDecodes {
    double requests = 0.0;
    double queries = 0.0;  // their newest tokens and drafts
  };
  [[nodiscard]] BusiestDecodes busiest_decodes(const BatchShape& batch) const;
  void add_head(const BatchShape& batch, Accumulator& total) const;
  // A mixture of experts' MLP over `tokens` tokens (the router, the routed experts, their sum),
  // every expert sliced over the GPUs, or whole on one of them; the GPU routes and sums `own`
  // of them (all `tokens` but under data-parallel attention with whole experts).
  void add_experts(double tokens, double own, Accumulator& layer) const;
  // Data-parallel attention with whole experts (SGLang's DeepEP): each GPU's own tokens to the
  // GPUs of their routed experts and back in two all-to-alls, instead of gathered to every GPU;
  // decoding tokens as DeepEP's low-latency kernels send them (a copy per pick on another GPU),
  // prefill tokens as its normal kernels do (a copy per other GPU they reach).
  struct OwnTokens {
    double decode = 0.0;   // the busiest GPU's decoding tokens, drafts included
    double prefill = 0.0;  // its prefill chunks' tokens
  };
  void add_expert_all_to_all(const BatchShape& batch, const OwnTokens& own,
                             Accumulator& layer) const;

  config::ModelSpec model_;
  GpuModel gpu_;
  // The group's all-reduce of `bytes` on every GPU: a ring within one node; across nodes,
  // hierarchical (reduce-scatter within each node, a ring across the nodes between GPUs of the
  // same place, each over its own adapter, on 1/gpus_per_node of the bytes, all-gather within
  // the node), the phases pipelined.
  void add_all_reduce(double bytes, Accumulator& layer) const;
  // An all-to-all in which the busiest GPU sends or receives `busiest_port_bytes`, spread evenly
  // over the other GPUs: those of other nodes through its adapter, beside the rest.
  void add_all_to_all(double busiest_port_bytes, double sent, Accumulator& layer) const;

  config::LinkSpec gpu_link_;
  config::LinkSpec network_;
  std::uint32_t tp_;
  AttentionSplit split_;
  Parallelism parallelism_;
  double weight_bytes_;         // per weight
  double expert_weight_bytes_;  // per weight of the routed experts (moe.expert_weight_dtype)
  // The format of attention and of the activations between GEMMs: the activation dtype, but
  // BF16 when the GEMMs run in FP8.
  config::DType between_gemms_;
  double activation_bytes_;  // per activation element
  double kv_bytes_per_token_per_layer_;
  std::uint32_t gpus_per_node_;  // of the group's nodes; the group when within one
  std::uint32_t nodes_;          // the group spans
};

}  // namespace kvtier::hw
