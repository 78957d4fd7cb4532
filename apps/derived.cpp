// Derived quantities shown by `presets show` and `config check`. The formulas live in
// hwmodels/; this file only picks and labels them.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "apps/report.hpp"
#include "configs/dtype.hpp"
#include "configs/pools.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/memory_plan.hpp"

namespace kvtier::app {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void model_rows(const config::ModelSpec& model, std::vector<Row>& rows) {
  const hw::ParameterCount count = hw::count_parameters(model);
  rows.push_back(integer_row("parameters", count.total, ""));
  if (model.has_moe()) {
    rows.push_back(integer_row("parameters_active_per_token", count.active, ""));
  }
  rows.push_back(integer_row("parameters_embedding", count.embedding, ""));
  // With experts, a layer of experts; the first dense layers' own count follows.
  rows.push_back(
      integer_row("parameters_per_layer",
                  count.attention_per_layer + count.mlp_per_layer + count.norms_per_layer, ""));
  if (count.dense_mlp_layers > 0) {
    rows.push_back(integer_row(
        "parameters_per_dense_layer",
        count.attention_per_layer + count.dense_mlp_per_layer + count.norms_per_layer, ""));
  }
  rows.push_back(integer_row("parameters_lm_head", count.lm_head, ""));
  rows.push_back(number_row("weight_bytes", hw::weight_bytes(model, model.weight_dtype()), "B", 0));
  // Every weight in each format, the routed experts too.
  config::ModelSpec uniform = model;
  if (uniform.has_moe()) {
    uniform.mutable_moe()->set_expert_weight_dtype(config::DTYPE_UNSPECIFIED);
  }
  for (const config::DType dtype :
       {config::FP32, config::BF16, config::FP8_E4M3, config::INT8, config::INT4}) {
    rows.push_back(number_row("weight_gib_" + std::string(config::dtype_name(dtype)),
                              hw::weight_bytes(uniform, dtype) / kGiB, "GiB", 3));
  }
  rows.push_back(number_row("kv_bytes_per_token", hw::kv_bytes_per_token(model), "B", 1));
  rows.push_back(
      number_row("kv_bytes_per_token_per_layer", hw::kv_bytes_per_token_per_layer(model), "B", 1));
  if (model.has_sliding_window()) {
    // What a token of context past the window still takes: its KV in the global layers.
    const std::uint32_t global = hw::global_attention_layers(model, model.num_hidden_layers());
    rows.push_back(integer_row("global_attention_layers", global, ""));
    rows.push_back(number_row("kv_bytes_per_token_past_window",
                              hw::kv_bytes_per_token_per_layer(model) * global, "B", 1));
  }
  rows.push_back(
      number_row("linear_flops_per_token", hw::linear_flops_per_token(model), "FLOP", 0));
  rows.push_back(number_row("attention_flops_per_context_token",
                            hw::attention_flops_per_context_token(model), "FLOP", 0));
}

void gpu_rows(const config::GpuSpec& gpu, std::vector<Row>& rows) {
  rows.push_back(number_row("memory_capacity_bytes", gpu.memory_capacity_gib() * kGiB, "B", 0));
  for (const auto& rate : gpu.compute()) {
    // Arithmetic intensity above which a kernel in this format is compute-bound.
    rows.push_back(number_row("ridge_point_" + std::string(config::dtype_name(rate.dtype())),
                              rate.dense_tflops() * 1e12 / (gpu.memory_bandwidth_gb_per_s() * 1e9),
                              "FLOP/B", 1));
  }
}

void host_rows(const config::HostSpec& host, std::vector<Row>& rows) {
  const double per_socket = host.channels_per_socket() * host.channel_bandwidth_gb_per_s();
  rows.push_back(number_row("peak_bandwidth_per_socket", per_socket, "GB/s", 1));
  rows.push_back(number_row("peak_bandwidth", per_socket * host.sockets(), "GB/s", 1));
  rows.push_back(number_row("achievable_bandwidth",
                            per_socket * host.sockets() * host.achievable_bandwidth_fraction(),
                            "GB/s", 1));
}

void link_rows(const config::LinkSpec& link, std::vector<Row>& rows) {
  rows.push_back(
      number_row("peak_per_direction", hw::peak_gb_per_s_per_direction(link), "GB/s", 2));
  const bool peer = link.kind() == config::NVLINK || link.kind() == config::NETWORK;
  for (const config::Direction direction :
       peer ? std::vector{config::PEER} : std::vector{config::H2D, config::D2H}) {
    const std::string name = config::Direction_Name(direction);
    rows.push_back(
        number_row("large_copy_" + name, hw::asymptotic_gb_per_s(link, direction), "GB/s", 2));
    rows.push_back(number_row("half_bandwidth_copy_size_" + name,
                              hw::bytes_for_efficiency(link, direction, 0.5), "B", 0));
    rows.push_back(number_row("ninety_percent_copy_size_" + name,
                              hw::bytes_for_efficiency(link, direction, 0.9), "B", 0));
  }
}

void node_rows(const config::NodeSpec& node, std::vector<Row>& rows) {
  rows.push_back(number_row("gpu_memory_total",
                            node.gpu().memory_capacity_gib() * node.gpus_per_node(), "GiB", 1));
  rows.push_back(number_row("gpu_memory_bandwidth_total",
                            node.gpu().memory_bandwidth_gb_per_s() * node.gpus_per_node(), "GB/s",
                            0));
  rows.push_back(number_row(
      "host_link_per_gpu_when_all_copy",
      hw::peak_gb_per_s_per_direction(node.host_link()) / node.gpus_per_pcie_switch(), "GB/s", 2));
}

// How one engine of the run's split holds the model: its weights and KV a GPU, the room left
// for KV and the tokens it holds. Each row's name starts with `prefix` (a pool's).
void split_rows(const config::RunSpec& run, const std::string& prefix, std::vector<Row>& rows) {
  const auto& model = run.model();
  const auto& gpu = run.hardware().node().gpu();
  const double weights_per_gpu =
      hw::weight_bytes_per_gpu(model, model.weight_dtype(), serving::parallelism(run));
  const double drafter_per_gpu = serving::drafter_weight_bytes_per_gpu(run);
  const double kv_per_token_per_gpu = serving::kv_bytes_per_token_per_gpu(run);
  const double fixed =
      weights_per_gpu + drafter_per_gpu +
      (run.memory().runtime_reserve_gib() + run.memory().activation_workspace_gib()) * kGiB;
  const double free_for_kv = gpu.memory_capacity_gib() * kGiB - fixed;
  const std::uint32_t stages = serving::pipeline_stages(run);
  if (stages > 1 || !prefix.empty() || config::pools_differ(run)) {
    rows.push_back(integer_row(prefix + "gpus_per_engine", serving::gpus_per_engine(run), "GPUs"));
  }
  if (stages > 1) {
    rows.push_back(
        integer_row(prefix + "layers_of_largest_stage", serving::layers_per_gpu(run), "layers"));
  }
  rows.push_back(number_row(prefix + "weights_per_gpu", weights_per_gpu / kGiB, "GiB", 3));
  if (drafter_per_gpu > 0.0) {
    rows.push_back(
        number_row(prefix + "drafter_weights_per_gpu", drafter_per_gpu / kGiB, "GiB", 3));
  }
  rows.push_back(number_row(prefix + "kv_bytes_per_token_per_gpu", kv_per_token_per_gpu, "B", 1));
  rows.push_back(number_row(prefix + "memory_left_for_kv_per_gpu", free_for_kv / kGiB, "GiB", 3));
  // In a paged cache the tokens of the whole blocks that fit, as serving/memory_plan sizes it.
  // With data-parallel attention a GPU holds its own requests' tokens whole.
  const double spread = serving::requests_spread(run);
  const uint64_t block = run.memory().has_kv_block_tokens() ? run.memory().kv_block_tokens() : 1;
  const uint64_t blocks =
      free_for_kv > 0
          ? static_cast<uint64_t>(std::floor(free_for_kv / (kv_per_token_per_gpu * spread * block)))
          : 0;
  rows.push_back(integer_row(prefix + "kv_tokens_that_fit_per_gpu", blocks * block, "tokens"));
  if (run.memory().has_kv_block_tokens()) {
    rows.push_back(integer_row(prefix + "kv_blocks_that_fit_per_gpu", blocks, "blocks"));
  }
  if (run.engine().expert_parallel() && model.has_moe()) {
    // What the busiest GPU's experts take over the mean share at a full batch of decoding
    // tokens: the stated imbalance, or what uniformly random routing gives.
    const hw::Parallelism parallelism = serving::parallelism(run);
    const double tokens = run.workload().max_batch_size();
    const double mean = tokens *
                        std::min(model.moe().experts_per_token(), model.moe().num_experts()) *
                        hw::experts_on_busiest_gpu(model, parallelism) / model.moe().num_experts();
    rows.push_back(integer_row(prefix + "routed_experts_on_busiest_gpu",
                               hw::experts_on_busiest_gpu(model, parallelism), "experts"));
    rows.push_back(number_row(prefix + "expert_rows_over_mean_at_max_batch",
                              hw::expert_rows_on_busiest_gpu(model, parallelism, tokens) / mean,
                              "1", 3));
  }
}

void run_rows(const config::RunSpec& run, std::vector<Row>& rows) {
  split_rows(run, "", rows);
  if (config::pools_differ(run)) {
    // The prefill engines' own (cluster.disaggregation.prefill_parallelism).
    split_rows(config::prefill_pool_run(run), "prefill_", rows);
    rows.push_back(integer_row("cluster_gpus", serving::cluster_gpus(run), "GPUs"));
  }
  model_rows(run.model(), rows);
}

}  // namespace

std::vector<Row> derived_rows(const google::protobuf::Message& message) {
  std::vector<Row> rows;
  if (const auto* model = dynamic_cast<const config::ModelSpec*>(&message)) {
    model_rows(*model, rows);
  } else if (const auto* gpu = dynamic_cast<const config::GpuSpec*>(&message)) {
    gpu_rows(*gpu, rows);
  } else if (const auto* host = dynamic_cast<const config::HostSpec*>(&message)) {
    host_rows(*host, rows);
  } else if (const auto* link = dynamic_cast<const config::LinkSpec*>(&message)) {
    link_rows(*link, rows);
  } else if (const auto* node = dynamic_cast<const config::NodeSpec*>(&message)) {
    node_rows(*node, rows);
  } else if (const auto* hardware = dynamic_cast<const config::HardwareSpec*>(&message)) {
    node_rows(hardware->node(), rows);
  } else if (const auto* run = dynamic_cast<const config::RunSpec*>(&message)) {
    run_rows(*run, rows);
  }
  return rows;
}

}  // namespace kvtier::app
