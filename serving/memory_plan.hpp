#pragma once
// How one GPU's memory divides in a tensor-parallel engine: weights/TP, activation workspace,
// runtime reserve, and what is left for the KV cache.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/pools.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/model_shape.hpp"

namespace kvtier::serving {

// How many GPUs and nodes the run's engines take (configs/pools.hpp).
using config::cluster_gpus;
using config::cluster_nodes;
using config::engines_per_node;
using config::gpus_per_engine;
using config::largest_gpus_per_engine;
using config::mean_engines_per_node;
using config::mean_gpus_per_engine;
using config::pipeline_stages;

struct MemoryPlan {
  double capacity_bytes = 0.0;
  double weights_bytes = 0.0;  // this GPU's shard
  // A speculating engine's drafter (drafter_layers): this GPU's shard of its decoder layers,
  // which share the model's embedding and LM head. 0 without one.
  double drafter_weights_bytes = 0.0;
  double workspace_bytes = 0.0;
  double reserve_bytes = 0.0;
  double kv_capacity_bytes = 0.0;
  // This GPU's share of one token's K and V over all layers, a drafter's included.
  double kv_bytes_per_token = 0.0;
  // Of kv_bytes_per_token, the drafter's layers' share (0 without one). A drafter keeps its KV
  // of the whole context in HBM, in the request's blocks, whatever tier policy places the
  // model's.
  double drafter_kv_share = 0.0;
  // Over how many GPUs the engine's requests spread while each request's KV stays on one:
  // the tensor-parallel degree with data-parallel attention (kv_bytes_per_token is then a
  // GPU's average share), else 1. A request's own KV must fit one GPU: kv_bytes_for(tokens) ×
  // this.
  std::uint32_t requests_spread = 1;
  // Sliding window (0: none): the KV a request holds in the layers that attend within it is
  // capped.
  std::uint64_t window_tokens = 0;
  // With hybrid attention (model.sliding_window_pattern), the share of kv_bytes_per_token in
  // layers that attend globally, which hold the whole context (a drafter's layers taken as the
  // model's mix); 0 otherwise.
  double global_layer_share = 0.0;
  // Tokens per KV block (memory.kv_block_tokens; 0: counted a token at a time). The KV capacity
  // is then a whole number of blocks.
  std::uint32_t block_tokens = 0;
  // Host memory this GPU's T1/T2 KV may fill: the node's DDR shared evenly by its GPUs (a fully
  // loaded node), less the swap space (workload.on_demand_admission.swap) and the prefix cache's
  // host tier set aside beside it.
  double host_kv_capacity_bytes = 0.0;
  double swap_space_bytes = 0.0;  // per GPU; 0 without swapping
  // The prefix cache's host tier per GPU (memory.prefix_cache_host_gib, whole blocks), also set
  // aside beside the T1/T2 KV; 0 without it.
  double prefix_host_bytes = 0.0;

  // The tokens of a context of `tokens` whose KV a request holds in a layer that attends
  // within the window (the window's, if any; every layer without hybrid attention).
  [[nodiscard]] std::uint64_t held_tokens(std::uint64_t tokens) const;
  // The most it holds in any layer: every token in a global layer of hybrid attention.
  [[nodiscard]] std::uint64_t most_held_tokens(std::uint64_t tokens) const {
    return global_layer_share > 0.0 ? tokens : held_tokens(tokens);
  }
  // The token places of KV memory a request with `tokens` tokens of context occupies in such a
  // layer: its held tokens, or with blocks the blocks they fall in (a window's first and last
  // partly used).
  [[nodiscard]] std::uint64_t allocated_tokens(std::uint64_t tokens) const;
  // The most token places a request occupies there while its context grows to `tokens` (with a
  // window and blocks the window's span of blocks varies with its start).
  [[nodiscard]] std::uint64_t peak_allocated_tokens(std::uint64_t tokens) const;
  // KV bytes a request with `tokens` tokens of context occupies on this GPU (allocated_tokens,
  // and with hybrid attention in the global layers' share every token's blocks).
  [[nodiscard]] double kv_bytes_for(std::uint64_t tokens) const;
  // The most KV bytes it occupies while its context grows to `tokens` (peak_allocated_tokens).
  [[nodiscard]] double peak_kv_bytes_for(std::uint64_t tokens) const;
  // The most kv_bytes_for(t) for t from `fewest` to `most` tokens: what a speculating step that
  // writes `most` tokens' KV and keeps at least `fewest` may hold after it (with a window and
  // blocks, the window's span of blocks may be larger at fewer tokens).
  [[nodiscard]] double most_kv_bytes_for(std::uint64_t fewest, std::uint64_t most) const;
  // The mean token places over the layers of `tokens` tokens just written, counted a token at a
  // time: with hybrid attention, the windowed layers hold at most the window of them.
  [[nodiscard]] double written_places(double tokens) const;
  // Bytes of one KV block over all layers on this GPU (0 without blocks).
  [[nodiscard]] double block_bytes() const { return block_tokens * kv_bytes_per_token; }
  // The drafter's share of kv_bytes_for(tokens).
  [[nodiscard]] double drafter_kv_bytes_for(std::uint64_t tokens) const {
    return kv_bytes_for(tokens) * drafter_kv_share;
  }
  // Of kv_bytes_for(tokens), what a tier policy leaves in HBM: the drafter's layers' and, with
  // hybrid attention, the model's windowed layers' (the policy places the global layers' tokens,
  // tiered_layers).
  [[nodiscard]] double untiered_kv_bytes_for(std::uint64_t tokens) const {
    return drafter_kv_bytes_for(tokens) + windowed_model_kv_bytes(allocated_tokens(tokens));
  }
  // The most of it for t from `fewest` to `most` tokens (most_kv_bytes_for's).
  [[nodiscard]] double most_untiered_kv_bytes_for(std::uint64_t fewest, std::uint64_t most) const;
  // The most of it while the context grows to `tokens` (peak_kv_bytes_for's).
  [[nodiscard]] double peak_untiered_kv_bytes_for(std::uint64_t tokens) const {
    return peak_kv_bytes_for(tokens) * drafter_kv_share +
           windowed_model_kv_bytes(peak_allocated_tokens(tokens));
  }
  // "weights 14.96 GiB + workspace 1.00 GiB + reserve 2.00 GiB = ... of 80.00 GiB" (with a
  // drafter, "weights ... + drafter ... + workspace ...").
  [[nodiscard]] std::string breakdown() const;

 private:
  // Hybrid attention: the layers' mean token places, `windowed` in the windowed layers and
  // every token's blocks in the global ones.
  [[nodiscard]] double mixed_places(std::uint64_t windowed, std::uint64_t tokens) const;
  // Hybrid attention: `places` token places in each of the model's windowed layers (not the
  // drafter's), in bytes; 0 without hybrid attention.
  [[nodiscard]] double windowed_model_kv_bytes(std::uint64_t places) const;
  // The most of (this->*bytes)(t) for t from `fewest` to `most`.
  [[nodiscard]] double most_over(std::uint64_t fewest, std::uint64_t most,
                                 double (MemoryPlan::*bytes)(std::uint64_t) const) const;
};

// memory.kv_block_tokens, or 0 when the run counts KV a token at a time.
[[nodiscard]] std::uint32_t kv_block_tokens(const config::RunSpec& run);

// One layer's `tokens` (a fractional share where a demand is projected) as the token places of
// the whole blocks of `block_tokens` they fill (0: as they are): a tier policy's T0 in a paged
// cache, each layer's tokens packed into blocks of their own.
[[nodiscard]] double in_whole_blocks(double tokens, std::uint32_t block_tokens);

// The decoder layers of the run's drafter (engine.speculative.draft_layers), 0 when it drafts
// nothing (no engine.speculative, or draft_tokens 0).
[[nodiscard]] std::uint32_t drafter_layers(const config::RunSpec& run);
// One GPU's shard of the drafter's weights: that many more decoder layers of the model's shape
// (of a mixture of experts, experts layers), the embedding and LM head shared with the model.
[[nodiscard]] double drafter_weight_bytes_per_gpu(const config::RunSpec& run);
// One token's KV on one GPU, over the layers of its pipeline stage (the stage with the most of
// them; all layers without stages) and the drafter's.
[[nodiscard]] double kv_bytes_per_token_per_gpu(const config::RunSpec& run);
// Throws ConfigError (exit 2) with the breakdown when weights, workspace and reserve alone
// exceed the GPU's memory: nothing could ever run.
[[nodiscard]] MemoryPlan plan_memory(const config::RunSpec& run);

// How the run's tensor-parallel group splits attention (engine.data_parallel_attention).
[[nodiscard]] inline hw::AttentionSplit attention_split(const config::RunSpec& run) {
  return run.engine().data_parallel_attention() ? hw::AttentionSplit::kRequests
                                                : hw::AttentionSplit::kHeads;
}

// The model's layers whose tokens a tier policy places (TierDemand's target layers), in order:
// with hybrid attention the global ones, whose KV grows with the context (the windowed layers
// keep their window in HBM, MemoryPlan::untiered_kv_bytes_for); else every layer.
[[nodiscard]] std::vector<std::uint32_t> tiered_layers(const config::RunSpec& run);
// The pipeline stage of each of them (all 0 without stages).
[[nodiscard]] std::vector<std::uint32_t> tiered_layer_stages(const config::RunSpec& run);
// The most of them one stage holds, given each one's stage.
[[nodiscard]] std::uint32_t most_tiered_layers_of_a_stage(
    const std::vector<std::uint32_t>& stage_of_tiered_layer);

// The most decoder layers one GPU holds: the model's, or its largest pipeline stage's.
[[nodiscard]] inline std::uint32_t layers_per_gpu(const config::RunSpec& run) {
  return hw::largest_pipeline_stage_layers(run.model().num_hidden_layers(), pipeline_stages(run));
}

// How the run's GPUs share the model (tensor_parallel_degree, engine.data_parallel_attention,
// engine.expert_parallel).
[[nodiscard]] inline hw::Parallelism parallelism(const config::RunSpec& run) {
  return {run.tensor_parallel_degree(),
          attention_split(run),
          run.engine().expert_parallel() ? hw::ExpertSplit::kWhole : hw::ExpertSplit::kSliced,
          run.engine().expert_load_imbalance(),
          run.engine().expert_all_to_all_overhead_us() * 1e-6,
          pipeline_stages(run)};
}

// "tensor parallel 8", or with pipeline stages "tensor parallel 8 x pipeline 2": how a report
// names the engine's parallelism.
[[nodiscard]] inline std::string describe_parallelism(const config::RunSpec& run) {
  return "tensor parallel " + std::to_string(run.tensor_parallel_degree()) +
         (pipeline_stages(run) > 1 ? " x pipeline " + std::to_string(pipeline_stages(run))
                                   : std::string());
}

// "tensor parallel 8 (8 GPUs), attention split by requests, experts whole": an engine's split
// in full.
[[nodiscard]] std::string describe_split(const config::RunSpec& run);
// describe_parallelism, or of a disaggregated cluster whose pools are split differently each
// pool's in full: "decode engines tensor parallel 8 (8 GPUs); prefill engines tensor parallel
// 4 (4 GPUs)".
[[nodiscard]] std::string describe_engines(const config::RunSpec& run);
// "prefill engines (tensor parallel 4)": how what refuses a prefill pool split otherwise than
// the run names it.
[[nodiscard]] std::string describe_prefill_pool(const config::RunSpec& prefill_run);
// `error`, which refused the prefill pool's run `prefill_run`, said of the pool: prefixed by
// describe_prefill_pool, at cluster.disaggregation.prefill_parallelism, whose degrees are the
// ones to change.
[[nodiscard]] ConfigError prefill_pool_error(const config::RunSpec& prefill_run,
                                             const ConfigError& error);

// MemoryPlan::requests_spread of the run.
[[nodiscard]] inline std::uint32_t requests_spread(const config::RunSpec& run) {
  return attention_split(run) == hw::AttentionSplit::kRequests ? run.tensor_parallel_degree() : 1;
}

}  // namespace kvtier::serving
