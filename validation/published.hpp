#pragma once
// Published measurements of LLM serving (validation/published/*.csv, each row citing its
// source) and the simulator's projection of each: the same model, GPU, tensor parallelism,
// batch and lengths, and the metric the source reports.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "configs/loader.hpp"

namespace kvtier::validation {

struct PublishedPoint {
  std::string id;
  std::string source_title;
  std::string source_url;
  std::string gpu;
  std::uint32_t tensor_parallel = 0;
  std::string model;
  std::uint32_t batch_size = 0;
  std::uint64_t prompt_tokens = 0;  // 0 when the source does not say
  std::uint64_t output_tokens = 0;
  std::string metric;  // tpot_ms, ttft_ms, decode_tokens_per_s_total, e2e_latency_ms
  double value = 0.0;  // in the metric's unit (ms or tokens/s; the CSV's unit column must say so)
  std::string weight_dtype;    // the model's weight_dtype as measured; empty: the preset's
  std::uint32_t num_gpus = 0;  // ≥ tensor_parallel; more are replicas (not simulated: skipped)
  std::string engine;
  std::string where;  // "FILE:LINE" of its row, for errors found when it is projected
};

// Reads the CSV (RFC 4180 quoting). A malformed row, a value that is not a positive finite
// number, a count below 1, a unit that is not its metric's, fewer GPUs than the tensor
// parallelism, or a file without rows is a DataError naming file (and line).
[[nodiscard]] std::vector<PublishedPoint> read_published(const std::string& path);

struct Projection {
  PublishedPoint point;
  bool projected = false;
  std::string skipped_because;  // set when not projected
  std::string simulator_metric;
  double simulated = 0.0;
  double relative_error = 0.0;  // (simulated − published) / published
};

// The node preset a GPU is measured in (A100 → dgx-a100-8, H100 → hgx-h100-8, H200 →
// hgx-h200-8) and the GPU preset that replaces the node's own when the part differs
// (A100-40GB; empty otherwise). `gpu` is a published name ("H100-SXM") or a CUDA device name
// ("NVIDIA H100 80GB HBM3", kernels/device_info.hpp). nullopt for a GPU no node preset holds.
struct GpuNode {
  std::string node;
  std::string gpu;
};
[[nodiscard]] std::optional<GpuNode> node_for_gpu(std::string_view gpu);

// Runs the serving simulation for the point. `base_run` is a RunSpec text the point's
// hardware, model and workload are set on with overrides.
[[nodiscard]] Projection project(const PublishedPoint& point, const config::ConfigLoader& loader);

}  // namespace kvtier::validation
