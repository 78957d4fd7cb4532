// `kvtier replay run`: policies over one attention trace file, with the demand cache
// (docs/REPLAY.md, "kvtier replay run").

#include <memory>
#include <string>
#include <vector>

#include "apps/cli.hpp"
#include "apps/replay_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/demand_cache.hpp"
#include "replay/engine.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/trace_source.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

constexpr const char* kUsage =
    "usage: kvtier replay run --trace FILE --policy POLICY [--policy POLICY ...]\n"
    "                         [--out DEMAND.h5] [--cache-dir DIR] [--format text|json|html]\n\n"
    "Replays each policy over the trace and prints, per policy: the canonical policy string "
    "(every parameter), the attention mass kept (mean and minimum over steps and layers), the "
    "HBM fraction (mean and at the last step), the evicted fraction at the last step, tokens "
    "promoted, demoted and evicted, the T1 prefetch volumes (full: T1 tokens summed over steps "
    "and layers; differential: tokens newly placed in T1) and whether the demand came from the "
    "cache. Token counts are summed over layers. --format html prints a page that also charts, "
    "per decode step, the mass kept, the context by tier and what crosses PCIe, and per layer "
    "the mass kept and the HBM share.\n\n"
    "A policy is NAME:PARAM=VALUE,... (kvtier policies list). --out writes the demand file "
    "(one policy only). --cache-dir reads and writes demand files keyed by the trace's content "
    "hash and the canonical policy, so a repeated run reads instead of replaying. A trace with "
    "only top-k rows is replayed from reconstructed rows (residual spread uniformly).\n\n"
    "Exit codes: 2 for bad options, unknown policies or parameters; 3 for a bad trace or one "
    "that lacks data a policy needs.";

// Labels of the per-policy lines are padded to this width.
constexpr std::size_t kLabelWidth = 27;

std::string cache_cell(const replay::CachedReplay& result) {
  std::string text(replay::cache_outcome_name(result.outcome));
  if (!result.file.empty()) {
    text += " (" + result.file.string() + ")";
  }
  if (!result.note.empty()) {
    text += "; old entry not used: " + result.note;
  }
  return text;
}

void print_text(std::ostream& out, const replay::TraceAttention& trace,
                const std::vector<PolicyRun>& runs, const std::string& demand_file) {
  const traces::TraceShape& shape = trace.shape();
  const replay::DemandProvenance& first = runs.front().result.provenance;
  out << "trace    " << trace.name() << "\n"
      << "         " << first.model << ", layers " << shape.layers.first << ".."
      << shape.layers.end() - 1 << ", prompt " << shape.prompt_tokens << " tokens, " << shape.steps
      << " decode steps\n"
      << "rows     "
      << (trace.from_topk() ? "reconstructed from top-" + std::to_string(shape.top_k) +
                                  " entries (residual spread uniformly over the other positions)"
                            : std::string("head-mean"))
      << "\ncontent  xxh3-128 " << first.trace_hash << "\n";
  for (const PolicyRun& run : runs) {
    const replay::ReplaySummary summary = run.result.demand.summary();
    auto line = [&out](const std::string& label, const std::string& value) {
      out << label << std::string(kLabelWidth - label.size(), ' ') << value << "\n";
    };
    out << "\n";
    line("policy", run.result.provenance.policy);
    line("kept attention mass", "mean " + format_fixed(summary.mean_kept_mass, 5) + ", min " +
                                    format_fixed(summary.min_kept_mass, 5));
    line("HBM fraction", "mean " + format_fixed(summary.mean_hbm_fraction, 4) + ", final " +
                             format_fixed(summary.final_hbm_fraction, 4));
    line("evicted fraction", "final " + format_fixed(summary.final_evicted_fraction, 4));
    line("tokens moved", "promoted " + std::to_string(summary.promoted) + ", demoted " +
                             std::to_string(summary.demoted) + ", evicted " +
                             std::to_string(summary.evicted));
    line("T1 prefetch, full",
         std::to_string(summary.host_token_steps) + " token-steps (sum of T1 tokens)");
    line("T1 prefetch, differential",
         std::to_string(summary.newly_host) + " tokens (newly placed in T1)");
    line("cache", cache_cell(run.result));
  }
  if (!demand_file.empty()) {
    out << "\nwrote " << demand_file << "\n";
  }
}

void print_json(std::ostream& out, const replay::TraceAttention& trace,
                const std::vector<PolicyRun>& runs, const std::string& cache_dir,
                const std::string& demand_file) {
  const traces::TraceShape& shape = trace.shape();
  const replay::DemandProvenance& first = runs.front().result.provenance;
  auto optional_text = [](const std::string& text) {
    return text.empty() ? std::string("null") : json_escape(text);
  };
  out << "{\"trace\": {\"file\": " << json_escape(trace.name())
      << ", \"xxh3_128\": " << json_escape(first.trace_hash)
      << ", \"model\": " << json_escape(first.model) << ", \"first_layer\": " << shape.layers.first
      << ", \"layers\": " << shape.layers.count << ", \"prompt_tokens\": " << shape.prompt_tokens
      << ", \"steps\": " << shape.steps
      << ", \"rows\": " << (trace.from_topk() ? "\"topk_reconstructed\"" : "\"mean\"")
      << "},\n \"cache_dir\": " << optional_text(cache_dir) << ",\n \"policies\": [";
  bool first_run = true;
  for (const PolicyRun& run : runs) {
    const replay::ReplaySummary summary = run.result.demand.summary();
    out << (first_run ? "" : ",")
        << "\n  {\"policy\": " << json_escape(run.result.provenance.policy)
        << ", \"given\": " << json_escape(run.given)
        << ", \"mean_kept_mass\": " << format_double(summary.mean_kept_mass)
        << ", \"min_kept_mass\": " << format_double(summary.min_kept_mass)
        << ", \"mean_hbm_fraction\": " << format_double(summary.mean_hbm_fraction)
        << ", \"final_hbm_fraction\": " << format_double(summary.final_hbm_fraction)
        << ", \"final_evicted_fraction\": " << format_double(summary.final_evicted_fraction)
        << ", \"promoted\": " << summary.promoted << ", \"demoted\": " << summary.demoted
        << ", \"evicted\": " << summary.evicted
        << ", \"host_token_steps\": " << summary.host_token_steps
        << ", \"newly_host\": " << summary.newly_host
        << ", \"compressed_bits\": " << format_double(run.result.demand.compressed_bits())
        << ", \"compressed_scale_bytes_per_head_vector\": "
        << run.result.demand.compressed_format().scale_bytes_per_head_vector
        << ", \"cache\": " << json_escape(replay::cache_outcome_name(run.result.outcome))
        << ", \"cache_file\": " << optional_text(run.result.file.string())
        << ", \"cache_note\": " << optional_text(run.result.note) << "}";
    first_run = false;
  }
  out << "],\n \"demand_file\": " << optional_text(demand_file) << "}\n";
}

}  // namespace

int run_replay_run(const Arguments& args, Context& context) {
  po::options_description options("replay run options");
  options.add_options()("trace", po::value<std::string>()->required(), "attention trace (HDF5)")(
      "policy", po::value<std::vector<std::string>>()->required()->composing(),
      "policy NAME:PARAM=VALUE,...; repeatable")("out", po::value<std::string>(),
                                                 "write the demand file here (one --policy only)")(
      "cache-dir", po::value<std::string>(),
      "demand cache folder: reuse demand files keyed by trace content and policy");
  add_format_option(options, true);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values, kUsage, context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);
  const auto policies = values["policy"].as<std::vector<std::string>>();
  const std::string out_file = values.count("out") != 0U ? values["out"].as<std::string>() : "";
  const std::string cache_dir =
      values.count("cache-dir") != 0U ? values["cache-dir"].as<std::string>() : "";
  if (!out_file.empty() && policies.size() != 1) {
    throw ConfigError("--out takes the demand of one policy; " + std::to_string(policies.size()) +
                      " were given (use --cache-dir to keep several)");
  }
  if (values.count("out") != 0U) {
    check_output_file("--out", out_file, {values["trace"].as<std::string>()});
  }
  if (values.count("cache-dir") != 0U) {
    check_output_folder("--cache-dir", cache_dir);
  }

  // Every policy is checked before anything is replayed, so a typo in the last one does not
  // cost the replays of the others.
  const std::string trace_path = values["trace"].as<std::string>();
  replay::TraceAttention trace(trace_path);
  const replay::ReplayShape shape{trace.layers(), trace.prompt_tokens(), trace.steps()};
  const replay::PolicyRegistry registry = replay::builtin_policies();
  std::vector<config::PolicySpec> specs;
  // Every policy is checked against the trace before any is replayed (and cached), and a problem
  // names the policy it belongs to.
  for (const std::string& text : policies) {
    specs.push_back(replay::parse_policy_string(text));
    const std::unique_ptr<replay::Policy> policy = registry.create(specs.back(), shape);
    try {
      replay::check_inputs(trace, *policy);
    } catch (const DataError& error) {
      throw DataError("--policy " + text + ": " + error.what(), error.where());
    }
  }

  std::vector<PolicyRun> runs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    runs.push_back({policies[i], replay::cached_replay(trace_path, specs[i], cache_dir, registry)});
  }
  if (!out_file.empty()) {
    const replay::CachedReplay& result = runs.front().result;
    replay::write_demand_file(out_file, result.demand, result.provenance);
  }
  if (format == Format::kHtml) {
    context.out << replay_html(trace, runs, version_line());
  } else if (format == Format::kJson) {
    print_json(context.out, trace, runs, cache_dir, out_file);
  } else {
    print_text(context.out, trace, runs, out_file);
  }
  return 0;
}

}  // namespace kvtier::app
