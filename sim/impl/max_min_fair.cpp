#include "sim/max_min_fair.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace kvtier::sim {
namespace {

void check_inputs(std::span<const double> capacities,
                  std::span<const std::span<const std::uint32_t>> paths, std::size_t rate_count) {
  if (rate_count != paths.size()) {
    throw std::invalid_argument("sim::max_min_fair_rates: one rate per flow expected");
  }
  for (const double capacity : capacities) {
    if (!(capacity > 0.0)) {
      throw std::invalid_argument("sim::max_min_fair_rates: link capacities must be > 0");
    }
  }
  for (const auto path : paths) {
    if (path.empty()) {
      throw std::invalid_argument("sim::max_min_fair_rates: a flow crosses no link");
    }
    for (const std::uint32_t link : path) {
      if (link >= capacities.size()) {
        throw std::invalid_argument("sim::max_min_fair_rates: a flow crosses an unknown link");
      }
    }
  }
}

}  // namespace

void max_min_fair_rates(std::span<const double> capacities,
                        std::span<const std::span<const std::uint32_t>> paths,
                        std::span<double> rates, MaxMinScratch& scratch) {
  check_inputs(capacities, paths, rates.size());
  const std::size_t link_count = capacities.size();
  const std::size_t flow_count = paths.size();
  scratch.remaining_capacity.assign(capacities.begin(), capacities.end());
  scratch.unfrozen_flows_on_link.assign(link_count, 0);
  scratch.link_is_bottleneck.assign(link_count, 0);
  scratch.flow_is_frozen.assign(flow_count, 0);
  for (const auto path : paths) {
    for (const std::uint32_t link : path) {
      ++scratch.unfrozen_flows_on_link[link];
    }
  }

  std::size_t frozen = 0;
  while (frozen < flow_count) {
    // The water level: the smallest equal share any link can still give its unfrozen flows.
    double level = std::numeric_limits<double>::infinity();
    for (std::size_t link = 0; link < link_count; ++link) {
      if (scratch.unfrozen_flows_on_link[link] > 0) {
        level = std::min(level,
                         scratch.remaining_capacity[link] / scratch.unfrozen_flows_on_link[link]);
      }
    }
    // Links at that level are full; mark them before freezing anything, so every flow frozen in
    // this round is frozen for the same reason.
    for (std::size_t link = 0; link < link_count; ++link) {
      scratch.link_is_bottleneck[link] =
          scratch.unfrozen_flows_on_link[link] > 0 &&
          scratch.remaining_capacity[link] / scratch.unfrozen_flows_on_link[link] <= level;
    }
    for (std::size_t flow = 0; flow < flow_count; ++flow) {
      if (scratch.flow_is_frozen[flow] != 0) {
        continue;
      }
      const auto path = paths[flow];
      const bool bottlenecked = std::any_of(path.begin(), path.end(), [&](std::uint32_t link) {
        return scratch.link_is_bottleneck[link] != 0;
      });
      if (!bottlenecked) {
        continue;
      }
      rates[flow] = level;
      scratch.flow_is_frozen[flow] = 1;
      ++frozen;
      for (const std::uint32_t link : path) {
        // Rounding can leave a full link a hair below zero; it has no flows left to share it.
        scratch.remaining_capacity[link] = std::max(0.0, scratch.remaining_capacity[link] - level);
        --scratch.unfrozen_flows_on_link[link];
      }
    }
  }
}

std::vector<double> max_min_fair_rates(std::span<const double> capacities,
                                       const std::vector<std::vector<std::uint32_t>>& paths) {
  std::vector<std::span<const std::uint32_t>> views(paths.begin(), paths.end());
  std::vector<double> rates(paths.size(), 0.0);
  MaxMinScratch scratch;
  max_min_fair_rates(capacities, views, rates, scratch);
  return rates;
}

}  // namespace kvtier::sim
