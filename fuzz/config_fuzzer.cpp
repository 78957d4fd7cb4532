// libFuzzer harness for the text files and strings a user hands kvtier besides traces and model
// files (docs/FUZZING.md): config files of every kind with `--set` overrides, policy and SLO
// strings, live measurement files, measured references, published-measurement CSVs and request
// files.
//
// The first byte of an input picks what is fuzzed (Target below); the rest is its content. A
// config, reference or measurement file is written into a scratch tree laid out like the source
// tree (configs/examples/, configs/workloads/, validation/measurements/ with its trace), so that
// relative paths in the seeds resolve as they do in the repository. Whatever is read is checked
// as the commands check it (`config check`, `sim`, `sweep`, `validate`) and, when it is valid
// and small (at most kMaxRequests requests of kMaxPrompt + kMaxOutput tokens on a model of at most
// kMaxLayers layers), simulated and reported, so that the discrete-event model, the tier-aware
// simulation and the reports see it too. A ConfigError or DataError is the expected outcome for
// a bad input; anything else (a crash, a sanitizer report, another exception type, a hang) is a
// finding.
//
// `kvtier_fuzz_configs -write_seeds=FOLDER` writes the seed corpus (the repository's configs,
// sweeps, measurement files and request files behind their selector bytes, some with overrides
// that make them small enough to simulate) and exits; with KVTIER_FUZZ_PRINT_ERRORS set, each
// refused input prints its error line.

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "apps/cli.hpp"
#include "apps/report.hpp"
#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/parse.hpp"
#include "configs/presets.hpp"
#include "configs/schema/measurement.pb.h"
#include "configs/schema/reference.pb.h"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"
#include "configs/validate.hpp"
#include "fuzz/fuzz_support.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "serving/demand_memo.hpp"
#include "serving/memory_plan.hpp"
#include "serving/plan.hpp"
#include "serving/simulation.hpp"
#include "serving/workload.hpp"
#include "sweep/impl/folder.hpp"
#include "sweep/impl/results_html.hpp"
#include "sweep/sweep.hpp"
#include "validation/live.hpp"
#include "validation/published.hpp"

namespace {

namespace fs = std::filesystem;
namespace kc = kvtier::config;

// What the first byte of an input selects (modulo the count).
enum class Target : std::uint8_t {
  kConfig,     // a config file of the kind the second byte picks, then `--set` lines
  kPolicy,     // a --compare policy list, then an --slo string, then a --layouts string
  kLive,       // a live measurement file (JSON)
  kReference,  // a measured reference (ReferenceMeasurement, text format)
  kPublished,  // a CSV of published measurements
  kRequests,   // a request file (the second byte picks its format)
  kCount,
};
constexpr std::array<std::string_view, static_cast<int>(Target::kCount)> kTargetNames = {
    "config", "policy", "live", "reference", "published", "requests"};

// What one input may simulate: a few requests of up to two thousand tokens on a model of at most
// 128 layers, with at most four policies, takes well under a second (a live file's one request
// may be longer).
constexpr std::uint64_t kMaxRequests = 8;
constexpr std::uint64_t kMaxPrompt = 2048;
constexpr std::uint64_t kMaxOutput = 64;
constexpr std::uint64_t kMaxLayers = 128;
constexpr int kMaxCompare = 3;
constexpr std::uint32_t kMaxEngines = 4;  // a cluster's, each of which knows every request
// Sweep points whose runs are built (the first ones and the last one).
constexpr std::uint64_t kSweepPoints = 4;
// Published points projected per file.
constexpr std::size_t kPublishedPoints = 4;

// Config inputs: the second byte picks the kind among config_kinds(), or one past them for the
// file's own `# proto-message:` line (a RunSpec without one), as `config check` without --kind.
// After the first NUL byte come `--set` arguments, one a line.
constexpr char kOverridesSeparator = '\0';

// A small run for policy strings and request files: the policy and workload are replaced.
constexpr std::string_view kTinyRun = R"(
hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
model { preset: "TinyLlama-1.1B" }
tensor_parallel_degree: 1
workload {
  closed_loop {
    concurrency: 2
    num_requests: 3
    prompt_tokens { fixed_tokens: 48 }
    output_tokens { fixed_tokens: 12 }
  }
  max_batch_size: 8
  prefill_chunk_tokens: 32
}
policy { name: "full" }
tiering {
  synthetic_pattern: "reasoning"
  prefetch_lookahead_layers: 1
  host_allocation: PINNED
  copy_method: COPY_ENGINES
}
memory { runtime_reserve_gib: 1 activation_workspace_gib: 0.5 }
engine { iteration_overhead_us: 100 }
outputs { timeseries_interval_us: 500 }
seed: 3
)";

using kvtier::fuzz::read_file;
using kvtier::fuzz::write_file;

fs::path source_dir() {
  return KVTIER_SOURCE_DIR;
}

// A scratch copy of the parts of the source tree that the seeds name by relative path, plus the
// fuzzed files; in memory when /dev/shm exists, removed at exit.
class Scratch {
 public:
  Scratch() : presets_(kc::builtin_preset_files()), loader_(presets_) {
    const char* folder = std::getenv("KVTIER_FUZZ_DIR");
    std::string pattern =
        std::string(folder != nullptr ? folder : "/dev/shm") + "/kvtier-fuzz-configs-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    root_ = pattern;
    for (const char* sub : {"configs/examples", "configs/workloads", "configs/sweeps",
                            "validation/measurements/traces", "validation/published"}) {
      fs::create_directories(root_ / sub);
      for (const auto& entry : fs::directory_iterator(source_dir() / sub)) {
        if (entry.is_regular_file()) {
          fs::copy_file(entry.path(), root_ / sub / entry.path().filename());
        }
      }
    }
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&&) = delete;
  Scratch& operator=(Scratch&&) = delete;

  [[nodiscard]] const fs::path& root() const { return root_; }
  [[nodiscard]] const kc::ConfigLoader& loader() const { return loader_; }

 private:
  fs::path root_;
  kc::PresetRegistry presets_;
  kc::ConfigLoader loader_;
};

const Scratch& scratch() {
  static const Scratch instance;
  return instance;
}

std::uint64_t max_tokens(const kc::TokenCount& count) {
  switch (count.kind_case()) {
    case kc::TokenCount::kFixedTokens: return count.fixed_tokens();
    case kc::TokenCount::kUniform: return count.uniform().max_tokens();
    case kc::TokenCount::kLognormal: return count.lognormal().max_tokens();
    case kc::TokenCount::KIND_NOT_SET: break;
  }
  return 0;
}

// The files a fuzzed run or reference may name and the harness reads: the scratch tree's own;
// anything else (a path outside it, a device) is not a text input of this harness.
bool in_scratch(const fs::path& path) {
  std::error_code error;
  const fs::path resolved = fs::weakly_canonical(path, error);
  if (error || !fs::is_regular_file(resolved, error) || fs::file_size(resolved, error) > 65536) {
    return false;
  }
  const fs::path root = fs::weakly_canonical(scratch().root(), error);
  const auto relative = resolved.lexically_relative(root);
  return !relative.empty() && *relative.begin() != "..";
}

// A validated run the harness may simulate, its request file found from `file`'s folder as
// `kvtier sim` does; false when it is too large (or reads files other than the scratch tree's).
bool small_run(kc::RunSpec& run, const fs::path& file) {
  // Traces are another harness's input; replay demands would be written where the run says.
  if (run.model().num_hidden_layers() > kMaxLayers || run.compare_size() > kMaxCompare ||
      run.tiering().traces_size() > 0 || run.tiering().has_demand_cache_directory() ||
      run.cluster().engines() > kMaxEngines) {
    return false;
  }
  const kc::WorkloadSpec& workload = run.workload();
  switch (workload.kind_case()) {
    case kc::WorkloadSpec::kClosedLoop: {
      const auto& loop = workload.closed_loop();
      return loop.num_requests() <= kMaxRequests &&
             max_tokens(loop.prompt_tokens()) + workload.shared_prefix().tokens() <= kMaxPrompt &&
             max_tokens(loop.output_tokens()) <= kMaxOutput;
    }
    case kc::WorkloadSpec::kPoisson: {
      const auto& poisson = workload.poisson();
      return poisson.num_requests() <= kMaxRequests &&
             max_tokens(poisson.prompt_tokens()) + workload.shared_prefix().tokens() <=
                 kMaxPrompt &&
             max_tokens(poisson.output_tokens()) <= kMaxOutput;
    }
    case kc::WorkloadSpec::kRequestFile: {
      kc::resolve_run_paths(run, file.string());
      const fs::path named = workload.request_file().path();
      if (!in_scratch(named)) {
        return false;
      }
      // The file's requests are checked after reading it (as many as the run takes).
      const auto requests = kvtier::serving::make_workload(workload, run.seed()).requests;
      const std::uint64_t taken = requests.size();
      if (taken > kMaxRequests) {
        return false;
      }
      for (std::uint64_t i = 0; i < taken; ++i) {
        if (requests[i].prompt_tokens > kMaxPrompt || requests[i].output_tokens > kMaxOutput) {
          return false;
        }
      }
      return true;
    }
    case kc::WorkloadSpec::KIND_NOT_SET: break;
  }
  return false;
}

// What `kvtier sim` does with a valid run: simulate every policy and write the reports.
void simulate(const kc::RunSpec& run) {
  const std::vector<kvtier::serving::SimulationReport> reports = kvtier::serving::simulate_all(run);
  static_cast<void>(kvtier::serving::report_json(reports, run, "kvtier fuzz"));
  static_cast<void>(kvtier::serving::report_csv(reports));
  static_cast<void>(kvtier::serving::engines_csv(reports));
  static_cast<void>(kvtier::serving::report_html(reports, run, "kvtier fuzz", "fuzz.textproto"));
  for (const auto& report : reports) {
    static_cast<void>(kvtier::serving::series_csv(report));
  }
}

std::vector<kc::Override> parse_overrides(std::string_view text) {
  std::vector<kc::Override> overrides;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    if (end > begin) {
      overrides.push_back(kc::parse_override(text.substr(begin, end - begin)));
    }
    begin = end + 1;
  }
  return overrides;
}

// A planning sweep (`plan`) bisects over many simulations: a closed loop's probes run up to
// rounds x max_batch_size requests each, so it is planned only when that is small too (an open
// loop's probes run the small run's own requests).
bool small_plan(const kc::SweepSpec& spec, const kc::RunSpec& run) {
  if (!spec.has_plan() || !run.workload().has_closed_loop()) {
    return true;
  }
  const std::uint64_t rounds = spec.plan().has_rounds() ? spec.plan().rounds() : 3;
  return rounds * run.workload().max_batch_size() <= kMaxRequests;
}

// A sweep as `kvtier sweep` loads it; the first points' runs built, and the first small one
// simulated (or with `plan`, planned) into a result table.
void exercise_sweep(std::string_view text, const fs::path& path,
                    const std::vector<kc::Override>& overrides) {
  const kc::ConfigLoader& loader = scratch().loader();
  const kvtier::sweep::Sweep sweep =
      kvtier::sweep::load_sweep_text(text, path.string(), loader, overrides);
  const std::uint64_t count = kvtier::sweep::point_count(sweep.spec);
  std::vector<std::uint64_t> points;
  for (std::uint64_t point = 0; point < std::min(count, kSweepPoints); ++point) {
    points.push_back(point);
  }
  if (count > kSweepPoints) {
    points.push_back(count - 1);
  }
  bool simulated = false;
  for (const std::uint64_t point : points) {
    static_cast<void>(kvtier::sweep::point_coordinates(sweep.spec, point));
    static_cast<void>(kvtier::sweep::point_values(sweep.spec, point));
    kc::RunSpec run;
    try {
      run = kvtier::sweep::point_run(sweep, point, loader);
    } catch (const kvtier::ConfigError&) {
      continue;  // a point that is not a valid run is a row with an error
    }
    if (simulated || !small_run(run, path) || !small_plan(sweep.spec, run)) {
      continue;
    }
    simulated = true;
    kvtier::serving::DemandMemo memo;
    std::vector<kvtier::sweep::Row> rows =
        kvtier::sweep::simulate_point(sweep, point, loader, memo);
    const kvtier::sweep::ResultTable table = kvtier::sweep::make_table(
        sweep.spec.name(), sweep.hash, sweep.axis_columns, std::move(rows));
    static_cast<void>(kvtier::sweep::results_csv(table));
    static_cast<void>(kvtier::sweep::results_json(table));
    static_cast<void>(kvtier::sweep::point_file_csv(table.rows, sweep.axis_columns));
    static_cast<void>(
        kvtier::sweep::detail::results_html(table, kvtier::sweep::detail::manifest_of(sweep)));
  }
}

// A config file as `config check` reads it, and a valid run as `sim` runs it.
void exercise_config(std::uint8_t kind_byte, std::string_view input) {
  const std::size_t separator = input.find(kOverridesSeparator);
  const std::string_view text = input.substr(0, separator);
  const std::vector<kc::Override> overrides = separator == std::string_view::npos
                                                  ? std::vector<kc::Override>{}
                                                  : parse_overrides(input.substr(separator + 1));
  const auto kinds = kc::config_kinds();
  std::string kind;
  if (kind_byte % (kinds.size() + 1) < kinds.size()) {
    kind = std::string(kinds[kind_byte % (kinds.size() + 1)]);
  } else {
    kind = kc::declared_kind(text);
    if (kind.empty()) {
      kind = "run";
    }
  }
  const fs::path path = scratch().root() / "configs/examples/fuzzed.textproto";
  write_file(path, text);
  const std::unique_ptr<google::protobuf::Message> message = kc::new_config_message(kind);
  if (kind == "sweep") {
    exercise_sweep(text, path, overrides);
    return;
  }
  const kc::ConfigLoader& loader = scratch().loader();
  // `kvtier sim` and `plan` read the file; `config check` reads its text.
  const kc::LocationMap locations = loader.load_file(path.string(), *message, overrides);
  static_cast<void>(kvtier::app::derived_rows(*message));
  const std::vector<kvtier::app::Row> rows = kvtier::app::spec_rows(*message);
  static_cast<void>(kvtier::app::rows_json(rows));
  static_cast<void>(kvtier::app::message_json(*message));
  auto* run = dynamic_cast<kc::RunSpec*>(message.get());
  if (run == nullptr) {
    return;
  }
  if (const auto problems = kc::validate(*run, loader, locations); !problems.empty()) {
    throw kc::InvalidConfig(problems, locations);
  }
  // `config check`, `sim` and `plan` check the run's policies by name and parameters.
  const kvtier::replay::PolicyRegistry registry = kvtier::replay::builtin_policies();
  registry.check(run->policy());
  for (const kc::PolicySpec& policy : run->compare()) {
    registry.check(policy);
  }
  if (small_run(*run, path)) {
    simulate(*run);
  }
}

// The tiny run with its policy and workload replaced, validated as `sim` validates its edits.
kc::RunSpec tiny_run() {
  kc::RunSpec run;
  static_cast<void>(scratch().loader().load_text(kTinyRun, "tiny-run", run, {}));
  return run;
}

void check_and_simulate(kc::RunSpec& run) {
  const kc::LocationMap locations;
  if (const auto problems = kc::validate(run, scratch().loader(), locations); !problems.empty()) {
    throw kc::InvalidConfig(problems, locations);
  }
  simulate(run);
}

// A `plan --layouts` string against the tiny run made a disaggregated cluster (pools, engines
// and splits all parse there), and the run each layout makes: its GPUs counted, each named.
void exercise_layouts(const std::string& text) {
  kc::RunSpec run = tiny_run();
  auto& cluster = *run.mutable_cluster();
  cluster.set_engines(2);
  cluster.set_routing(kc::ROUND_ROBIN);
  cluster.mutable_disaggregation()->set_prefill_engines(1);
  for (const kvtier::serving::Layout& layout : kvtier::serving::parse_layouts(text, run)) {
    const kc::RunSpec split = kvtier::serving::with_layout(run, layout);
    static_cast<void>(kvtier::serving::layout_key(layout));
    static_cast<void>(kvtier::serving::describe_layout(layout));
    static_cast<void>(kvtier::serving::cluster_gpus(split));
    static_cast<void>(kvtier::serving::cluster_nodes(split));
    static_cast<void>(kvtier::serving::mean_engines_per_node(split));
  }
}

// `--compare P1,P2,...` (one policy string is a list of one) against the registry, then the
// tiny run with them; the second line is an `--slo` string, a third a `--layouts` string.
void exercise_policy(std::string_view input) {
  const std::size_t newline = input.find('\n');
  const std::string list(input.substr(0, newline));
  if (newline != std::string_view::npos) {
    const std::string_view rest = input.substr(newline + 1);
    const std::size_t third = rest.find('\n');
    static_cast<void>(kvtier::serving::parse_slos(std::string(rest.substr(0, third))));
    if (third != std::string_view::npos) {
      exercise_layouts(std::string(rest.substr(third + 1)));
    }
  }
  const std::vector<kc::PolicySpec> specs = kvtier::app::parse_policy_list(list);
  const kvtier::replay::PolicyRegistry registry = kvtier::replay::builtin_policies();
  for (const kc::PolicySpec& spec : specs) {
    static_cast<void>(kvtier::replay::policy_string(spec));
    registry.check(spec);
    // The shape of a one-layer, one-token trace, where a per-layer budget list may not fit,
    // then that of the tiny run.
    std::string canonical;
    try {
      static_cast<void>(registry.create(spec, kvtier::replay::ReplayShape{1, 1, 1}, &canonical));
    } catch (const kvtier::ConfigError&) {
    }
    static_cast<void>(registry.create(spec, kvtier::replay::ReplayShape{22, 48, 12}, &canonical));
  }
  kc::RunSpec run = tiny_run();
  *run.mutable_policy() = specs.front();
  for (std::size_t i = 1; i < specs.size() && i <= kMaxCompare; ++i) {
    *run.add_compare() = specs[i];
  }
  check_and_simulate(run);
}

// A live measurement file as `kvtier validate` reads and projects it, when its request is small.
void exercise_live(std::string_view text) {
  const fs::path path = scratch().root() / "validation/measurements/fuzzed.json";
  write_file(path, text);
  kc::LiveMeasurement measurement;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  // A long request takes long to simulate; lengths no config field holds (2^32 and more) are
  // refused before simulating, so they are kept.
  const auto long_request = [](std::uint64_t tokens, std::uint64_t limit) {
    return tokens > limit && tokens < (std::uint64_t{1} << 32) - 1;
  };
  if (google::protobuf::util::JsonStringToMessage(std::string(text), &measurement, options).ok() &&
      (long_request(measurement.prompt_tokens(), kMaxPrompt) ||
       long_request(measurement.new_tokens(), 16 * kMaxOutput))) {
    return;
  }
  static_cast<void>(
      kvtier::validation::check_measurement_files({path.string()}, scratch().loader()));
}

// A measured reference as `kvtier validate` reads it; simulated when its run is small.
void exercise_reference(std::string_view text) {
  const fs::path path = scratch().root() / "validation/measurements/fuzzed.textproto";
  write_file(path, text);
  const kc::ConfigLoader& loader = scratch().loader();
  kc::ReferenceMeasurement reference;
  static_cast<void>(loader.load_file(path.string(), reference, {}));
  kc::RunSpec run = reference.run();
  fs::path run_path = path;  // where the run's relative paths start, as check_reference has it
  if (reference.has_run_file()) {
    run_path = (path.parent_path() / reference.run_file()).lexically_normal();
    if (!in_scratch(run_path)) {
      return;  // a file outside the scratch tree
    }
    static_cast<void>(loader.load_file(run_path.string(), run, {}));
  }
  if (!small_run(run, run_path)) {
    return;
  }
  static_cast<void>(
      kvtier::validation::check_measurement_files({path.string()}, scratch().loader()));
}

// A published-measurement CSV as `kvtier validate --published` reads it; its first small points
// projected.
void exercise_published(std::string_view text) {
  const fs::path path = scratch().root() / "validation/published/fuzzed.csv";
  write_file(path, text);
  const auto points = kvtier::validation::read_published(path.string());
  std::size_t projected = 0;
  for (const auto& point : points) {
    if (projected == kPublishedPoints) {
      break;
    }
    if (point.batch_size > kMaxRequests || point.prompt_tokens > kMaxPrompt ||
        point.output_tokens > kMaxOutput) {
      continue;
    }
    ++projected;
    static_cast<void>(kvtier::validation::project(point, scratch().loader()));
  }
}

// A request file of any format, read as `kvtier sim` reads it; the tiny run serves it when its
// requests are few and short (Mooncake's with prefix caching, in blocks of the hash blocks').
void exercise_requests(std::uint8_t format_byte, std::string_view text) {
  const fs::path path = scratch().root() / "configs/workloads/fuzzed.csv";
  write_file(path, text);
  constexpr std::array kFormats = {kc::AZURE_CSV, kc::KVTIER_CSV, kc::MOONCAKE_JSONL};
  const kc::RequestFileFormat format = kFormats[format_byte % 3];
  const double time_scale = format_byte % 6 < 3 ? 1.0 : 1e-3;
  kc::RunSpec run = tiny_run();
  kc::WorkloadSpec& workload = *run.mutable_workload();
  workload.mutable_request_file()->set_path(path.string());
  workload.mutable_request_file()->set_format(format);
  workload.mutable_request_file()->set_time_scale(time_scale);
  if (format == kc::MOONCAKE_JSONL) {
    const std::uint32_t hash_block_tokens = 1U << (format_byte / 6 % 10);  // 1 to 512
    workload.mutable_request_file()->set_hash_block_tokens(hash_block_tokens);
    run.mutable_memory()->set_kv_block_tokens(std::min<std::uint32_t>(hash_block_tokens, 16));
    run.mutable_memory()->set_prefix_caching(true);
  }
  static_cast<void>(kvtier::serving::make_workload(workload, run.seed()));
  if (small_run(run, path)) {
    check_and_simulate(run);
  }
}

void write_seed(const fs::path& folder, const std::string& name, Target target,
                std::string_view content) {
  std::string seed(1, static_cast<char>(target));
  seed += content;
  write_file(folder / (std::string(kTargetNames[static_cast<std::size_t>(target)]) + "-" + name),
             seed);
}

// Overrides that make the example runs small enough to simulate.
constexpr std::string_view kShrink =
    "workload.closed_loop.num_requests=4\n"
    "workload.closed_loop.concurrency=2\n"
    "workload.closed_loop.prompt_tokens.fixed_tokens=128\n"
    "workload.closed_loop.output_tokens.fixed_tokens=4\n";

// The repository's files behind their selector bytes.
void write_seeds(const fs::path& folder) {
  fs::create_directories(folder);
  const auto kinds = kc::config_kinds();
  const auto kind_byte = [&](std::string_view kind) {
    return static_cast<char>(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
  };
  const fs::path source = source_dir();
  // Presets: every kind but run, sweep, workload and policy.
  for (const auto& [sub, kind] :
       std::vector<std::pair<std::string, std::string>>{{"configs/hardware/gpus", "gpu"},
                                                        {"configs/hardware/hosts", "host"},
                                                        {"configs/hardware/links", "link"},
                                                        {"configs/hardware/nodes", "node"},
                                                        {"configs/models", "model"}}) {
    for (const auto& entry : fs::directory_iterator(source / sub)) {
      write_seed(folder, kind + "-" + entry.path().stem().string(), Target::kConfig,
                 std::string(1, kind_byte(kind)) + read_file(entry.path()));
    }
  }
  for (const auto& entry : fs::directory_iterator(source / "configs/examples")) {
    const std::string text = read_file(entry.path());
    const std::string stem = entry.path().stem().string();
    write_seed(folder, "run-" + stem, Target::kConfig, std::string(1, kind_byte("run")) + text);
    write_seed(
        folder, "run-small-" + stem, Target::kConfig,
        std::string(1, kind_byte("run")) + text + kOverridesSeparator + std::string(kShrink));
  }
  for (const auto& entry : fs::directory_iterator(source / "configs/sweeps")) {
    write_seed(folder, "sweep-" + entry.path().stem().string(), Target::kConfig,
               std::string(1, kind_byte("sweep")) + read_file(entry.path()));
  }
  // A sweep small enough to simulate, and a JSON run with unit-string overrides.
  write_seed(folder, "sweep-small", Target::kConfig,
             std::string(1, kind_byte("sweep")) +
                 read_file(source / "configs/sweeps/model-tp-zip.textproto") + kOverridesSeparator +
                 "base.workload.closed_loop.num_requests=2\n"
                 "base.workload.closed_loop.prompt_tokens.fixed_tokens=128\n"
                 "base.workload.closed_loop.output_tokens.fixed_tokens=4\n");
  // A sweep that plans, small enough to plan: batches of at most 4 in two rounds.
  write_seed(folder, "sweep-small-plan", Target::kConfig,
             std::string(1, kind_byte("sweep")) +
                 read_file(source / "configs/sweeps/plan-h100-h200-tiered.textproto") +
                 kOverridesSeparator +
                 "base.model.preset=Llama-3.1-8B\n"
                 "base.tensor_parallel_degree=1\n"
                 "base.workload.max_batch_size=4\n"
                 "base.workload.closed_loop.concurrency=4\n"
                 "base.workload.closed_loop.num_requests=8\n"
                 "base.workload.closed_loop.prompt_tokens.fixed_tokens=128\n"
                 "axis[1].values=4,8\n"
                 "plan.rounds=2\n");
  write_seed(folder, "run-overrides", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/quickstart.textproto") + kOverridesSeparator +
                 std::string(kShrink) +
                 "hardware.node.gpu.memory_capacity=80GiB\n"
                 "hardware.node.gpu.memory_bandwidth=4.8TB/s\n"
                 "engine.iteration_overhead=5us\n"
                 "model.max_position_embeddings=64k\n"
                 "hardware.node.gpu.compute[0].dense_tflops=989\n"
                 "model.kv_dtype=fp8_e4m3\n"
                 "tiering.host_allocation=pageable\n"
                 "model.preset=Llama-3.1-8B\n");
  // Latent attention split by requests, with a chunk budget the GPUs share.
  write_seed(folder, "run-small-data-parallel-attention", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/deepseek-v3-attention.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "engine.data_parallel_attention=true\n"
                 "workload.prefill_chunk_tokens=100\n");
  // Requests dispatched to GPUs, each with its own queue and KV memory, admitted on demand.
  write_seed(folder, "run-small-data-parallel-dispatch", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/deepseek-v3-attention.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "engine.data_parallel_attention=true\n"
                 "engine.data_parallel_dispatch=LEAST_OUTSTANDING\n"
                 "compare=~\n"
                 "workload.on_demand_admission.watermark=0.01\n"
                 "workload.prefill_chunk_tokens=100\n");
  // Dispatched requests under the example's tier policy: each GPU's own copies.
  write_seed(folder, "run-small-data-parallel-dispatch-tiered", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/deepseek-v3-attention.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "engine.data_parallel_attention=true\n"
                 "engine.data_parallel_dispatch=ROUND_ROBIN\n"
                 "workload.prefill_chunk_tokens=100\n");
  // Experts whole over the GPUs, their tokens sent in all-to-alls, a stated imbalance.
  write_seed(folder, "run-small-expert-parallel", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/deepseek-v3-attention.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "engine.data_parallel_attention=true\n"
                 "engine.expert_parallel=true\n"
                 "engine.expert_load_imbalance=1.3\n"
                 "engine.expert_all_to_all_overhead_us=25\n"
                 "workload.prefill_chunk_tokens=100\n");
  // A group over two nodes, each KV head on two GPUs.
  write_seed(folder, "run-small-two-nodes", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/quickstart.textproto") + kOverridesSeparator +
                 std::string(kShrink) +
                 "tensor_parallel_degree=16\n"
                 "hardware.num_nodes=2\n"
                 "hardware.network.preset=InfiniBand-NDR\n");
  // Pipeline stages over two nodes, a stage a node.
  write_seed(folder, "run-small-pipeline", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/llama70b-tp4-1000.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "tensor_parallel_degree=8\n"
                 "pipeline_parallel_degree=2\n"
                 "hardware.num_nodes=2\n"
                 "hardware.network.preset=InfiniBand-NDR\n");
  // A tier policy over pipeline stages within a node.
  write_seed(folder, "run-small-pipeline-tiered", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/llama70b-tp4-tiered.textproto") +
                 kOverridesSeparator + std::string(kShrink) + "pipeline_parallel_degree=2\n");
  write_seed(folder, "run-small-cluster", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/cluster-routing.textproto") +
                 kOverridesSeparator +
                 "workload.poisson.num_requests=6\n"
                 "workload.shared_prefix.tokens=256\n"
                 "workload.shared_prefix.groups=3\n"
                 "workload.poisson.prompt_tokens.lognormal.median_tokens=64\n"
                 "workload.poisson.prompt_tokens.lognormal.max_tokens=512\n"
                 "workload.poisson.output_tokens.lognormal.median_tokens=8\n"
                 "workload.poisson.output_tokens.lognormal.max_tokens=32\n"
                 "cluster.engines=3\n"
                 "cluster.routing=KV_AWARE\n"
                 "cluster.kv_overlap_weight=1\n");
  // Disaggregated pools split differently: prefill engines of TP 2 x 2 stages, decode engines
  // of TP 4, on Llama-3.1-8B, sent layer by layer.
  write_seed(folder, "run-small-pools", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/disaggregated-pool-parallelism.textproto") +
                 kOverridesSeparator +
                 "model.preset=Llama-3.1-8B\n"
                 "tensor_parallel_degree=4\n"
                 "cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=2\n"
                 "cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree=2\n"
                 "cluster.disaggregation.layer_wise_transfer=true\n"
                 "workload.poisson.num_requests=6\n"
                 "workload.poisson.prompt_tokens.lognormal.median_tokens=64\n"
                 "workload.poisson.prompt_tokens.lognormal.max_tokens=512\n"
                 "workload.poisson.output_tokens.lognormal.median_tokens=8\n"
                 "workload.poisson.output_tokens.lognormal.max_tokens=32\n");
  // Decode engines receiving into host memory only what their policy keeps, layer by layer,
  // admitted on demand, pipelined.
  write_seed(folder, "run-small-host-landing", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/disaggregated-host-landing.textproto") +
                 kOverridesSeparator + std::string(kShrink) +
                 "cluster.engines=3\n"
                 "cluster.disaggregation.prefill_engines=1\n"
                 "cluster.disaggregation.send_kept_only=true\n"
                 "cluster.disaggregation.layer_wise_transfer=true\n"
                 "workload.on_demand_admission.watermark=0.01\n"
                 "pipeline_parallel_degree=2\n");
  // Each engine of a disaggregated cluster dispatching its requests to its GPUs, sent layer by
  // layer, admitted on demand.
  write_seed(folder, "run-small-disaggregated-dispatch", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 read_file(source / "configs/examples/disaggregated-dp-attention.textproto") +
                 kOverridesSeparator +
                 "engine.data_parallel_dispatch=LEAST_OUTSTANDING\n"
                 "cluster.disaggregation.layer_wise_transfer=true\n"
                 "workload.on_demand_admission.watermark=0.01\n"
                 "workload.poisson.num_requests=6\n"
                 "workload.poisson.prompt_tokens.lognormal.median_tokens=64\n"
                 "workload.poisson.prompt_tokens.lognormal.max_tokens=512\n"
                 "workload.poisson.output_tokens.lognormal.median_tokens=8\n"
                 "workload.poisson.output_tokens.lognormal.max_tokens=16\n"
                 "workload.prefill_chunk_tokens=100\n");
  write_seed(folder, "workload", Target::kConfig,
             std::string(1, kind_byte("workload")) +
                 "closed_loop { concurrency: 2 num_requests: 4 prompt_tokens { uniform { "
                 "min_tokens: 10 max_tokens: 20 } } output_tokens { lognormal { median_tokens: 8 "
                 "sigma: 0.5 min_tokens: 1 max_tokens: 30 } } }\nmax_batch_size: 4\n"
                 "prefill_chunk_tokens: 64\n");
  write_seed(folder, "policy-config", Target::kConfig,
             std::string(1, kind_byte("policy")) +
                 "name: \"tiered\"\nparam { name: \"hbm\" number: 0.3 }\n"
                 "param { name: \"prefetch\" text: \"differential\" }\n");
  write_seed(
      folder, "hardware-json", Target::kConfig,
      std::string(1, kind_byte("hardware")) +
          R"({"node": {"preset": "hgx-h100-8", "gpu": {"preset": "H200"}}, "num_nodes": 1})");
  write_seed(folder, "run-json", Target::kConfig,
             std::string(1, kind_byte("run")) +
                 R"({"hardware": {"node": {"preset": "gh200"}, "num_nodes": 1},
 "model": {"preset": "Qwen3-8B", "kv_dtype": "FP8_E4M3"}, "tensor_parallel_degree": 1,
 "workload": {"poisson": {"rate_per_s": 5, "num_requests": 6,
   "prompt_tokens": {"fixed_tokens": 300}, "output_tokens": {"fixed_tokens": 20}},
   "max_batch_size": 4, "prefill_chunk_tokens": 128},
 "policy": {"name": "tiered", "param": [{"name": "hbm", "number": 0.5}]},
 "tiering": {"synthetic_pattern": "chat", "prefetch_lookahead_layers": 2, "host_allocation": "PINNED",
   "copy_method": "SM_KERNELS"},
 "memory": {"runtime_reserve_gib": 2, "activation_workspace_gib": 1},
 "engine": {"iteration_overhead_us": 1750}, "seed": 7})");
  // Policy strings (a --compare list, then an --slo string).
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"tiered",
            "tiered:hbm=0.3,evict=0.1,delta=10,compress=0.5,recent=16,sinks=4,"
            "prefetch=differential\ntpot_p99=50ms,ttft_p99=2s"},
           {"compare", "full,tiered:hbm=0.5,evict=0.1,h2o:budget=16\ntpot_p50=40us"},
           {"budgets",
            "h2o:allocation=explicit,budgets=16/24/16/24/16/24/16/24/16/24/16/24/16/24/16/24/16/24/"
            "16/24/16/24\ne2e_latency_p90=1s"},
           {"pyramid", "h2o:budget=20,allocation=pyramid"},
           {"streaming", "streaming:sinks=4,window=8"},
           {"layouts", "full\ntpot_p99=50ms\n2@4x1+1@8x1,4@2x1,8x2,1x1"},
           {"layouts-auto", "full\nttft_p99=1s\nauto"}}) {
    write_seed(folder, name, Target::kPolicy, text);
  }
  // Measurement files: the live ones, and the reference.
  for (const fs::path sub :
       {"validation/measurements", "validation/measurements/h200-2026-11-30"}) {
    for (const auto& entry : fs::directory_iterator(source / sub)) {
      if (entry.path().extension() == ".json") {
        write_seed(folder, entry.path().stem().string(), Target::kLive, read_file(entry.path()));
      } else if (entry.path().extension() == ".textproto") {
        write_seed(folder, entry.path().stem().string(), Target::kReference,
                   read_file(entry.path()));
      }
    }
  }
  // A reference with its run inline and small.
  write_seed(folder, "inline", Target::kReference,
             "id: \"inline\"\ncitation: \"seed\"\nrun {" + std::string(kTinyRun) +
                 "\ncompare { name: \"tiered\" param { name: \"hbm\" number: 0.5 } }\n}\n"
                 "metric { policy_index: 1 metric: \"throughput_output_tokens_per_s\" "
                 "measured: 100 tolerance: 0.5 }\n");
  for (const auto& entry : fs::directory_iterator(source / "validation/published")) {
    write_seed(folder, entry.path().stem().string(), Target::kPublished, read_file(entry.path()));
  }
  write_seed(folder, "small", Target::kPublished,
             "id,source_title,source_url,source_locator,gpu,num_gpus,tensor_parallel,model,"
             "weight_dtype,batch_size,prompt_tokens,output_tokens,metric,value,unit,engine,notes\n"
             "x,\"a, b\",https://example.org,row 1,H100-SXM,1,1,Llama-3.1-8B,BF16,2,128,16,"
             "tpot_ms,7.5,ms,vLLM 0.6,\"a \"\"quoted\"\" note\"\n");
  write_seed(
      folder, "azure", Target::kRequests,
      std::string(1, '\0') + read_file(source / "configs/workloads/example-azure-format.csv"));
  write_seed(folder, "kvtier", Target::kRequests,
             std::string(1, '\1') +
                 "arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,200,5\n1.25,64,20\n");
  // Format byte 50: MOONCAKE_JSONL with hash blocks of 256 tokens.
  write_seed(folder, "mooncake", Target::kRequests,
             std::string(1, '\x32') +
                 "{\"timestamp\": 0, \"input_length\": 300, \"output_length\": 4, "
                 "\"hash_ids\": [0, 1]}\n"
                 "{\"timestamp\": 40, \"input_length\": 520, \"output_length\": 2, "
                 "\"hash_ids\": [0, 2, 3]}\n");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  kvtier::fuzz::write_seeds_if_asked(*argc, *argv, write_seeds);
  static_cast<void>(scratch());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const auto target = static_cast<Target>(data[0] % static_cast<std::uint8_t>(Target::kCount));
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::uint8_t second = rest.empty() ? 0 : static_cast<std::uint8_t>(rest.front());
  const std::string_view after_second = rest.empty() ? rest : rest.substr(1);
  try {
    switch (target) {
      case Target::kConfig: exercise_config(second, after_second); break;
      case Target::kPolicy: exercise_policy(rest); break;
      case Target::kLive: exercise_live(rest); break;
      case Target::kReference: exercise_reference(rest); break;
      case Target::kPublished: exercise_published(rest); break;
      case Target::kRequests: exercise_requests(second, after_second); break;
      case Target::kCount: break;
    }
  } catch (const kvtier::Error& error) {
    // A refused input (exit 2 or 3 at the CLI): the expected outcome. Any other exit code means
    // the tool failed on its own, which no text input should cause.
    kvtier::fuzz::print_error_if_asked(error);
    if (error.exit_code() != kvtier::ExitCode::kUsageOrConfig &&
        error.exit_code() != kvtier::ExitCode::kBadData) {
      std::fprintf(stderr, "kvtier::Error with exit code %d\n",
                   static_cast<int>(error.exit_code()));
      std::abort();
    }
  }
  return 0;
}
