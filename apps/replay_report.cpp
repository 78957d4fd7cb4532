#include "apps/replay_report.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "replay/engine.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"

namespace kvtier::app {
namespace {

using Records = std::function<double(const replay::ReplayDemand&, std::uint64_t step)>;

constexpr std::array<const char*, replay::kTierCount> kTierNames = {"T0 HBM", "T1 host",
                                                                    "T2 compressed", "T3 evicted"};

// A line per policy of `value` over the decode steps.
report::LineChart steps_chart(const std::string& title, const std::string& unit,
                              const std::vector<PolicyRun>& runs, const Records& value) {
  report::LineChart chart;
  chart.title = title;
  chart.x.label = "decode step";
  chart.y.label = unit;
  chart.markers = false;
  for (const PolicyRun& run : runs) {
    const replay::ReplayDemand& demand = run.result.demand;
    report::LineSeries line{run.given, {}, {}};
    for (std::uint64_t step = 0; step < demand.steps(); ++step) {
      line.x.push_back(static_cast<double>(step));
      line.y.push_back(value(demand, step));
    }
    chart.series.push_back(std::move(line));
  }
  return chart;
}

double mean_kept(const replay::ReplayDemand& demand, std::uint64_t step) {
  double kept = 0.0;
  for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
    kept += demand.at(step, layer).kept_share();
  }
  return kept / demand.layers();
}

double lowest_kept(const replay::ReplayDemand& demand, std::uint64_t step) {
  double lowest = 1.0;
  for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
    lowest = std::min(lowest, demand.at(step, layer).kept_share());
  }
  return lowest;
}

// Σ over layers of a record's count.
Records summed(std::uint32_t replay::StepLayerRecord::*count) {
  return [count](const replay::ReplayDemand& demand, std::uint64_t step) {
    double total = 0.0;
    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
      total += demand.at(step, layer).*count;
    }
    return total;
  };
}

// A line per policy of a per-layer figure averaged over the steps.
report::LineChart layers_chart(const std::string& title, const std::string& unit,
                               const std::vector<PolicyRun>& runs, std::uint32_t first_layer,
                               const std::function<double(const replay::StepLayerRecord&)>& value) {
  report::LineChart chart;
  chart.title = title;
  chart.x.label = "layer";
  chart.y.label = unit;
  for (const PolicyRun& run : runs) {
    const replay::ReplayDemand& demand = run.result.demand;
    report::LineSeries line{run.given, {}, {}};
    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
      double sum = 0.0;
      for (std::uint64_t step = 0; step < demand.steps(); ++step) {
        sum += value(demand.at(step, layer));
      }
      line.x.push_back(static_cast<double>(first_layer + layer));
      line.y.push_back(demand.steps() > 0 ? sum / static_cast<double>(demand.steps()) : 0.0);
    }
    chart.series.push_back(std::move(line));
  }
  return chart;
}

double hbm_share(const replay::StepLayerRecord& record) {
  double total = 0.0;
  for (const std::uint32_t tokens : record.tokens) {
    total += tokens;
  }
  return total > 0.0 ? record.tokens[0] / total : 0.0;
}

}  // namespace

std::string replay_html(const replay::TraceAttention& trace, const std::vector<PolicyRun>& runs,
                        const std::string& version) {
  const traces::TraceShape& shape = trace.shape();
  const replay::DemandProvenance& first = runs.front().result.provenance;
  report::HtmlPage page("kvtier replay: " + trace.name());
  page.labelled("Trace:", first.model + ", layers " + std::to_string(shape.layers.first) + ".." +
                              std::to_string(shape.layers.end() - 1) + ", prompt " +
                              std::to_string(shape.prompt_tokens) + " tokens, " +
                              std::to_string(shape.steps) + " decode steps; rows " +
                              (trace.from_topk() ? "reconstructed from top-" +
                                                       std::to_string(shape.top_k) + " entries"
                                                 : std::string("head-mean")) +
                              "; content xxh3-128 " + first.trace_hash);
  page.labelled("Version:", version);

  page.heading(2, "Policies", "policies");
  std::vector<std::vector<std::string>> rows;
  for (const PolicyRun& run : runs) {
    const replay::ReplaySummary summary = run.result.demand.summary();
    rows.push_back(
        {run.given, format_fixed(summary.mean_kept_mass, 5), format_fixed(summary.min_kept_mass, 5),
         format_fixed(summary.mean_hbm_fraction, 4), format_fixed(summary.final_hbm_fraction, 4),
         format_fixed(summary.final_evicted_fraction, 4), std::to_string(summary.promoted),
         std::to_string(summary.demoted), std::to_string(summary.evicted),
         std::to_string(summary.host_token_steps), std::to_string(summary.newly_host)});
  }
  page.table({"policy", "kept mass, mean", "kept mass, min", "HBM share, mean", "HBM share, final",
              "evicted share, final", "promoted", "demoted", "evicted",
              "T1 token-steps (full prefetch)", "newly in T1 (differential)"},
             rows, {false, true, true, true, true, true, true, true, true, true, true});
  std::vector<std::string> canonical;
  canonical.reserve(runs.size());
  for (const PolicyRun& run : runs) {
    canonical.push_back(run.given + ": " + run.result.provenance.policy);
  }
  page.list(canonical);

  page.heading(2, "Attention mass kept", "mass");
  report::LineChart kept = steps_chart("Attention mass kept, mean over layers",
                                       "share of the step's attention", runs, mean_kept);
  kept.y.include_zero = false;
  page.add_raw(report::line_chart_svg(kept));
  report::LineChart lowest = steps_chart("Attention mass kept, the lowest layer",
                                         "share of the step's attention", runs, lowest_kept);
  lowest.y.include_zero = false;
  page.add_raw(report::line_chart_svg(lowest));

  page.heading(2, "Where the tokens are", "tiers");
  for (const PolicyRun& run : runs) {
    const replay::ReplayDemand& demand = run.result.demand;
    report::LineChart chart;
    chart.title = "The context by tier (" + run.given + ")";
    chart.x.label = "decode step";
    chart.y.label = "tokens, summed over layers";
    chart.markers = false;
    for (std::size_t tier = 0; tier < replay::kTierCount; ++tier) {
      report::LineSeries line{kTierNames[tier], {}, {}};
      for (std::uint64_t step = 0; step < demand.steps(); ++step) {
        double tokens = 0.0;
        for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
          tokens += demand.at(step, layer).tokens[tier];
        }
        line.x.push_back(static_cast<double>(step));
        line.y.push_back(tokens);
      }
      chart.series.push_back(std::move(line));
    }
    page.add_raw(report::line_chart_svg(chart));
  }

  page.heading(2, "What crosses PCIe", "pcie");
  page.add_raw(report::line_chart_svg(
      steps_chart("T1 tokens staged each step (full prefetch)", "tokens, summed over layers", runs,
                  [](const replay::ReplayDemand& demand, std::uint64_t step) {
                    double tokens = 0.0;
                    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
                      tokens += demand.at(step, layer).tokens[1];
                    }
                    return tokens;
                  })));
  page.add_raw(report::line_chart_svg(steps_chart(
      "Tokens newly placed in T1 each step (differential prefetch)", "tokens, summed over layers",
      runs, summed(&replay::StepLayerRecord::newly_host))));
  page.add_raw(report::line_chart_svg(steps_chart("Tokens promoted to HBM each step",
                                                  "tokens, summed over layers", runs,
                                                  summed(&replay::StepLayerRecord::promoted))));

  page.heading(2, "By layer", "layers");
  report::LineChart layer_kept =
      layers_chart("Attention mass kept by layer, mean over steps", "share of the step's attention",
                   runs, shape.layers.first,
                   [](const replay::StepLayerRecord& record) { return record.kept_share(); });
  layer_kept.y.include_zero = false;
  page.add_raw(report::line_chart_svg(layer_kept));
  page.add_raw(report::line_chart_svg(layers_chart("HBM share by layer, mean over steps",
                                                   "share of the layer's tokens", runs,
                                                   shape.layers.first, hbm_share)));
  return page.str();
}

}  // namespace kvtier::app
