// Live measurement files against the simulator (validation/live.hpp, docs/VALIDATION.md).
#include "validation/live.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "common/text_output.hpp"
#include "configs/parse.hpp"
#include "configs/schema/measurement.pb.h"
#include "configs/schema/run.pb.h"
#include "configs/validate.hpp"
#include "replay/parameters.hpp"
#include "serving/simulation.hpp"
#include "validation/published.hpp"

namespace kvtier::validation {
namespace {

namespace fs = std::filesystem;

// The figures of a live file and their default tolerances: byte volumes do not depend on the
// hardware and the simulator is built to match them byte for byte (0); times are held to the
// project's target of 10%.
struct Figure {
  std::string_view metric;
  double tolerance;
  bool timing;
  int decimals;
};
constexpr std::array<Figure, 7> kFigures = {{{"pcie_h2d_bytes", 0.0, false, 0},
                                             {"pcie_d2h_bytes", 0.0, false, 0},
                                             {"host_recode_bytes", 0.0, false, 0},
                                             {"tpot_mean_ms", 0.1, true, 3},
                                             {"pcie_h2d_busy_s", 0.1, true, 6},
                                             {"pcie_d2h_busy_s", 0.1, true, 6},
                                             {"host_recode_busy_s", 0.1, true, 6}}};

// The node a byte-only comparison is simulated on: byte volumes are the same on every node.
constexpr std::string_view kBytesNode = "hgx-h100-8";

// One request of the live run, as tests/cli/test_live_cli.cpp's copy volumes simulate it: the
// trace's demand prefetched one layer ahead from pinned memory, no host overhead per iteration
// and no reserve (it would only shrink HBM, which one small request does not reach). Hardware
// (the GPU's node, cut to that one GPU), model, KV dtype, lengths, policy and trace are set per
// file.
constexpr const char* kBaseRun = R"(
name: "live measurement"
hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
model { preset: "stories260K" }
tensor_parallel_degree: 1
workload {
  closed_loop { concurrency: 1 num_requests: 1 prompt_tokens { fixed_tokens: 1 }
                output_tokens { fixed_tokens: 1 } }
  max_batch_size: 1
  prefill_chunk_tokens: 2048
}
policy { name: "full" }
tiering { prefetch_lookahead_layers: 1 host_allocation: PINNED copy_method: SM_KERNELS }
memory { runtime_reserve_gib: 0 activation_workspace_gib: 0 }
engine { iteration_overhead_us: 0 }
seed: 1
)";

// Reads one live file, its fields' positions kept for diagnostics.
class LiveFile {
 public:
  LiveFile(const std::string& path, const std::string& text) : path_(path), locations_(path) {
    try {
      config::parse_config(text, path, measurement_, locations_);
    } catch (const ConfigError& error) {
      // Protobuf's JSON messages may quote the input over several lines; one line is kept.
      const std::string what(error.what());
      throw DataError(
          "not a live measurement (LiveMeasurement JSON): " + what.substr(0, what.find('\n')),
          error.where());
    }
  }

  [[nodiscard]] const config::LiveMeasurement& operator*() const { return measurement_; }
  [[nodiscard]] const config::LiveMeasurement* operator->() const { return &measurement_; }
  [[nodiscard]] const std::string& path() const { return path_; }

  // "FILE:LINE:COLUMN, field PATH" where the field was written, else "FILE, field PATH".
  [[nodiscard]] std::string where(const std::string& field) const {
    return config::describe(locations_.nearest(field)) + ", field " + field;
  }
  [[noreturn]] void fail(const std::string& what, const std::string& field) const {
    throw DataError(what, where(field));
  }

 private:
  std::string path_;
  config::LocationMap locations_;
  config::LiveMeasurement measurement_;
};

// What the comparison reads must be there; `kvtier live` writes every field.
void check_fields(const LiveFile& file) {
  const config::LiveMeasurement& m = *file;
  if (m.format_version() != 1) {
    file.fail("format_version " + std::to_string(m.format_version()) +
                  " is not one this kvtier reads (1)",
              "format_version");
  }
  if (m.provenance().device() != "cpu" && m.provenance().device() != "cuda") {
    file.fail("device '" + m.provenance().device() + "' is neither cpu nor cuda",
              "provenance.device");
  }
  for (const auto& [present, field] :
       {std::pair{!m.provenance().model().empty(), "provenance.model"},
        std::pair{!m.policy().empty(), "policy"}, std::pair{m.prompt_tokens() > 0, "prompt_tokens"},
        std::pair{m.new_tokens() > 0, "new_tokens"}, std::pair{m.has_h2d(), "h2d"},
        std::pair{m.has_d2h(), "d2h"}}) {
    if (!present) {
      file.fail("missing or zero, and the comparison needs it", field);
    }
  }
  // Threads share a step's recodes as their pool hands them out: more than one needs its shape.
  if (m.recode_threads() > 1) {
    for (const auto& [present, field] :
         {std::pair{m.has_recode_chunk_token_layers(), "recode_chunk_token_layers"},
          std::pair{m.has_recode_parallel_min_values(), "recode_parallel_min_values"}}) {
      if (!present) {
        file.fail("missing: recode_threads " + std::to_string(m.recode_threads()) +
                      " needs how the threads shared the recodes",
                  field);
      }
    }
  }
  if (m.has_recode_chunk_token_layers() && m.recode_chunk_token_layers() == 0) {
    file.fail("a chunk holds 1 token-layer or more", "recode_chunk_token_layers");
  }
  for (const auto& [seconds, field] :
       {std::pair{m.decode_seconds(), "decode_seconds"},
        std::pair{m.h2d().seconds(), "h2d.seconds"}, std::pair{m.d2h().seconds(), "d2h.seconds"},
        std::pair{m.host_recode().seconds(), "host_recode.seconds"}}) {
    if (!std::isfinite(seconds) || seconds < 0.0) {
      file.fail("a time is a finite number of seconds, 0 or more", field);
    }
  }
}

// Each figure's tolerance: the defaults, replaced by the file's `tolerances`.
std::array<double, kFigures.size()> tolerances(const LiveFile& file) {
  std::array<double, kFigures.size()> result{};
  std::array<bool, kFigures.size()> given{};
  for (std::size_t i = 0; i < kFigures.size(); ++i) {
    result[i] = kFigures[i].tolerance;
  }
  for (int t = 0; t < file->tolerances_size(); ++t) {
    const config::FigureTolerance& tolerance = file->tolerances(t);
    const std::string field = "tolerances[" + std::to_string(t) + "]";
    const auto* figure = std::find_if(kFigures.begin(), kFigures.end(), [&](const Figure& f) {
      return f.metric == tolerance.metric();
    });
    if (figure == kFigures.end()) {
      file.fail("no figure '" + tolerance.metric() +
                    "'; a live file has pcie_h2d_bytes, pcie_d2h_bytes, host_recode_bytes, "
                    "tpot_mean_ms, pcie_h2d_busy_s, pcie_d2h_busy_s and host_recode_busy_s",
                field + ".metric");
    }
    const auto index = static_cast<std::size_t>(figure - kFigures.begin());
    if (given[index]) {
      file.fail("a second tolerance for " + tolerance.metric(), field + ".metric");
    }
    if (!tolerance.has_relative() || !std::isfinite(tolerance.relative()) ||
        tolerance.relative() < 0.0) {
      file.fail("a tolerance is a relative error of 0 or more (0.1 is 10%)", field + ".relative");
    }
    given[index] = true;
    result[index] = tolerance.relative();
  }
  return result;
}

// The items of device_detail ("sm_90, 132 SMs, driver 13.0, bf16, split-keys attention, ..."),
// trimmed.
std::vector<std::string> detail_items(const config::LiveMeasurement& m) {
  std::vector<std::string> items;
  std::istringstream text(m.provenance().device_detail());
  for (std::string item; std::getline(text, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    items.push_back(item);
  }
  return items;
}

// How the live cache copied: the copy engines when device_detail says so, else kernels (the
// only way before `--cuda-copies`).
bool copied_with_copy_engines(const config::LiveMeasurement& m) {
  const std::vector<std::string> items = detail_items(m);
  return std::find(items.begin(), items.end(), "copy-engines copies") != items.end();
}

// The KV element the live run stored: float32 on the CPU backend, the compute dtype on CUDA
// (an item of device_detail, e.g. "sm_90, 132 SMs, driver 13.0, bf16, per-head attention";
// bf16, the engine's default, when it names none).
std::string kv_dtype(const config::LiveMeasurement& m) {
  if (m.provenance().device() == "cpu") {
    return "FP32";
  }
  for (const std::string& item : detail_items(m)) {
    for (const auto& [name, dtype] : {std::pair{"fp32", "FP32"}, std::pair{"fp16", "FP16"}}) {
      if (item == name) {
        return dtype;
      }
    }
  }
  return "BF16";
}

// The followed trace: an absolute path as written, a relative one from the file's folder (so a
// committed file and its trace resolve on any clone, whatever the working directory).
std::string followed_trace(const LiveFile& file) {
  fs::path trace = file->follow_trace();
  if (trace.is_relative()) {
    trace = (fs::path(file.path()).parent_path() / trace).lexically_normal();
  }
  std::error_code error;
  if (!fs::is_regular_file(trace, error)) {
    file.fail("the followed trace " + trace.string() + " does not exist", "follow_trace");
  }
  return trace.string();
}

double relative_error(double projected, double measured) {
  if (measured == 0.0) {
    return projected == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return (projected - measured) / measured;
}

// The simulation of the live run's request on `node`.
serving::SimulationReport simulate(const LiveFile& file, const std::string& model,
                                   const std::string& trace, const GpuNode& node,
                                   double engine_overhead_us, const config::ConfigLoader& loader) {
  const config::LiveMeasurement& m = *file;
  // The run's token counts are 32-bit fields (and the simulator's output count is N + 1).
  constexpr std::uint64_t kMostTokens = 0xFFFFFFFEULL;
  if (m.prompt_tokens() > kMostTokens) {
    file.fail("prompt_tokens " + std::to_string(m.prompt_tokens()) + " is more than a run holds",
              "prompt_tokens");
  }
  if (m.new_tokens() > kMostTokens) {
    file.fail("new_tokens " + std::to_string(m.new_tokens()) + " is more than a run holds",
              "new_tokens");
  }
  std::vector<config::Override> overrides;
  for (const std::string& set :
       {"hardware.node.preset=" + node.node, "model.preset=" + model,
        "model.kv_dtype=" + kv_dtype(m),
        "workload.closed_loop.prompt_tokens.fixed_tokens=" + std::to_string(m.prompt_tokens()),
        // The simulator's first output token comes from the prefill, so N decode steps of the
        // live run (each a trace step) are N + 1 output tokens.
        "workload.closed_loop.output_tokens.fixed_tokens=" + std::to_string(m.new_tokens() + 1),
        // The live run prefills its prompt in one pass.
        "workload.prefill_chunk_tokens=" +
            std::to_string(std::max<std::uint64_t>(2048, m.prompt_tokens()))}) {
    overrides.push_back(config::parse_override(set));
  }
  if (!node.gpu.empty()) {
    overrides.push_back(config::parse_override("hardware.node.gpu.preset=" + node.gpu));
  }
  // A live run is one process on one GPU: its copies had the host link to themselves, while the
  // node presets assume every GPU copying at once, GPUs behind one PCIe switch sharing its
  // uplink (serving/tier_timing.hpp). So the run is simulated on a node of that one GPU.
  for (const char* lone :
       {"hardware.node.gpus_per_node=1", "hardware.node.gpus_per_pcie_switch=1"}) {
    overrides.push_back(config::parse_override(lone));
  }
  if (m.provenance().device() == "cuda") {
    // The CUDA engine keeps its weights and runs its GEMMs in the compute dtype too.
    overrides.push_back(config::parse_override("model.weight_dtype=" + kv_dtype(m)));
    overrides.push_back(config::parse_override("model.activation_dtype=" + kv_dtype(m)));
    // The live cache moves its tiers with kernels over mapped host memory unless it was told
    // to use the copy engines (docs/LIVE.md).
    overrides.push_back(config::parse_override(copied_with_copy_engines(m)
                                                   ? "tiering.copy_method=COPY_ENGINES"
                                                   : "tiering.copy_method=SM_KERNELS"));
    // Layers the cache staged ahead (files before the field staged one, the base run's).
    if (m.has_staging_lookahead_layers()) {
      overrides.push_back(config::parse_override("tiering.prefetch_lookahead_layers=" +
                                                 std::to_string(m.staging_lookahead_layers())));
    }
  }
  if (engine_overhead_us > 0.0) {
    overrides.push_back(config::parse_override("engine.iteration_overhead_us=" +
                                               format_double(engine_overhead_us)));
  }
  config::RunSpec run;
  config::LocationMap locations(file.path());
  try {
    locations =
        loader.resolve_text(kBaseRun, "the simulated run of " + file.path(), run, overrides);
  } catch (const ConfigError& error) {
    // The overrides carry the file's values: what they break is the file's, so data.
    throw DataError("cannot be simulated: " + std::string(error.what()), file.path());
  }
  try {
    *run.mutable_policy() = replay::parse_policy_string(m.policy());
  } catch (const ConfigError& error) {
    file.fail(error.what(), "policy");
  }
  run.mutable_tiering()->add_traces(trace);
  // The cache recodes T1 <-> T2 tokens on the host between steps, on the step's path; timed
  // where the node's host has recode rates (files before the field recoded on one thread, where
  // how a pool hands out its work does not matter: check_fields).
  if (run.hardware().node().host().has_kv_recode()) {
    config::HostRecodeSpec& recode = *run.mutable_tiering()->mutable_host_recode();
    recode.set_threads(m.has_recode_threads() ? m.recode_threads() : 1U);
    recode.set_timing(config::STEP_PATH);
    recode.set_chunk_token_layers(m.has_recode_chunk_token_layers() ? m.recode_chunk_token_layers()
                                                                    : 1U);
    recode.set_parallel_min_values(m.recode_parallel_min_values());
  }
  // What does not hold is the file's (its lengths against the model, its policy), so data.
  if (const auto problems = config::validate(run, loader, locations); !problems.empty()) {
    throw DataError("cannot be simulated: " + problems.front().path + ": " + problems.front().what,
                    file.path());
  }
  try {
    return serving::simulate(run);
  } catch (const ConfigError& error) {
    throw DataError("cannot be simulated: " + std::string(error.what()),
                    error.where().empty() ? file.path() : file.path() + "; " + error.where());
  } catch (const std::overflow_error& error) {
    // Times far outside a run's (a calibration from an absurd measured time).
    throw DataError("cannot be simulated: " + std::string(error.what()), file.path());
  }
}

const serving::Metric* find_metric(const serving::SimulationReport& report, std::string_view name) {
  const auto found =
      std::find_if(report.metrics.begin(), report.metrics.end(),
                   [&](const serving::Metric& metric) { return metric.name == name; });
  return found == report.metrics.end() ? nullptr : &*found;
}

// The simulation's value of a figure; nullopt when it reports none (no TPOT for one token).
std::optional<double> projected(const serving::SimulationReport& report, std::string_view figure) {
  const auto value = [&](std::string_view name) -> std::optional<double> {
    const serving::Metric* metric = find_metric(report, name);
    return metric == nullptr ? std::nullopt : std::optional<double>(metric->value);
  };
  const auto busy = [&](std::string_view utilisation) -> std::optional<double> {
    // Copy-engine busy time / duration, times the duration.
    const auto share = value(utilisation);
    const auto seconds = value("duration_s");
    return share && seconds ? std::optional<double>(*share * *seconds) : std::nullopt;
  };
  const auto bytes = [&](std::string_view gigabytes) -> std::optional<double> {
    const auto gb = value(gigabytes);
    return gb ? std::optional<double>(std::round(*gb * 1e9)) : std::nullopt;
  };
  if (figure == "pcie_h2d_bytes") {
    return bytes("pcie_h2d_gb");
  }
  if (figure == "pcie_d2h_bytes") {
    return bytes("pcie_d2h_gb");
  }
  if (figure == "host_recode_bytes") {
    return bytes("host_recode_gb");
  }
  if (figure == "tpot_mean_ms") {
    return value("tpot_mean_ms");
  }
  if (figure == "host_recode_busy_s") {
    return value("host_recode_s");  // NaN: recodes the simulation does not time
  }
  return busy(figure == "pcie_h2d_busy_s" ? "pcie_h2d_utilisation" : "pcie_d2h_utilisation");
}

double measured(const config::LiveMeasurement& m, std::string_view figure) {
  if (figure == "pcie_h2d_bytes") {
    return static_cast<double>(m.h2d().bytes());
  }
  if (figure == "pcie_d2h_bytes") {
    return static_cast<double>(m.d2h().bytes());
  }
  if (figure == "host_recode_bytes") {
    return static_cast<double>(m.host_recode().bytes());
  }
  if (figure == "tpot_mean_ms") {
    return m.decode_seconds() * 1e3 / static_cast<double>(m.new_tokens());
  }
  if (figure == "host_recode_busy_s") {
    return m.host_recode().seconds();
  }
  return figure == "pcie_h2d_busy_s" ? m.h2d().seconds() : m.d2h().seconds();
}

// A live file read and checked, with what its comparison needs.
struct LiveRun {
  LiveRun(const std::string& path, const std::string& text) : file(path, text) {}
  LiveFile file;
  std::array<double, kFigures.size()> tolerance{};
  std::string model;  // the model preset
  std::string trace;
  std::optional<GpuNode> node;
  // Why every figure, or every timing, is not compared (empty: compared).
  std::string skip_all;
  std::string skip_timing;
};

std::unique_ptr<LiveRun> read_live(const std::string& path, const std::string& text,
                                   const config::ConfigLoader& loader) {
  auto run = std::make_unique<LiveRun>(path, text);
  const LiveFile& file = run->file;
  check_fields(file);
  const config::LiveMeasurement& m = *file;
  run->tolerance = tolerances(file);
  const config::PresetFile* model = loader.presets().find("model", m.provenance().model());
  if (m.follow_trace().empty()) {
    run->skip_all =
        "free-running run (no follow_trace): only a run that followed a trace can be "
        "simulated";
  } else {
    run->trace = followed_trace(file);
  }
  if (run->skip_all.empty() && model == nullptr) {
    run->skip_all = "model " + m.provenance().model() +
                    " is not a model preset (kvtier presets list --kind model)";
  }
  if (model != nullptr) {
    run->model = std::string(model->name);
  }
  if (m.provenance().device() == "cpu") {
    run->skip_timing =
        "not comparable (cpu backend): a CPU decodes and its copies are memory copies";
  } else {
    run->node = node_for_gpu(m.provenance().device_name());
    if (!run->node) {
      run->skip_timing = "no node preset for GPU " + m.provenance().device_name();
    }
  }
  return run;
}

// Runs whose engines are alike: the same GPU and engine settings (the cache's copies and recode
// threads aside: a full cache copies and recodes nothing), model, lengths and trace (the same
// file however its path is spelt: absolute or relative, through links).
std::string twin_key(const LiveRun& run) {
  const config::LiveMeasurement& m = *run.file;
  std::error_code error;
  fs::path trace = fs::weakly_canonical(run.trace, error);
  if (error) {
    trace = run.trace;  // unreadable on the way: the path as found
  }
  std::string engine;
  for (const std::string& item : detail_items(m)) {
    if (!item.ends_with(" copies") && !item.ends_with(" recode threads")) {
      engine += item + ",";
    }
  }
  return m.provenance().device_name() + "\n" + engine + "\n" + m.provenance().model_path() + "\n" +
         std::to_string(m.prompt_tokens()) + "\n" + std::to_string(m.new_tokens()) + "\n" +
         trace.string();
}

bool times_compared(const LiveRun& run) {
  return run.skip_all.empty() && run.skip_timing.empty();
}

std::string id_of(const LiveRun& run) {
  return fs::path(run.file.path()).stem().string();
}

// The time per step a full-cache run took beyond the simulator's model of a tuned engine: what
// its engine costs that the model does not count (kernels short of the achievable fractions,
// launches, host work), taken as a fixed time per iteration for the runs of the same engine.
struct EngineCalibration {
  std::size_t file = 0;  // the full-cache run's index among the files
  std::string id;        // and its name
  double overhead_us = 0.0;
};

std::vector<ReferenceCheck> live_checks(const LiveRun& run, std::size_t index,
                                        const EngineCalibration* calibration,
                                        const config::ConfigLoader& loader) {
  const config::LiveMeasurement& m = *run.file;
  std::optional<serving::SimulationReport> report;
  if (run.skip_all.empty()) {
    report = simulate(run.file, run.model, run.trace,
                      run.node.value_or(GpuNode{std::string(kBytesNode), ""}),
                      calibration != nullptr ? calibration->overhead_us : 0.0, loader);
  }
  const std::string id = id_of(run);
  std::vector<ReferenceCheck> checks;
  for (std::size_t i = 0; i < kFigures.size(); ++i) {
    const Figure& figure = kFigures[i];
    ReferenceCheck& check = checks.emplace_back();
    check.id = id;
    check.policy = report ? report->policy : m.policy();
    check.metric = std::string(figure.metric);
    check.measured = measured(m, figure.metric);
    check.tolerance = run.tolerance[i];
    check.decimals = figure.decimals;
    check.skipped_because = !run.skip_all.empty() ? run.skip_all
                            : figure.timing       ? run.skip_timing
                                                  : "";
    if (check.skipped()) {
      continue;
    }
    const std::optional<double> value = projected(*report, figure.metric);
    if (!value) {
      check.skipped_because = "the simulation reports no " + check.metric;
      continue;
    }
    if (std::isnan(*value)) {
      check.skipped_because = "not timed: node " + run.node.value_or(GpuNode{}).node +
                              "'s host declares no kv_recode rates";
      continue;
    }
    check.projected = *value;
    check.relative_error = relative_error(check.projected, check.measured);
    if (figure.metric == "tpot_mean_ms" && calibration != nullptr) {
      check.calibrated = calibration->file == index;
      check.note = "engine +" + format_fixed(calibration->overhead_us / 1e3, 3) +
                   " ms per step, from " + calibration->id;
    }
  }
  return checks;
}

// The file's text; ConfigError when it cannot be read, DataError when it is binary.
std::string read_measurement(const std::string& path) {
  InputText input = read_input_file(path, kTextInputLimitBytes);
  if (input.status == InputText::Status::kFolder) {
    throw ConfigError(
        "a folder, not a measurement file; name its files (e.g. DIR/*.textproto "
        "DIR/*.json)",
        path);
  }
  if (input.status == InputText::Status::kCannotOpen ||
      input.status == InputText::Status::kReadError) {
    throw ConfigError("cannot open the measurement file", path);
  }
  if (input.status == InputText::Status::kTooLarge) {
    throw DataError("larger than " + input_limit_text(kTextInputLimitBytes) +
                        ": neither a live measurement nor a measured reference",
                    path);
  }
  std::string text = std::move(input.text);
  // Binary: neither kind of file (exit 3), where a config's loader would say "not a config".
  if (const std::optional<config::NonTextByte> odd = config::find_non_text_byte(text, path)) {
    throw DataError(
        "neither a live measurement (JSON) nor a measured reference (protobuf text "
        "format): byte " +
            std::to_string(odd->offset) + " is not UTF-8 text",
        odd->place);
  }
  return text;
}

}  // namespace

bool is_live_measurement(std::string_view text) {
  return config::looks_like_json(text);
}

std::vector<ReferenceCheck> check_measurement_files(const std::vector<std::string>& paths,
                                                    const config::ConfigLoader& loader,
                                                    std::vector<LiveSteps>* steps) {
  // Every file is read before any is compared, but a file's error is reported in file order:
  // the first bad file's, as when they were read one by one.
  std::vector<std::unique_ptr<LiveRun>> live(paths.size());
  std::vector<std::exception_ptr> failed(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    try {
      const std::string text = read_measurement(paths[i]);
      if (is_live_measurement(text)) {
        live[i] = read_live(paths[i], text, loader);
      }
    } catch (...) {
      failed[i] = std::current_exception();
    }
  }
  // Each engine's calibration, from its first full-cache run whose times are compared (none
  // when that run was faster than the model: a step cannot take negative time).
  std::map<std::string, std::optional<EngineCalibration>> calibrations;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const LiveRun* run = live[i].get();
    if (run == nullptr || !times_compared(*run) || (*run->file).policy() != "full" ||
        calibrations.contains(twin_key(*run))) {
      continue;
    }
    std::optional<EngineCalibration>& calibration = calibrations[twin_key(*run)];
    try {
      const serving::SimulationReport report =
          simulate(run->file, run->model, run->trace, run->node.value(), 0.0, loader);
      const std::optional<double> model_ms = projected(report, "tpot_mean_ms");
      const double gap_us =
          model_ms ? (measured(*run->file, "tpot_mean_ms") - *model_ms) * 1e3 : 0.0;
      if (gap_us > 0.0) {
        calibration = EngineCalibration{i, id_of(*run), gap_us};
      }
    } catch (...) {
      failed[i] = std::current_exception();
    }
  }
  std::vector<ReferenceCheck> checks;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (failed[i]) {
      std::rethrow_exception(failed[i]);
    }
    std::vector<ReferenceCheck> file_checks;
    if (live[i] == nullptr) {
      file_checks = check_reference(paths[i], loader);
    } else {
      const auto found =
          times_compared(*live[i]) ? calibrations.find(twin_key(*live[i])) : calibrations.end();
      const EngineCalibration* calibration =
          found == calibrations.end() || !found->second ? nullptr : &*found->second;
      file_checks = live_checks(*live[i], i, calibration, loader);
      if (steps != nullptr) {
        const config::LiveMeasurement& m = *live[i]->file;
        steps->push_back({id_of(*live[i]),
                          m.policy(),
                          m.provenance().device_name(),
                          {m.steps().begin(), m.steps().end()}});
      }
    }
    for (ReferenceCheck& check : file_checks) {
      checks.push_back(std::move(check));
    }
  }
  return checks;
}

}  // namespace kvtier::validation
