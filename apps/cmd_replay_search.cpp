// `kvtier replay search-budgets`: MOSAIC-style per-layer budget search over attention traces
// (docs/REPLAY.md, "Budget search").

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "apps/cli.hpp"
#include "apps/search_report.hpp"
#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/budget_search.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/trace_source.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

constexpr const char* kUsage =
    "usage: kvtier replay search-budgets --traces FILE... --base-policy POLICY\n"
    "           [--held-out FILE...] [--evaluations N] [--seed S] [--floor 64] [--cap 4096]\n"
    "           [--target-mean B ...] [--winner-max-mean B] [--jobs N] [--memory MiB]\n"
    "           [--format text|json|html] [--out front.csv]\n\n"
    "Searches per-layer KV budgets for a budgeted policy (h2o, snapkv, pyramidkv, adakv, knorm; "
    "any "
    "policy taking allocation=explicit): minimise the mean budget, maximise the attention "
    "recall (mean kept mass) replayed over the calibration traces. Differential evolution "
    "proposes budget vectors in [floor, cap]; an MLP trained on the Pareto ranks of the points "
    "evaluated so far screens the proposals before they are replayed. Prints the Pareto front, "
    "the winner (the front's knee, or with --winner-max-mean the best recall at or under that "
    "mean budget), and the winner rescaled to each --target-mean (default: the winner's own "
    "mean) against the uniform allocation at the same mean, both replayed over the --held-out "
    "traces (the calibration traces when none are given). --format html prints a page that "
    "also charts every budget vector evaluated (recall against mean budget, the front and the "
    "winner marked), the comparison with uniform and the budgets by layer. --out writes the "
    "front as CSV.\n\n"
    "Same traces, options and seed give the same output, whatever --jobs.\n\n"
    "Exit codes: 2 for bad options or policies; 3 for bad traces or traces that lack data the "
    "policy needs.";

// Opens every trace once, up front, so that a bad file fails before the search starts, and
// checks that all of them share one layer count (one budget per layer must fit every trace).
SearchInputs open_traces(const po::variables_map& values) {
  SearchInputs inputs;
  inputs.calibration = values["traces"].as<std::vector<std::string>>();
  if (values.count("held-out") != 0U) {
    inputs.held_out = values["held-out"].as<std::vector<std::string>>();
    inputs.has_held_out = true;
  } else {
    inputs.held_out = inputs.calibration;
  }
  std::string first;
  for (const auto* files : {&inputs.calibration, &inputs.held_out}) {
    for (const std::string& file : *files) {
      const replay::TraceAttention trace(file);
      if (first.empty()) {
        first = file;
        inputs.layers = trace.layers();
      } else if (trace.layers() != inputs.layers) {
        throw ConfigError("trace has " + std::to_string(trace.layers()) + " layers, " + first +
                              " has " + std::to_string(inputs.layers) +
                              ": one budget vector cannot serve both",
                          file);
      }
    }
  }
  return inputs;
}

// A trace file read by replays on several threads. Each replay opens its own reader, as
// docs/TRACE_FORMAT.md asks, and every call into HDF5 (opening, reads, closing) holds one lock,
// so the search is safe with an HDF5 built without thread safety too; the replay's own work
// runs outside the lock.
class LockedTrace final : public replay::AttentionSource {
 public:
  explicit LockedTrace(const std::string& file) {
    const std::lock_guard lock(mutex());
    trace_ = std::make_unique<replay::TraceAttention>(file);
  }
  LockedTrace(const LockedTrace&) = delete;
  LockedTrace& operator=(const LockedTrace&) = delete;
  ~LockedTrace() override {
    const std::lock_guard lock(mutex());
    trace_.reset();
  }

  [[nodiscard]] std::uint32_t layers() const override { return trace_->layers(); }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return trace_->prompt_tokens(); }
  [[nodiscard]] std::uint64_t steps() const override { return trace_->steps(); }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override {
    const std::lock_guard lock(mutex());
    trace_->read_step(step, rows);
  }
  [[nodiscard]] std::uint32_t heads() const override { return trace_->heads(); }
  void read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override {
    const std::lock_guard lock(mutex());
    trace_->read_head_step(step, rows);
  }
  [[nodiscard]] std::uint32_t prefill_window() const override { return trace_->prefill_window(); }
  [[nodiscard]] std::vector<float> read_prefill_window(std::uint32_t layer) override {
    const std::lock_guard lock(mutex());
    return trace_->read_prefill_window(layer);
  }
  [[nodiscard]] std::uint32_t kv_heads() const override { return trace_->kv_heads(); }
  [[nodiscard]] std::vector<float> read_key_norms(std::uint32_t layer) override {
    const std::lock_guard lock(mutex());
    return trace_->read_key_norms(layer);
  }
  [[nodiscard]] std::string name() const override { return trace_->name(); }

 private:
  static std::mutex& mutex() {
    static std::mutex instance;
    return instance;
  }
  std::unique_ptr<replay::TraceAttention> trace_;
};

std::vector<replay::SourceFactory> factories(const std::vector<std::string>& files) {
  std::vector<replay::SourceFactory> sources;
  sources.reserve(files.size());
  for (const std::string& file : files) {
    sources.emplace_back([file] { return std::make_unique<LockedTrace>(file); });
  }
  return sources;
}

// What replaying a trace from memory takes: its rows as floats, per head too when the policy
// reads per-head rows (prefill windows and key norms are small beside them).
std::uint64_t memory_bytes(const replay::TraceAttention& trace, bool head_rows) {
  const std::uint64_t prompt = trace.prompt_tokens();
  const std::uint64_t steps = trace.steps();
  const std::uint64_t weights = trace.layers() * (steps * prompt + steps * (steps + 1) / 2);
  return sizeof(float) * weights * (1 + (head_rows ? trace.heads() : 0));
}

// The calibration traces are replayed once per evaluation: when they fit in `limit` bytes they
// are read once and replayed from memory (about 4x faster than decoding the file again, see
// docs/REPLAY.md), otherwise every replay streams its file.
std::vector<replay::SourceFactory> calibration_sources(
    SearchInputs& inputs, const std::vector<replay::PolicyInput>& policy_inputs,
    std::uint64_t limit) {
  const bool head_rows = std::find(policy_inputs.begin(), policy_inputs.end(),
                                   replay::PolicyInput::kHeadRows) != policy_inputs.end();
  for (const std::string& file : inputs.calibration) {
    inputs.memory_bytes += memory_bytes(replay::TraceAttention(file), head_rows);
  }
  inputs.in_memory = inputs.memory_bytes <= limit;
  if (!inputs.in_memory) {
    return factories(inputs.calibration);
  }
  std::vector<replay::SourceFactory> sources;
  for (const std::string& file : inputs.calibration) {
    replay::TraceAttention trace(file);
    sources.push_back(replay::MemoryTrace(trace, policy_inputs).factory());
  }
  return sources;
}

std::string json_budgets(const std::vector<std::uint64_t>& budgets) {
  std::string text = "[";
  for (std::size_t l = 0; l < budgets.size(); ++l) {
    text += (l == 0 ? "" : ", ") + std::to_string(budgets[l]);
  }
  return text + "]";
}

std::string json_files(const std::vector<std::string>& files) {
  std::string text = "[";
  for (std::size_t i = 0; i < files.size(); ++i) {
    text += (i == 0 ? "" : ", ") + json_escape(files[i]);
  }
  return text + "]";
}

std::string front_csv(const replay::SearchResult& result) {
  std::string text = "mean_budget,recall,evaluation,generation,winner,budgets\n";
  for (std::size_t k = 0; k < result.front.size(); ++k) {
    const replay::BudgetPoint& point = result.front[k];
    text += format_double(point.mean_budget) + "," + format_double(point.recall) + "," +
            std::to_string(point.evaluation) + "," + std::to_string(point.generation) + "," +
            (k == result.winner ? "1" : "0") + "," + joined_budgets(point.budgets) + "\n";
  }
  return text;
}

void print_text(std::ostream& out, const SearchReport& report) {
  const replay::SearchResult& result = report.result;
  out << "search    " << report.base << ", " << report.inputs.layers << " layers, budgets in ["
      << report.options.bounds.floor << ", " << report.options.bounds.cap << "], seed "
      << report.options.seed << "\n"
      << "traces    " << report.inputs.calibration.size() << " calibration ("
      << (report.inputs.in_memory ? "replayed from memory, " : "replayed from the files, ")
      << format_fixed(static_cast<double>(report.inputs.memory_bytes) / (1 << 20), 1)
      << " MiB of rows), "
      << (report.inputs.has_held_out ? std::to_string(report.inputs.held_out.size()) + " held-out"
                                     : std::string("no held-out (comparison on calibration)"))
      << "\n"
      << "evaluated " << result.evaluated.size() << " budget vectors: initial design, then "
      << result.generations << " DE generations screening " << result.proposals << " proposals\n\n"
      << "Pareto front (" << result.front.size() << " points):\n";
  TextTable front({"mean budget", "recall", "eval", "budgets"}, {true, true, true, false});
  for (std::size_t k = 0; k < result.front.size(); ++k) {
    const replay::BudgetPoint& point = result.front[k];
    front.add_row({format_fixed(point.mean_budget, 1), format_fixed(point.recall, 5),
                   std::to_string(point.evaluation) + (k == result.winner ? " *" : ""),
                   joined_budgets(point.budgets)});
  }
  front.render(out);
  const replay::BudgetPoint& winner = result.front[result.winner];
  out << "\nwinner (*) " << result.winner_rule << ": mean " << format_fixed(winner.mean_budget, 1)
      << ", recall " << format_fixed(winner.recall, 5) << "\n\n"
      << "Winner rescaled against uniform at equal mean budget, on "
      << (report.inputs.has_held_out ? "the held-out traces" : "the calibration traces") << ":\n";
  TextTable table({"target", "searched", "uniform", "gain", "budgets"},
                  {true, true, true, true, false});
  for (const replay::UniformComparison& c : report.comparisons) {
    const double gain = c.searched_recall - c.uniform_recall;
    table.add_row({std::to_string(c.target_mean), format_fixed(c.searched_recall, 5),
                   format_fixed(c.uniform_recall, 5),
                   (gain >= 0 ? "+" : "") + format_fixed(gain, 5), joined_budgets(c.budgets)});
  }
  table.render(out);
  if (!report.out_file.empty()) {
    out << "\nwrote " << report.out_file << "\n";
  }
}

void print_json(std::ostream& out, const SearchReport& report) {
  const replay::SearchResult& result = report.result;
  const auto point_json = [&](const replay::BudgetPoint& point) {
    return "{\"mean_budget\": " + format_double(point.mean_budget) +
           ", \"recall\": " + format_double(point.recall) +
           ", \"evaluation\": " + std::to_string(point.evaluation) +
           ", \"generation\": " + std::to_string(point.generation) +
           ", \"budgets\": " + json_budgets(point.budgets) + "}";
  };
  out << "{\"base_policy\": " << json_escape(report.base)
      << ", \"layers\": " << report.inputs.layers
      << ",\n \"calibration\": " << json_files(report.inputs.calibration)
      << ", \"calibration_in_memory\": " << (report.inputs.in_memory ? "true" : "false")
      << ",\n \"held_out\": "
      << (report.inputs.has_held_out ? json_files(report.inputs.held_out) : "null")
      << ",\n \"floor\": " << report.options.bounds.floor
      << ", \"cap\": " << report.options.bounds.cap << ", \"seed\": " << report.options.seed
      << ", \"evaluations\": " << result.evaluated.size()
      << ", \"generations\": " << result.generations << ", \"proposals\": " << result.proposals
      << ",\n \"front\": [";
  for (std::size_t k = 0; k < result.front.size(); ++k) {
    out << (k == 0 ? "" : ",") << "\n  " << point_json(result.front[k]);
  }
  const replay::BudgetPoint& winner = result.front[result.winner];
  out << "],\n \"winner\": {\"rule\": " << json_escape(result.winner_rule) << ", \"policy\": "
      << json_escape(replay::explicit_budget_policy(report.base, winner.budgets))
      << ", \"point\": " << point_json(winner) << ", \"layer_recall\": [";
  for (std::size_t l = 0; l < winner.layer_recall.size(); ++l) {
    out << (l == 0 ? "" : ", ") << format_double(winner.layer_recall[l]);
  }
  out << "]},\n \"comparison\": [";
  for (std::size_t k = 0; k < report.comparisons.size(); ++k) {
    const replay::UniformComparison& c = report.comparisons[k];
    out << (k == 0 ? "" : ",") << "\n  {\"target_mean\": " << c.target_mean
        << ", \"searched_recall\": " << format_double(c.searched_recall)
        << ", \"uniform_recall\": " << format_double(c.uniform_recall)
        << ", \"policy\": " << json_escape(replay::explicit_budget_policy(report.base, c.budgets))
        << ", \"budgets\": " << json_budgets(c.budgets) << "}";
  }
  out << "],\n \"front_csv\": "
      << (report.out_file.empty() ? std::string("null") : json_escape(report.out_file)) << "}\n";
}

}  // namespace

int run_replay_search_budgets(const Arguments& args, Context& context) {
  po::options_description options("replay search-budgets options");
  const replay::SearchOptions defaults;
  options.add_options()(
      "traces", po::value<std::vector<std::string>>()->required()->multitoken()->composing(),
      "calibration traces (HDF5) the recall is replayed over")(
      "base-policy", po::value<std::string>()->required(),
      "budgeted policy, NAME or NAME:PARAM=VALUE,... without budget parameters")(
      "held-out", po::value<std::vector<std::string>>()->multitoken()->composing(),
      "traces for the comparison against uniform (default: the calibration traces)")(
      "evaluations", po::value<std::uint32_t>()->default_value(defaults.evaluations),
      "budget vectors replayed in all")(
      "seed", po::value<std::uint64_t>()->default_value(defaults.seed), "random seed")(
      "floor", po::value<std::uint64_t>()->default_value(defaults.bounds.floor),
      "fewest tokens a layer may hold")(
      "cap", po::value<std::uint64_t>()->default_value(defaults.bounds.cap),
      "most tokens a layer may hold")(
      "target-mean", po::value<std::vector<std::uint64_t>>()->multitoken()->composing(),
      "mean budgets to rescale the winner to (default: the winner's own, rounded)")(
      "winner-max-mean", po::value<std::uint64_t>()->default_value(0),
      "pick the best recall at or under this mean budget instead of the knee (0: the knee)")(
      "jobs", po::value<unsigned>()->default_value(1), "threads replaying candidates")(
      "memory", po::value<std::uint64_t>()->default_value(1024),
      "MiB: calibration traces that fit are replayed from memory, others from their files")(
      "out", po::value<std::string>(), "write the Pareto front here (CSV)");
  add_format_option(options, true);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values, kUsage, context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);
  replay::SearchOptions search;
  search.bounds = {values["floor"].as<std::uint64_t>(), values["cap"].as<std::uint64_t>()};
  search.evaluations = values["evaluations"].as<std::uint32_t>();
  search.seed = values["seed"].as<std::uint64_t>();
  search.jobs = values["jobs"].as<unsigned>();
  search.winner_max_mean = values["winner-max-mean"].as<std::uint64_t>();
  const std::string out_file = values.count("out") != 0U ? values["out"].as<std::string>() : "";
  if (values.count("out") != 0U) {
    check_output_file("--out", out_file, given_paths(values, {"traces", "held-out"}));
  }
  std::vector<std::uint64_t> targets;
  if (values.count("target-mean") != 0U) {
    targets = values["target-mean"].as<std::vector<std::uint64_t>>();
  }

  // Every option is checked before a trace is read, and every trace before anything is
  // replayed, so a mistake costs no search time.
  replay::check_budget_bounds(search.bounds);
  if (search.evaluations == 0) {
    throw ConfigError("--evaluations must be at least 1");
  }
  if (search.jobs == 0) {
    throw ConfigError("--jobs must be at least 1");
  }
  for (const std::uint64_t target : targets) {
    if (target < search.bounds.floor || target > search.bounds.cap) {
      throw ConfigError("--target-mean " + std::to_string(target) + " is outside [" +
                        std::to_string(search.bounds.floor) + ", " +
                        std::to_string(search.bounds.cap) +
                        "]: no budget vector within the floor and cap has that mean");
    }
  }
  if (search.winner_max_mean != 0 && search.winner_max_mean < search.bounds.floor) {
    throw ConfigError("--winner-max-mean is below the floor");
  }
  const std::string base = values["base-policy"].as<std::string>();
  const replay::PolicyRegistry registry = replay::builtin_policies();
  replay::check_base_policy(registry, base);
  SearchInputs inputs = open_traces(values);
  std::vector<replay::PolicyInput> policy_inputs;
  {
    // The base policy's own parameters, checked against the traces' shape.
    const replay::TraceAttention first(inputs.calibration.front());
    const auto policy =
        registry.create(replay::parse_policy_string(replay::explicit_budget_policy(
                            base, std::vector<std::uint64_t>(inputs.layers, search.bounds.floor))),
                        {first.layers(), first.prompt_tokens(), first.steps()});
    policy_inputs = policy->inputs();
  }
  const std::uint64_t memory_limit = values["memory"].as<std::uint64_t>() << 20;
  const replay::ReplayRecall calibration(registry, base,
                                         calibration_sources(inputs, policy_inputs, memory_limit));
  const replay::SearchResult result = replay::search_budgets(inputs.layers, calibration, search);
  const replay::BudgetPoint& winner = result.front[result.winner];
  if (targets.empty()) {
    targets.push_back(static_cast<std::uint64_t>(std::llround(winner.mean_budget)));
  }
  const replay::ReplayRecall held_out(registry, base, factories(inputs.held_out));
  const std::vector<replay::UniformComparison> comparisons =
      replay::compare_with_uniform(held_out, winner.budgets, targets, search.bounds, search.jobs);

  if (!out_file.empty()) {
    write_file_atomically(out_file, front_csv(result));
  }
  const SearchReport report{base, inputs, search, result, comparisons, out_file};
  if (format == Format::kHtml) {
    context.out << search_html(report, version_line());
  } else if (format == Format::kJson) {
    print_json(context.out, report);
  } else {
    print_text(context.out, report);
  }
  return 0;
}

}  // namespace kvtier::app
