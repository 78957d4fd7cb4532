// The layouts `kvtier plan --layouts` compares: how an engine splits over tensor parallelism
// and pipeline stages, and how a disaggregated cluster's pools split its GPUs.

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/options.pb.h"
#include "configs/schema/run.pb.h"
#include "serving/plan.hpp"

namespace kvtier::serving {
namespace {

// A whole number of at least 1 that fits 32 bits, all of `text`.
bool read_degree(std::string_view text, std::uint32_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 1;
}

// "TPxSTAGES" into its two degrees.
bool read_split(std::string_view text, std::uint32_t& tensor_parallel, std::uint32_t& stages) {
  const std::size_t x = text.find('x');
  return x != std::string_view::npos && read_degree(text.substr(0, x), tensor_parallel) &&
         read_degree(text.substr(x + 1), stages);
}

// "ENGINES@TPxSTAGES" into its engines and degrees.
bool read_pool(std::string_view text, std::uint32_t& engines, std::uint32_t& tensor_parallel,
               std::uint32_t& stages) {
  const std::size_t at = text.find('@');
  return at != std::string_view::npos && read_degree(text.substr(0, at), engines) &&
         read_split(text.substr(at + 1), tensor_parallel, stages);
}

// One item of --layouts: "TPxSTAGES", "N@TPxSTAGES" or "P@TPxSTAGES+D@TPxSTAGES".
bool read_layout(std::string_view item, Layout& layout) {
  const std::size_t plus = item.find('+');
  if (plus == std::string_view::npos) {
    return item.find('@') == std::string_view::npos
               ? read_split(item, layout.tensor_parallel, layout.pipeline_stages)
               : read_pool(item, layout.engines, layout.tensor_parallel, layout.pipeline_stages);
  }
  return read_pool(item.substr(0, plus), layout.prefill_engines, layout.prefill_tensor_parallel,
                   layout.prefill_pipeline_stages) &&
         read_pool(item.substr(plus + 1), layout.decode_engines, layout.tensor_parallel,
                   layout.pipeline_stages);
}

// cluster.engines' most (the schema's), which a layout's engines may not pass in all.
std::uint64_t most_engines() {
  const auto* field = config::ClusterSpec::descriptor()->FindFieldByName("engines");
  return static_cast<std::uint64_t>(field->options().GetExtension(config::max_value));
}

bool disaggregated(const config::RunSpec& run) {
  return run.has_cluster() && run.cluster().has_disaggregation();
}

// The run's hardware's GPUs: hardware.num_nodes (1 when absent) x gpus_per_node.
std::uint64_t hardware_gpus(const config::RunSpec& run) {
  const auto& hardware = run.hardware();
  const std::uint64_t nodes = hardware.has_num_nodes() ? std::max(hardware.num_nodes(), 1U) : 1;
  return nodes * hardware.node().gpus_per_node();
}

void check_count(std::size_t layouts, const char* example) {
  if (layouts > kMaxLayouts) {
    throw ConfigError("--layouts auto would compare " + std::to_string(layouts) +
                      " layouts, more than " + std::to_string(kMaxLayouts) +
                      ": name the ones to compare (e.g. " + example + ")");
  }
}

// Pools of one stage each, power-of-two TP, that take every one of `gpus` GPUs: `visit` is
// called with each.
template <typename Visit>
void for_each_pool_pair(std::uint64_t gpus, Visit visit) {
  for (std::uint64_t prefill_tp = 1; prefill_tp < gpus; prefill_tp *= 2) {
    for (std::uint64_t decode_tp = 1; decode_tp < gpus; decode_tp *= 2) {
      for (std::uint64_t prefill = 1; prefill * prefill_tp < gpus; ++prefill) {
        const std::uint64_t left = gpus - prefill * prefill_tp;
        if (left % decode_tp == 0) {
          visit(prefill, prefill_tp, left / decode_tp, decode_tp);
        }
      }
    }
  }
}

// The pairs of pools that fill `gpus` GPUs, beside `others` layouts already found: counted
// before they are built, so that hardware of thousands of GPUs is refused without building a
// list of millions.
std::vector<Layout> candidate_pools(std::uint64_t gpus, std::size_t others) {
  std::size_t count = others;
  for_each_pool_pair(gpus, [&count](auto, auto, auto, auto) { ++count; });
  check_count(count, "4@2x1,2@4x1+1@8x1");
  std::vector<Layout> layouts;
  for_each_pool_pair(gpus, [&layouts](std::uint64_t prefill, std::uint64_t prefill_tp,
                                      std::uint64_t decode, std::uint64_t decode_tp) {
    Layout layout;
    layout.prefill_engines = static_cast<std::uint32_t>(prefill);
    layout.prefill_tensor_parallel = static_cast<std::uint32_t>(prefill_tp);
    layout.decode_engines = static_cast<std::uint32_t>(decode);
    layout.tensor_parallel = static_cast<std::uint32_t>(decode_tp);
    layouts.push_back(layout);
  });
  return layouts;
}

}  // namespace

std::vector<Layout> candidate_layouts(const config::RunSpec& run) {
  const std::uint64_t gpus = hardware_gpus(run);
  const bool cluster = run.has_cluster();
  std::vector<Layout> layouts;
  // A disaggregated run's unified clusters in one stage: with its pools, within kMaxLayouts on
  // two nodes.
  const std::uint64_t most_stages = disaggregated(run) ? 1 : gpus;
  for (std::uint64_t tp = 1; tp <= gpus; tp *= 2) {
    for (std::uint64_t stages = 1; tp * stages <= gpus && stages <= most_stages; stages *= 2) {
      Layout layout{static_cast<std::uint32_t>(tp), static_cast<std::uint32_t>(stages)};
      if (cluster) {
        layout.engines = static_cast<std::uint32_t>(std::min(gpus / (tp * stages), most_engines()));
      }
      layouts.push_back(layout);
    }
  }
  if (disaggregated(run)) {
    const std::vector<Layout> pools = candidate_pools(gpus, layouts.size());
    layouts.insert(layouts.end(), pools.begin(), pools.end());
  }
  check_count(layouts.size(), disaggregated(run) ? "4@2x1,2@4x1+1@8x1"
                              : cluster          ? "4@2x1,2@4x1"
                                                 : "8x2,16x1");
  if (layouts.empty()) {
    throw ConfigError("--layouts auto: the hardware's " + std::to_string(gpus) +
                      " GPU(s) hold no layout; name the layouts to compare");
  }
  return layouts;
}

std::vector<Layout> parse_layouts(const std::string& text, const config::RunSpec& run) {
  if (text == "auto") {
    return candidate_layouts(run);
  }
  std::vector<Layout> layouts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    constexpr std::size_t kShown = 32;
    const std::string shown = item.size() > kShown ? item.substr(0, kShown) + "..." : item;
    Layout layout;
    if (!read_layout(item, layout)) {
      throw ConfigError("--layouts '" + shown +
                        "' is not a layout: TPxSTAGES, whole numbers of at least 1 (e.g. 8x2), "
                        "N@TPxSTAGES for a cluster's engines (e.g. 4@2x1), "
                        "P@TPxSTAGES+D@TPxSTAGES for a disaggregated run's prefill and decode "
                        "engines (e.g. 2@4x1+1@8x1), or auto");
    }
    if (layout.pools() && !disaggregated(run)) {
      throw ConfigError("--layouts '" + shown +
                        "' splits a disaggregated cluster's pools, and the run has no "
                        "cluster.disaggregation");
    }
    if (layout.engines > 0 && !run.has_cluster()) {
      throw ConfigError("--layouts '" + shown +
                        "' sets a cluster's engines, and the run has no cluster (run.cluster)");
    }
    if (std::uint64_t{layout.engines} + layout.prefill_engines + layout.decode_engines >
        most_engines()) {
      throw ConfigError("--layouts '" + shown + "' has more than " +
                        std::to_string(most_engines()) + " engines in all (cluster.engines' most)");
    }
    if (std::find(layouts.begin(), layouts.end(), layout) != layouts.end()) {
      throw ConfigError("--layouts names " + item + " twice");
    }
    layouts.push_back(layout);
    if (layouts.size() > kMaxLayouts) {
      throw ConfigError("--layouts names more than " + std::to_string(kMaxLayouts) + " layouts");
    }
    begin = comma + 1;
  }
  return layouts;
}

config::RunSpec with_layout(const config::RunSpec& run, const Layout& layout) {
  config::RunSpec split = run;
  split.set_tensor_parallel_degree(layout.tensor_parallel);
  if (layout.pipeline_stages > 1) {
    split.set_pipeline_parallel_degree(layout.pipeline_stages);
  } else {
    split.clear_pipeline_parallel_degree();
  }
  if (layout.engines > 0) {
    split.mutable_cluster()->set_engines(layout.engines);
    split.mutable_cluster()->clear_disaggregation();
  }
  if (layout.pools()) {
    auto& cluster = *split.mutable_cluster();
    cluster.set_engines(layout.prefill_engines + layout.decode_engines);
    auto& pools = *cluster.mutable_disaggregation();
    pools.set_prefill_engines(layout.prefill_engines);
    auto& prefill = *pools.mutable_prefill_parallelism();
    prefill.set_tensor_parallel_degree(layout.prefill_tensor_parallel);
    prefill.set_pipeline_parallel_degree(layout.prefill_pipeline_stages);
  }
  return split;
}

std::string describe_layout(const Layout& layout) {
  const auto split = [](std::uint32_t tp, std::uint32_t stages) {
    return "TP " + std::to_string(tp) + " x PP " + std::to_string(stages);
  };
  if (layout.engines > 0) {
    return std::to_string(layout.engines) + " x " +
           split(layout.tensor_parallel, layout.pipeline_stages);
  }
  if (!layout.pools()) {
    return split(layout.tensor_parallel, layout.pipeline_stages);
  }
  return "prefill " + std::to_string(layout.prefill_engines) + " x " +
         split(layout.prefill_tensor_parallel, layout.prefill_pipeline_stages) + " + decode " +
         std::to_string(layout.decode_engines) + " x " +
         split(layout.tensor_parallel, layout.pipeline_stages);
}

std::string layout_key(const Layout& layout) {
  const auto split = [](std::uint32_t tp, std::uint32_t stages) {
    return std::to_string(tp) + "x" + std::to_string(stages);
  };
  if (layout.engines > 0) {
    return std::to_string(layout.engines) + "@" +
           split(layout.tensor_parallel, layout.pipeline_stages);
  }
  if (!layout.pools()) {
    return split(layout.tensor_parallel, layout.pipeline_stages);
  }
  return std::to_string(layout.prefill_engines) + "@" +
         split(layout.prefill_tensor_parallel, layout.prefill_pipeline_stages) + "+" +
         std::to_string(layout.decode_engines) + "@" +
         split(layout.tensor_parallel, layout.pipeline_stages);
}

}  // namespace kvtier::serving
