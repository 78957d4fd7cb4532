#include "traces/attention_map.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/errors.hpp"

namespace kvtier::traces {
namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

AttentionMap attention_map(const TraceReader& reader, std::uint32_t layer,
                           const AttentionMapOptions& options) {
  if (options.step_bins == 0 || options.position_bins == 0 || options.steps_per_bin == 0) {
    throw ConfigError("an attention map needs at least one row, column and step per row");
  }
  const TraceShape& shape = reader.shape();
  if (!shape.has_layer(layer)) {
    throw DataError("layer " + std::to_string(layer) + " is not in the trace (layers " +
                        std::to_string(shape.layers.first) + ".." +
                        std::to_string(shape.layers.end() - 1) + ")",
                    reader.file_name());
  }
  AttentionMap map;
  map.layer = layer;
  map.from_topk = !shape.has_mean;
  map.steps = shape.steps;
  map.positions = shape.tokens();
  map.steps_per_bin = std::max<std::uint64_t>(1, ceil_div(map.steps, options.step_bins));
  map.step_bins = static_cast<std::uint32_t>(ceil_div(map.steps, map.steps_per_bin));
  map.positions_per_bin =
      std::max<std::uint64_t>(1, ceil_div(map.positions, options.position_bins));
  map.position_bins = static_cast<std::uint32_t>(ceil_div(map.positions, map.positions_per_bin));
  map.mass.assign(static_cast<std::size_t>(map.step_bins) * map.position_bins, 0.0);

  DenseRows dense;
  TopKRows topk;
  for (std::uint32_t row = 0; row < map.step_bins; ++row) {
    const std::uint64_t first = row * map.steps_per_bin;
    const std::uint64_t count = std::min(map.steps - first, map.steps_per_bin);
    const std::uint64_t reads = std::min<std::uint64_t>(count, options.steps_per_bin);
    double* cells = map.mass.data() + static_cast<std::size_t>(row) * map.position_bins;
    std::uint64_t reach = 0;  // positions the row's latest step read attends to
    for (std::uint64_t i = 0; i < reads; ++i) {
      // Evenly through the row's steps, its first and (with two or more) its last.
      const auto step =
          static_cast<std::uint32_t>(first + (reads == 1 ? 0 : i * (count - 1) / (reads - 1)));
      const std::uint64_t length = shape.row_length(step);
      reach = std::max(reach, length);
      const auto add = [&](std::uint64_t position, double weight) {
        cells[position / map.positions_per_bin] += weight / static_cast<double>(reads);
      };
      if (!map.from_topk) {
        reader.read_mean(layer, {step, 1}, dense);
        const std::span<const float> weights = dense.row(0);
        for (std::uint64_t p = 0; p < length; ++p) {
          add(p, static_cast<double>(weights[p]));
        }
        continue;
      }
      reader.read_topk(layer, {step, 1}, topk);
      for (std::uint32_t k = 0; k < topk.k; ++k) {
        const std::int32_t index = topk.indices[k];
        if (index == kTopKPadIndex) {
          continue;
        }
        if (index < 0 || static_cast<std::uint64_t>(index) >= length) {
          throw DataError("top-k index " + std::to_string(index) + " of layer " +
                              std::to_string(layer) + ", step " + std::to_string(step) +
                              " is outside its row of " + std::to_string(length) + " positions",
                          reader.file_name());
        }
        add(static_cast<std::uint64_t>(index), static_cast<double>(topk.weights[k]));
      }
    }
    for (std::uint32_t column = 0; column < map.position_bins; ++column) {
      if (column * map.positions_per_bin >= reach) {
        cells[column] = std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return map;
}

}  // namespace kvtier::traces
