// The layouts `kvtier plan --layouts` compares: how an engine splits over tensor parallelism
// and pipeline stages.

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "serving/plan.hpp"

namespace kvtier::serving {
namespace {

// A whole number of at least 1 that fits 32 bits, all of `text`.
bool read_degree(std::string_view text, std::uint32_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 1;
}

}  // namespace

std::vector<Layout> candidate_layouts(const config::RunSpec& run) {
  const auto& hardware = run.hardware();
  const std::uint64_t nodes = hardware.has_num_nodes() ? std::max(hardware.num_nodes(), 1U) : 1;
  const std::uint64_t gpus = nodes * hardware.node().gpus_per_node();
  std::vector<Layout> layouts;
  for (std::uint64_t tp = 1; tp <= gpus; tp *= 2) {
    for (std::uint64_t stages = 1; tp * stages <= gpus; stages *= 2) {
      layouts.push_back({static_cast<std::uint32_t>(tp), static_cast<std::uint32_t>(stages)});
    }
  }
  if (layouts.size() > kMaxLayouts) {
    throw ConfigError("--layouts auto would compare " + std::to_string(layouts.size()) +
                      " layouts, more than " + std::to_string(kMaxLayouts) +
                      ": name the ones to compare (e.g. 8x2,16x1)");
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
    const std::size_t x = item.find('x');
    Layout layout;
    if (x == std::string::npos ||
        !read_degree(std::string_view(item).substr(0, x), layout.tensor_parallel) ||
        !read_degree(std::string_view(item).substr(x + 1), layout.pipeline_stages)) {
      constexpr std::size_t kShown = 32;
      throw ConfigError("--layouts '" +
                        (item.size() > kShown ? item.substr(0, kShown) + "..." : item) +
                        "' is not a layout: TPxSTAGES, whole numbers of at least 1 (e.g. 8x2), "
                        "or auto");
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
  return split;
}

std::string describe_layout(const Layout& layout) {
  return "TP " + std::to_string(layout.tensor_parallel) + " x PP " +
         std::to_string(layout.pipeline_stages);
}

}  // namespace kvtier::serving
