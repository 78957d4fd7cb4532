#include "apps/plan_layouts.hpp"

#include <algorithm>

#include "apps/plan_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/pools.hpp"
#include "configs/validate.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"

namespace kvtier::app {
namespace {

// Policy p's canonical name, as the table gives it (every planned layout has it).
std::string canonical_policy(const std::vector<LayoutPlan>& plans, std::size_t p) {
  const auto planned = std::find_if(plans.begin(), plans.end(),
                                    [](const LayoutPlan& plan) { return plan.refused.empty(); });
  return planned->results[p].policy;
}

// For each policy, "best per GPU, P: TP 8 x PP 2, 123.4 output tokens/s a GPU", and with a
// target "fewest GPUs for the target, P: TP 8 x PP 2, 32 GPUs".
std::vector<std::string> best_lines(const std::vector<LayoutPlan>& plans, std::size_t policies,
                                    bool target) {
  std::vector<std::string> lines;
  const std::vector<int> best = best_layouts_per_gpu(plans, policies);
  const std::vector<int> fewest = fewest_gpu_layouts(plans, policies);
  for (std::size_t p = 0; p < policies; ++p) {
    const std::string policy = canonical_policy(plans, p);
    if (best[p] < 0) {
      lines.push_back("best per GPU, " + policy + ": no layout serves any load within the SLOs");
      continue;
    }
    const LayoutPlan& plan = plans[static_cast<std::size_t>(best[p])];
    lines.push_back("best per GPU, " + policy + ": " + serving::describe_layout(plan.layout) +
                    ", " + format_fixed(plan.results[p].output_tokens_per_s_per_gpu, 1) +
                    " output tokens/s a GPU");
    if (target) {
      const LayoutPlan& least = plans[static_cast<std::size_t>(fewest[p])];
      lines.push_back("fewest GPUs for the target, " + policy + ": " +
                      serving::describe_layout(least.layout) + ", " +
                      std::to_string(least.results[p].gpus) + " GPUs");
    }
  }
  return lines;
}

// "not planned, A, B: why" for the layouts refused, those refused for the same reason on one
// line, in the order of their first.
std::vector<std::string> refused_lines(const std::vector<LayoutPlan>& plans) {
  std::vector<std::string> reasons;
  std::vector<std::string> layouts;
  for (const LayoutPlan& plan : plans) {
    if (plan.refused.empty()) {
      continue;
    }
    const auto known = std::find(reasons.begin(), reasons.end(), plan.refused);
    const std::string named = serving::describe_layout(plan.layout);
    if (known == reasons.end()) {
      reasons.push_back(plan.refused);
      layouts.push_back(named);
    } else {
      layouts[static_cast<std::size_t>(known - reasons.begin())] += ", " + named;
    }
  }
  std::vector<std::string> lines;
  for (std::size_t r = 0; r < reasons.size(); ++r) {
    lines.push_back("not planned, " + layouts[r] + ": " + reasons[r]);
  }
  return lines;
}

// The header's name for the layouts compared: each, or how many when they are many.
std::string compared_layouts(const std::vector<LayoutPlan>& plans) {
  constexpr std::size_t kNamed = 16;
  if (plans.size() > kNamed) {
    return std::to_string(plans.size()) + " layouts";
  }
  std::string compared;
  for (const LayoutPlan& plan : plans) {
    compared += (compared.empty() ? "" : ", ") + serving::describe_layout(plan.layout);
  }
  return "layouts " + compared;
}

}  // namespace

std::vector<LayoutPlan> plan_layouts(const config::RunSpec& run,
                                     const std::vector<serving::Layout>& layouts,
                                     const serving::PlanOptions& options,
                                     const config::ConfigLoader& loader,
                                     const config::LocationMap& locations,
                                     serving::DemandMemo& memo) {
  // The options' own mistakes are the command's, whatever the layouts.
  serving::check_plan_options(run, options);
  std::vector<LayoutPlan> plans;
  for (const serving::Layout& layout : layouts) {
    LayoutPlan plan{layout, {}, {}};
    const config::RunSpec split = serving::with_layout(run, layout);
    if (const auto problems = config::validate(split, loader, locations); !problems.empty()) {
      plan.refused = problems.front().path + ": " + problems.front().what;
      plans.push_back(std::move(plan));
      continue;
    }
    try {
      (void)serving::plan_memory(split);
      if (config::pools_differ(split)) {
        const config::RunSpec prefill = config::prefill_pool_run(split);
        try {
          (void)serving::plan_memory(prefill);
        } catch (const ConfigError& error) {
          throw serving::prefill_pool_error(prefill, error);
        }
      }
    } catch (const ConfigError& error) {
      // The weights leave no room for KV on this split (or on the prefill engines').
      plan.refused = error.what();
      plans.push_back(std::move(plan));
      continue;
    }
    for (const config::RunSpec& alone : serving::runs_per_policy(split)) {
      try {
        plan.results.push_back(serving::plan_capacity(alone, options, &memo));
      } catch (const ConfigError& error) {
        // What the planner cannot do with this split (a workload too short to load it, a target
        // too large): the command's error, naming the layout.
        throw ConfigError("planning " + serving::describe_layout(layout) + ": " + error.what(),
                          error.where());
      }
    }
    plans.push_back(std::move(plan));
  }
  if (plans.empty()) {
    throw ConfigError("--layouts: no layout to plan");
  }
  if (std::all_of(plans.begin(), plans.end(),
                  [](const LayoutPlan& plan) { return !plan.refused.empty(); })) {
    throw ConfigError("--layouts: no layout can be planned; " +
                      serving::describe_layout(plans.front().layout) + ": " +
                      plans.front().refused);
  }
  return plans;
}

std::vector<int> fewest_gpu_layouts(const std::vector<LayoutPlan>& plans, std::size_t policies) {
  std::vector<int> fewest(policies, -1);
  for (std::size_t p = 0; p < policies; ++p) {
    for (std::size_t l = 0; l < plans.size(); ++l) {
      if (!plans[l].refused.empty() || !serving::serves_any(plans[l].results[p])) {
        continue;
      }
      const serving::PlanResult& result = plans[l].results[p];
      if (fewest[p] < 0) {
        fewest[p] = static_cast<int>(l);
        continue;
      }
      const serving::PlanResult& least = plans[static_cast<std::size_t>(fewest[p])].results[p];
      if (result.gpus < least.gpus ||
          (result.gpus == least.gpus &&
           result.output_tokens_per_s_per_gpu > least.output_tokens_per_s_per_gpu)) {
        fewest[p] = static_cast<int>(l);
      }
    }
  }
  return fewest;
}

std::vector<int> best_layouts_per_gpu(const std::vector<LayoutPlan>& plans, std::size_t policies) {
  std::vector<int> best(policies, -1);
  for (std::size_t p = 0; p < policies; ++p) {
    double most = 0.0;
    for (std::size_t l = 0; l < plans.size(); ++l) {
      if (!plans[l].refused.empty()) {
        continue;
      }
      const serving::PlanResult& result = plans[l].results[p];
      if (serving::serves_any(result) && result.output_tokens_per_s_per_gpu > most) {
        most = result.output_tokens_per_s_per_gpu;
        best[p] = static_cast<int>(l);
      }
    }
  }
  return best;
}

void write_layout_plans(const std::vector<LayoutPlan>& plans,
                        const std::vector<std::string>& policy_names, const config::RunSpec& run,
                        const serving::PlanOptions& options, const std::string& slo_text,
                        const std::string& file, Format format, std::ostream& out) {
  const bool closed_loop = run.workload().has_closed_loop();
  const bool target = options.has_target();
  const std::string compared = compared_layouts(plans);
  // Layouts that set the cluster's engines: the run's engine count says nothing of them.
  const auto setting = std::count_if(plans.begin(), plans.end(), [](const LayoutPlan& plan) {
    return plan.layout.sets_engines();
  });
  const ClusterEngines engines = setting == 0 ? ClusterEngines::kRun
                                 : setting == static_cast<std::ptrdiff_t>(plans.size())
                                     ? ClusterEngines::kEachLayout
                                     : ClusterEngines::kSomeLayouts;
  if (format == Format::kHtml) {
    std::vector<serving::PlanResult> results;
    std::vector<std::string> names;
    for (const LayoutPlan& plan : plans) {
      for (std::size_t p = 0; p < plan.results.size(); ++p) {
        results.push_back(plan.results[p]);
        names.push_back(serving::describe_layout(plan.layout) + ": " + policy_names[p]);
      }
    }
    std::vector<std::string> notes = best_lines(plans, policy_names.size(), target);
    const std::vector<std::string> refused = refused_lines(plans);
    notes.insert(notes.end(), refused.begin(), refused.end());
    out << plan_html(results, names, run, options, file, version_line(),
                     compared + " (a row per layout and policy)", notes, engines);
    return;
  }
  if (format == Format::kJson) {
    const std::vector<int> best = best_layouts_per_gpu(plans, policy_names.size());
    const std::vector<int> fewest = fewest_gpu_layouts(plans, policy_names.size());
    const auto key_or_null = [&plans](int index) {
      return index < 0
                 ? std::string("null")
                 : json_escape(serving::layout_key(plans[static_cast<std::size_t>(index)].layout));
    };
    out << "{\"run\": " << json_escape(file) << ", \"layouts\": [";
    for (std::size_t l = 0; l < plans.size(); ++l) {
      const LayoutPlan& plan = plans[l];
      const serving::Layout& layout = plan.layout;
      out << (l == 0 ? "" : ", ") << "{\"layout\": " << json_escape(serving::layout_key(layout))
          << ", \"tensor_parallel_degree\": " << layout.tensor_parallel
          << ", \"pipeline_parallel_degree\": " << layout.pipeline_stages
          << ", \"gpus_per_engine\": " << layout.gpus();
      if (layout.engines > 0) {
        out << ", \"engines\": " << layout.engines;
      }
      if (layout.pools()) {
        // The decode engines are split as above, the prefill engines so.
        out << ", \"prefill_engines\": " << layout.prefill_engines
            << ", \"prefill_tensor_parallel_degree\": " << layout.prefill_tensor_parallel
            << ", \"prefill_pipeline_parallel_degree\": " << layout.prefill_pipeline_stages
            << ", \"decode_engines\": " << layout.decode_engines;
      }
      if (run.has_cluster()) {
        // Of a layout refused, none: its split may not even count.
        out << ", \"cluster_gpus\": "
            << (plan.refused.empty()
                    ? std::to_string(serving::cluster_gpus(serving::with_layout(run, layout)))
                    : std::string("null"));
      }
      out << ", \"refused\": " << (plan.refused.empty() ? "null" : json_escape(plan.refused))
          << ", \"plans\": [";
      for (std::size_t p = 0; p < plan.results.size(); ++p) {
        out << (p == 0 ? "" : ", ")
            << plan_json(plan.results[p], options.slos, target, run.has_cluster());
      }
      out << "]}";
    }
    out << "], \"best\": [";
    for (std::size_t p = 0; p < policy_names.size(); ++p) {
      out << (p == 0 ? "" : ", ") << "{\"policy\": " << json_escape(canonical_policy(plans, p))
          << ", \"per_gpu\": " << key_or_null(best[p]);
      if (target) {
        out << ", \"fewest_gpus\": " << key_or_null(fewest[p]);
      }
      out << "}";
    }
    out << "]}\n";
    return;
  }
  write_plan_header(out, file, run, compared, slo_text, options, engines);
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  for (const LayoutPlan& plan : plans) {
    if (!plan.refused.empty()) {
      continue;
    }
    const PlanTable table = plan_table(plan.results, closed_loop, target);
    if (header.empty()) {
      // A cluster's layout is the GPUs of all its engines (its pools may differ).
      header = {"layout", run.has_cluster() ? "cluster GPUs" : "GPUs/engine"};
      header.insert(header.end(), table.header.begin(), table.header.end());
    }
    const std::uint64_t gpus = run.has_cluster()
                                   ? serving::cluster_gpus(serving::with_layout(run, plan.layout))
                                   : plan.layout.gpus();
    for (const auto& row : table.rows) {
      std::vector<std::string> full{serving::describe_layout(plan.layout), std::to_string(gpus)};
      full.insert(full.end(), row.begin(), row.end());
      rows.push_back(std::move(full));
    }
  }
  if (!rows.empty()) {
    TextTable table(header);
    for (const auto& row : rows) {
      table.add_row(row);
    }
    table.render(out);
    out << "\n";
  }
  for (const std::string& line : best_lines(plans, policy_names.size(), target)) {
    out << line << "\n";
  }
  for (const std::string& line : refused_lines(plans)) {
    out << line << "\n";
  }
  for (const LayoutPlan& plan : plans) {
    for (const serving::PlanResult& result : plan.results) {
      for (const std::string& note : result.notes) {
        out << "\nnote (" << serving::describe_layout(plan.layout) << ", " << result.policy
            << "): " << note << "\n";
      }
    }
  }
}

}  // namespace kvtier::app
