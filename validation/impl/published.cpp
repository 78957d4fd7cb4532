#include "validation/published.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <span>
#include <sstream>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

namespace kvtier::validation {
namespace {

// The node preset each GPU is measured in, with the GPU preset put in it when the part is not
// the node's own.
struct GpuNodeEntry {
  std::string_view gpu;
  std::string_view node;
  std::string_view gpu_override;
};
constexpr GpuNodeEntry kNodeOfGpu[] = {{"A100-80GB", "dgx-a100-8", ""},
                                       {"A100-40GB", "dgx-a100-8", "A100-40GB"},
                                       {"H100-SXM", "hgx-h100-8", ""},
                                       {"H200", "hgx-h200-8", ""}};

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The published name of a CUDA device name ("NVIDIA A100-SXM4-40GB" -> A100-40GB). PCIe and NVL
// boards and the GH200 superchip differ from the nodes' SXM parts in memory bandwidth, power or
// links, so they map to none rather than to a node that would time them wrongly.
std::string_view published_gpu_name(std::string_view device) {
  if (contains(device, "PCIe") || contains(device, "PCIE") || contains(device, "NVL") ||
      contains(device, "GH200")) {
    return {};
  }
  if (contains(device, "A100") && contains(device, "40GB")) {
    return "A100-40GB";
  }
  if (contains(device, "A100") && contains(device, "80GB")) {
    return "A100-80GB";
  }
  if (contains(device, "H100")) {
    return "H100-SXM";
  }
  if (contains(device, "H200")) {
    return "H200";
  }
  return {};
}

// The metric of the simulator report that corresponds to each published metric, and the unit
// the published value must be in.
struct NameMapping {
  std::string_view from;
  std::string_view to;
  std::string_view unit;
};
constexpr NameMapping kSimulatorMetric[] = {
    {"tpot_ms", "tpot_mean_ms", "ms"},
    {"ttft_ms", "ttft_mean_ms", "ms"},
    {"decode_tokens_per_s_total", "throughput_output_tokens_per_s", "tokens/s"},
    {"e2e_latency_ms", "e2e_latency_mean_ms", "ms"}};

const NameMapping* find_mapping(std::span<const NameMapping> table, std::string_view from) {
  for (const auto& entry : table) {
    if (entry.from == from) {
      return &entry;
    }
  }
  return nullptr;
}

// Host overhead per iteration by engine family (matched by prefix of the CSV's engine column).
// LMDeploy was calibrated on point lmdeploy-01 and vLLM on vllm-ci-01; TensorRT-LLM's C++
// runtime and gpt-fast's CUDA-graph decoding are taken to add none (docs/VALIDATION.md).
struct EngineOverhead {
  std::string_view prefix;
  double iteration_overhead_us;
};
constexpr EngineOverhead kEngineOverheads[] = {
    {"LMDeploy", 600}, {"TensorRT-LLM", 0}, {"gpt-fast", 0}, {"vLLM", 1750}};

// The RunSpec every point starts from; the point sets hardware, model, TP and lengths.
constexpr const char* kBaseRun = R"(
hardware { node { preset: "dgx-a100-8" } num_nodes: 1 }
model { preset: "Llama-2-7B" }
tensor_parallel_degree: 1
workload {
  closed_loop { concurrency: 1 num_requests: 1 prompt_tokens { fixed_tokens: 128 }
                output_tokens { fixed_tokens: 128 } }
  max_batch_size: 1
  prefill_chunk_tokens: 8192
}
policy { name: "full" }
memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
engine { iteration_overhead_us: 0 }
seed: 1
)";

// Appends one physical line's fields; a quoted field left open continues on the next line.
void split_csv_line(const std::string& line, bool& open_quote, std::vector<std::string>& fields) {
  std::string field = fields.empty() ? std::string() : fields.back();
  if (!fields.empty()) {
    fields.pop_back();
    field += '\n';
  }
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (open_quote) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        open_quote = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      open_quote = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  fields.push_back(field);
}

template <typename Number>
Number parse_number(const std::string& text, const std::string& column, const std::string& where) {
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) {
    throw DataError("column " + column + ": '" + text + "' is not a number", where);
  }
  return value;
}

}  // namespace

std::optional<GpuNode> node_for_gpu(std::string_view gpu) {
  for (const std::string_view name : {gpu, published_gpu_name(gpu)}) {
    for (const auto& entry : kNodeOfGpu) {
      if (!name.empty() && entry.gpu == name) {
        return GpuNode{std::string(entry.node), std::string(entry.gpu_override)};
      }
    }
  }
  return std::nullopt;
}

std::vector<PublishedPoint> read_published(const std::string& path) {
  InputText input = read_input_file(path, kTextInputLimitBytes);
  if (input.status == InputText::Status::kFolder) {
    throw DataError("a folder, not a published-measurements CSV file", path);
  }
  if (input.status == InputText::Status::kTooLarge) {
    throw DataError("larger than " + input_limit_text(kTextInputLimitBytes) +
                        ": not a published-measurements CSV file",
                    path);
  }
  if (input.status != InputText::Status::kRead) {
    throw DataError("cannot open published-measurements file", path);
  }
  std::istringstream in(std::move(input.text));
  std::vector<std::string> header;
  std::vector<PublishedPoint> points;
  std::string line;
  int number = 0;
  int record_line = 0;
  bool open_quote = false;
  std::vector<std::string> fields;
  while (std::getline(in, line)) {
    ++number;
    if (!open_quote) {
      fields.clear();
      record_line = number;
    }
    split_csv_line(line, open_quote, fields);
    if (open_quote) {
      continue;  // a quoted field spans lines
    }
    const std::string where = path + ":" + std::to_string(record_line);
    if (header.empty()) {
      header = fields;
      continue;
    }
    if (fields.size() != header.size()) {
      throw DataError("expected " + std::to_string(header.size()) + " fields, found " +
                          std::to_string(fields.size()),
                      where);
    }
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size(); ++i) {
      row[header[i]] = fields[i];
    }
    for (const char* column :
         {"id", "gpu", "tensor_parallel", "model", "batch_size", "metric", "value"}) {
      if (row.count(column) == 0 || row[column].empty()) {
        throw DataError(std::string("missing column ") + column, where);
      }
    }
    PublishedPoint point;
    point.id = row["id"];
    point.source_title = row["source_title"];
    point.source_url = row["source_url"];
    point.gpu = row["gpu"];
    point.tensor_parallel =
        parse_number<std::uint32_t>(row["tensor_parallel"], "tensor_parallel", where);
    point.model = row["model"];
    point.batch_size = parse_number<std::uint32_t>(row["batch_size"], "batch_size", where);
    if (point.tensor_parallel == 0 || point.batch_size == 0) {
      throw DataError("columns tensor_parallel and batch_size must be at least 1", where);
    }
    if (!row["prompt_tokens"].empty()) {
      point.prompt_tokens =
          parse_number<std::uint64_t>(row["prompt_tokens"], "prompt_tokens", where);
    }
    if (!row["output_tokens"].empty()) {
      point.output_tokens =
          parse_number<std::uint64_t>(row["output_tokens"], "output_tokens", where);
    }
    point.metric = row["metric"];
    point.value = parse_number<double>(row["value"], "value", where);
    // A measured time or rate: NaN, infinities and signs would reach the report as errors of
    // no meaning (and `nan` into its JSON).
    if (!(point.value > 0.0) || !std::isfinite(point.value)) {
      throw DataError("column value: '" + row["value"] + "' is not a positive finite number",
                      where);
    }
    // A value in another unit than its metric's would be compared as if it were in it.
    if (const NameMapping* mapping = find_mapping(kSimulatorMetric, point.metric);
        mapping != nullptr && row["unit"] != mapping->unit) {
      throw DataError("column unit: '" + row["unit"] + "' is not the unit of " + point.metric +
                          " (" + std::string(mapping->unit) + ")",
                      where);
    }
    point.weight_dtype = row["weight_dtype"];
    // The simulator runs one engine of tensor_parallel GPUs; more GPUs are replicas it does not.
    point.num_gpus = point.tensor_parallel;
    if (!row["num_gpus"].empty()) {
      point.num_gpus = parse_number<std::uint32_t>(row["num_gpus"], "num_gpus", where);
      if (point.num_gpus < point.tensor_parallel) {
        throw DataError("column num_gpus: " + row["num_gpus"] + " is fewer than tensor_parallel " +
                            row["tensor_parallel"],
                        where);
      }
    }
    point.engine = row["engine"];
    point.where = where;
    points.push_back(std::move(point));
  }
  if (open_quote) {
    throw DataError("unterminated quoted field", path + ":" + std::to_string(record_line));
  }
  if (in.bad()) {
    throw DataError("cannot read published-measurements file", path);
  }
  if (points.empty()) {
    throw DataError(header.empty() ? "empty: no header and no measurements"
                                   : "holds a header and no measurements",
                    path);
  }
  return points;
}

Projection project(const PublishedPoint& point, const config::ConfigLoader& loader) {
  Projection projection;
  projection.point = point;
  const std::optional<GpuNode> node = node_for_gpu(point.gpu);
  const NameMapping* metric = find_mapping(kSimulatorMetric, point.metric);
  if (!node) {
    projection.skipped_because = "no node preset for GPU " + point.gpu;
    return projection;
  }
  if (metric == nullptr) {
    projection.skipped_because = "metric " + point.metric + " has no simulator counterpart";
    return projection;
  }
  if (point.prompt_tokens == 0 || point.output_tokens == 0) {
    projection.skipped_because = "the source does not state the prompt and output lengths";
    return projection;
  }
  if (point.num_gpus != point.tensor_parallel) {
    projection.skipped_because = std::to_string(point.num_gpus) + " GPUs at tensor parallelism " +
                                 std::to_string(point.tensor_parallel) +
                                 ": the simulator runs one engine, not replicas";
    return projection;
  }
  projection.simulator_metric = std::string(metric->to);
  const std::string batch = std::to_string(point.batch_size);
  std::vector<config::Override> overrides;
  for (const std::string& set :
       {"hardware.node.preset=" + node->node, "model.preset=" + point.model,
        "tensor_parallel_degree=" + std::to_string(point.tensor_parallel),
        "workload.closed_loop.concurrency=" + batch, "workload.closed_loop.num_requests=" + batch,
        "workload.max_batch_size=" + batch,
        "workload.closed_loop.prompt_tokens.fixed_tokens=" + std::to_string(point.prompt_tokens),
        "workload.closed_loop.output_tokens.fixed_tokens=" + std::to_string(point.output_tokens),
        // Long prompts are prefilled whole, as the static benchmarks measured them.
        "workload.prefill_chunk_tokens=" + std::to_string(std::max<std::uint64_t>(
                                               8192, point.prompt_tokens * point.batch_size))}) {
    overrides.push_back(config::parse_override(set));
  }
  for (const auto& engine : kEngineOverheads) {
    if (point.engine.rfind(engine.prefix, 0) == 0) {
      overrides.push_back(config::parse_override("engine.iteration_overhead_us=" +
                                                 std::to_string(engine.iteration_overhead_us)));
    }
  }
  if (!node->gpu.empty()) {
    overrides.push_back(config::parse_override("hardware.node.gpu.preset=" + node->gpu));
  }
  // The checkpoint's storage format as measured (an unknown one fails below, naming the row).
  if (!point.weight_dtype.empty()) {
    overrides.push_back(config::parse_override("model.weight_dtype=" + point.weight_dtype));
  }
  config::RunSpec run;
  try {
    (void)loader.load_text(kBaseRun, "validation/published", run, overrides);
  } catch (const Error& error) {
    // The row's values, not the overrides made of them, are what the user can mend.
    throw DataError("row " + point.id + " cannot be simulated: " + std::string(error.what()),
                    point.where);
  }
  const serving::SimulationReport report = serving::simulate(run);
  for (const auto& entry : report.metrics) {
    if (entry.name == projection.simulator_metric) {
      projection.simulated = entry.value;
      projection.projected = true;
      projection.relative_error = (entry.value - point.value) / point.value;
    }
  }
  if (!projection.projected) {
    projection.skipped_because = "the simulation reported no " + projection.simulator_metric;
  }
  return projection;
}

}  // namespace kvtier::validation
