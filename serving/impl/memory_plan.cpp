#include "serving/memory_plan.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/pools.hpp"
#include "hwmodels/model_shape.hpp"

namespace kvtier::serving {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  return format_fixed(bytes / kGiB, 2) + " GiB";
}

}  // namespace

std::string describe_split(const config::RunSpec& run) {
  const std::uint32_t gpus = gpus_per_engine(run);
  return describe_parallelism(run) + " (" + std::to_string(gpus) +
         (gpus == 1 ? " GPU)" : " GPUs)") +
         (attention_split(run) == hw::AttentionSplit::kRequests
              ? std::string(", attention split by requests")
              : std::string()) +
         (run.engine().expert_parallel() ? std::string(", experts whole") : std::string());
}

std::string describe_engines(const config::RunSpec& run) {
  if (!config::pools_differ(run)) {
    return describe_parallelism(run);
  }
  return "decode engines " + describe_split(run) + "; prefill engines " +
         describe_split(config::prefill_pool_run(run));
}

std::string describe_prefill_pool(const config::RunSpec& prefill_run) {
  return "prefill engines (" + describe_parallelism(prefill_run) + ")";
}

ConfigError prefill_pool_error(const config::RunSpec& prefill_run, const ConfigError& error) {
  return ConfigError(describe_prefill_pool(prefill_run) + ": " + error.what(),
                     "field cluster.disaggregation.prefill_parallelism; " + error.where());
}

std::uint64_t MemoryPlan::held_tokens(std::uint64_t tokens) const {
  return window_tokens > 0 ? std::min(tokens, window_tokens) : tokens;
}

std::uint64_t MemoryPlan::allocated_tokens(std::uint64_t tokens) const {
  if (block_tokens == 0 || tokens == 0) {
    return held_tokens(tokens);
  }
  const std::uint64_t block = block_tokens;
  if (window_tokens == 0 || tokens <= window_tokens) {
    return (tokens + block - 1) / block * block;
  }
  // Positions [tokens - window, tokens): the blocks from the first's to the last's.
  const std::uint64_t first = tokens - window_tokens;
  return ((tokens - 1) / block - first / block + 1) * block;
}

std::uint64_t MemoryPlan::peak_allocated_tokens(std::uint64_t tokens) const {
  if (block_tokens == 0 || window_tokens == 0 || tokens <= window_tokens) {
    return allocated_tokens(tokens);  // never shrinks as the context grows
  }
  // A window of W positions starting at s spans q + 1 blocks, or q + 2 when s's offset in its
  // block is at least B - r (W - 1 = qB + r, 0 < r): first at s = B - r, which the window
  // reaches once the context is W + B - r tokens. Starts go from 0 (context W) to tokens - W.
  const std::uint64_t block = block_tokens;
  const std::uint64_t q = (window_tokens - 1) / block;
  const std::uint64_t r = (window_tokens - 1) % block;
  const bool straddles = r > 0 && tokens - window_tokens >= block - r;
  return (q + (straddles ? 2 : 1)) * block;
}

double MemoryPlan::mixed_places(std::uint64_t windowed, std::uint64_t tokens) const {
  const std::uint64_t whole =
      block_tokens == 0 ? tokens : (tokens + block_tokens - 1) / block_tokens * block_tokens;
  return global_layer_share * static_cast<double>(whole) +
         (1.0 - global_layer_share) * static_cast<double>(windowed);
}

double MemoryPlan::kv_bytes_for(std::uint64_t tokens) const {
  if (global_layer_share > 0.0) {
    return mixed_places(allocated_tokens(tokens), tokens) * kv_bytes_per_token;
  }
  return static_cast<double>(allocated_tokens(tokens)) * kv_bytes_per_token;
}

double MemoryPlan::peak_kv_bytes_for(std::uint64_t tokens) const {
  if (global_layer_share > 0.0) {
    // The global layers' blocks only grow.
    return mixed_places(peak_allocated_tokens(tokens), tokens) * kv_bytes_per_token;
  }
  return static_cast<double>(peak_allocated_tokens(tokens)) * kv_bytes_per_token;
}

double MemoryPlan::most_over(std::uint64_t fewest, std::uint64_t most,
                             double (MemoryPlan::*bytes)(std::uint64_t) const) const {
  double held = (this->*bytes)(most);
  for (std::uint64_t tokens = fewest; tokens < most; ++tokens) {
    held = std::max(held, (this->*bytes)(tokens));
  }
  return held;
}

double MemoryPlan::most_kv_bytes_for(std::uint64_t fewest, std::uint64_t most) const {
  return most_over(fewest, most, &MemoryPlan::kv_bytes_for);
}

double MemoryPlan::most_untiered_kv_bytes_for(std::uint64_t fewest, std::uint64_t most) const {
  return most_over(fewest, most, &MemoryPlan::untiered_kv_bytes_for);
}

double MemoryPlan::written_places(double tokens) const {
  if (global_layer_share == 0.0) {
    return tokens;
  }
  return global_layer_share * tokens +
         (1.0 - global_layer_share) * std::min(tokens, static_cast<double>(window_tokens));
}

double MemoryPlan::windowed_model_kv_bytes(std::uint64_t places) const {
  if (global_layer_share == 0.0) {
    return 0.0;
  }
  return static_cast<double>(places) * kv_bytes_per_token * (1.0 - drafter_kv_share) *
         (1.0 - global_layer_share);
}

std::vector<std::uint32_t> tiered_layers(const config::RunSpec& run) {
  const config::ModelSpec& model = run.model();
  std::vector<std::uint32_t> layers;
  for (std::uint32_t layer = 0; layer < model.num_hidden_layers(); ++layer) {
    if (!hw::has_hybrid_attention(model) || hw::attends_globally(model, layer)) {
      layers.push_back(layer);
    }
  }
  return layers;
}

std::vector<std::uint32_t> tiered_layer_stages(const config::RunSpec& run) {
  const std::vector<std::uint32_t> stage_of_layer =
      hw::pipeline_stage_of_layers(run.model().num_hidden_layers(), pipeline_stages(run));
  std::vector<std::uint32_t> stages;
  for (const std::uint32_t layer : tiered_layers(run)) {
    stages.push_back(stage_of_layer[layer]);
  }
  return stages;
}

std::uint32_t most_tiered_layers_of_a_stage(
    const std::vector<std::uint32_t>& stage_of_tiered_layer) {
  std::vector<std::uint32_t> layers(
      stage_of_tiered_layer.empty() ? 1 : stage_of_tiered_layer.back() + 1, 0);
  for (const std::uint32_t stage : stage_of_tiered_layer) {
    ++layers[stage];
  }
  return *std::max_element(layers.begin(), layers.end());
}

std::uint32_t kv_block_tokens(const config::RunSpec& run) {
  return run.memory().has_kv_block_tokens() ? run.memory().kv_block_tokens() : 0;
}

double in_whole_blocks(double tokens, std::uint32_t block_tokens) {
  if (block_tokens == 0) {
    return tokens;
  }
  // A projected share computed as a · (c − 1) / P + 1 may land a few ulps past a block's end
  // when it is that end exactly; it must not take a block more.
  constexpr double kUlpsOfBlocks = 1e-9;
  const double block = block_tokens;
  return std::ceil(tokens / block - kUlpsOfBlocks) * block;
}

std::string MemoryPlan::breakdown() const {
  return "weights " + gib(weights_bytes) +
         (drafter_weights_bytes > 0.0 ? " + drafter " + gib(drafter_weights_bytes)
                                      : std::string()) +
         " + workspace " + gib(workspace_bytes) + " + reserve " + gib(reserve_bytes) + " = " +
         gib(weights_bytes + drafter_weights_bytes + workspace_bytes + reserve_bytes) + " of " +
         gib(capacity_bytes) + " per GPU";
}

std::uint32_t drafter_layers(const config::RunSpec& run) {
  const auto& engine = run.engine();
  return engine.has_speculative() && engine.speculative().draft_tokens() > 0
             ? engine.speculative().draft_layers()
             : 0;
}

double drafter_weight_bytes_per_gpu(const config::RunSpec& run) {
  const std::uint32_t layers = drafter_layers(run);
  if (layers == 0) {
    return 0.0;
  }
  const auto& model = run.model();
  config::ModelSpec with_drafter = model;
  with_drafter.set_num_hidden_layers(model.num_hidden_layers() + layers);
  // Its layers over the tensor-parallel group, whatever stage holds them: counted on every GPU
  // (a pipelined prefill pool's, whose engines hold a drafter they never run).
  hw::Parallelism split = parallelism(run);
  split.pipeline_stages = 1;
  return hw::weight_bytes_per_gpu(with_drafter, model.weight_dtype(), split) -
         hw::weight_bytes_per_gpu(model, model.weight_dtype(), split);
}

double kv_bytes_per_token_per_gpu(const config::RunSpec& run) {
  const auto& model = run.model();
  const uint32_t tp = run.tensor_parallel_degree();
  const double per_layer =
      hw::kv_bytes_per_token_per_layer_per_gpu(model, tp, attention_split(run));
  const double drafter = per_layer * drafter_layers(run);
  if (pipeline_stages(run) == 1) {
    return hw::kv_bytes_per_token_per_gpu(model, tp, attention_split(run)) + drafter;
  }
  return per_layer * layers_per_gpu(run) + drafter;
}

MemoryPlan plan_memory(const config::RunSpec& run) {
  const auto& model = run.model();
  MemoryPlan plan;
  plan.capacity_bytes = run.hardware().node().gpu().memory_capacity_gib() * kGiB;
  plan.weights_bytes = hw::weight_bytes_per_gpu(model, model.weight_dtype(), parallelism(run));
  plan.workspace_bytes = run.memory().activation_workspace_gib() * kGiB;
  plan.reserve_bytes = run.memory().runtime_reserve_gib() * kGiB;
  plan.drafter_weights_bytes = drafter_weight_bytes_per_gpu(run);
  plan.kv_bytes_per_token = kv_bytes_per_token_per_gpu(run);
  plan.drafter_kv_share = static_cast<double>(drafter_layers(run)) /
                          static_cast<double>(layers_per_gpu(run) + drafter_layers(run));
  const std::uint32_t stages = pipeline_stages(run);
  plan.requests_spread = requests_spread(run);
  plan.window_tokens = model.has_sliding_window() ? model.sliding_window() : 0;
  if (hw::has_hybrid_attention(model)) {
    plan.global_layer_share =
        static_cast<double>(hw::global_attention_layers(model, model.num_hidden_layers())) /
        model.num_hidden_layers();
  }
  const auto& node = run.hardware().node();
  // Every GPU's T1/T2 holds what its HBM would (its share of the KV heads, or with latent
  // attention its own copy of the latents), so each GPU gets its share of the DDR
  // (configs/impl/consistency.cpp keeps the swap space below it).
  const auto& admission = run.workload().on_demand_admission();
  plan.swap_space_bytes = admission.has_swap() ? admission.swap().space_gib() * kGiB : 0.0;
  plan.prefix_host_bytes = run.memory().prefix_cache_host_gib() * kGiB;
  plan.block_tokens = kv_block_tokens(run);
  if (plan.block_tokens > 0) {
    // As vLLM sizes its caches: the whole blocks the memory given holds (below, HBM's too).
    plan.swap_space_bytes =
        std::floor(plan.swap_space_bytes / plan.block_bytes()) * plan.block_bytes();
    plan.prefix_host_bytes =
        std::floor(plan.prefix_host_bytes / plan.block_bytes()) * plan.block_bytes();
  }
  plan.host_kv_capacity_bytes = node.host().capacity_gib() * kGiB / node.gpus_per_node() -
                                plan.swap_space_bytes - plan.prefix_host_bytes;
  if (plan.host_kv_capacity_bytes < 0.0) {
    throw ConfigError(plan.swap_space_bytes > 0.0
                          ? "swap space " + gib(plan.swap_space_bytes) +
                                " per GPU exceeds the GPU's share of host " + node.host().name()
                          : "the prefix cache's host tier " + gib(plan.prefix_host_bytes) +
                                " per GPU exceeds the GPU's share of host " + node.host().name(),
                      plan.swap_space_bytes > 0.0
                          ? "field workload.on_demand_admission.swap.space_gib"
                          : "field memory.prefix_cache_host_gib");
  }
  plan.kv_capacity_bytes = plan.capacity_bytes - plan.weights_bytes - plan.drafter_weights_bytes -
                           plan.workspace_bytes - plan.reserve_bytes;
  if (plan.block_tokens > 0 && plan.kv_capacity_bytes > 0.0) {
    plan.kv_capacity_bytes =
        std::floor(plan.kv_capacity_bytes / plan.block_bytes()) * plan.block_bytes();
  }
  if (plan.kv_capacity_bytes <= 0.0) {
    // Advice the hardware can take: a higher degree where the node has the GPUs for one, or
    // over more nodes where its GPUs share an NVLink switch.
    std::string advice;
    if (2 * gpus_per_engine(run) <= node.gpus_per_node()) {
      advice = "raise the TP degree";
    } else if (node.gpu_interconnect() == config::NVLINK_SWITCH) {
      advice =
          "raise the TP degree over more nodes (hardware.num_nodes, hardware.network) or split "
          "the layers into pipeline stages (pipeline_parallel_degree)";
    } else {
      advice = "node " + node.name() + " has " + std::to_string(node.gpus_per_node()) +
               " GPU(s): use a node with more GPUs";
    }
    throw ConfigError(
        "nothing can run: " + plan.breakdown() + ", leaving no room for the KV cache (" +
            model.name() + " at tensor_parallel_degree " +
            std::to_string(run.tensor_parallel_degree()) +
            (stages > 1 ? " x pipeline_parallel_degree " + std::to_string(stages) : std::string()) +
            "; " + advice + " or use a GPU with more memory)",
        "model " + model.name() + " on " + run.hardware().node().gpu().name());
  }
  return plan;
}

}  // namespace kvtier::serving
