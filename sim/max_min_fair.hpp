#pragma once
// Max-min fair sharing of link capacities among flows, by progressive filling (water-filling).
//
// Every flow's rate rises together until some link is full; the flows crossing that link are
// frozen at the fair share it allows, their rate is taken off every other link they cross, and
// the rest keep rising. The result is the unique allocation in which no flow can go faster
// without slowing a flow that is no faster than it — so a flow held back by a slow link
// elsewhere leaves its unused share of a fast link to the others.
//
// Deterministic: links and flows are visited in index order, with no hashing, so equal inputs
// give bit-identical rates.

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::sim {

// Scratch space reused between calls, so recomputing rates after every flow arrival or
// departure does not allocate.
struct MaxMinScratch {
  std::vector<double> remaining_capacity;
  std::vector<std::uint32_t> unfrozen_flows_on_link;
  std::vector<char> link_is_bottleneck;
  std::vector<char> flow_is_frozen;
};

// Writes each flow's rate into `rates` (same units as `capacities`). `capacities[l]` > 0;
// `paths[f]` lists the links flow f crosses: at least one, each index < capacities.size() (a
// link listed twice is charged twice, as a flow that crosses it twice would be). `rates.size()`
// must equal `paths.size()`. Violations throw std::invalid_argument.
void max_min_fair_rates(std::span<const double> capacities,
                        std::span<const std::span<const std::uint32_t>> paths,
                        std::span<double> rates, MaxMinScratch& scratch);

// Convenience form that allocates its own scratch and result.
[[nodiscard]] std::vector<double> max_min_fair_rates(
    std::span<const double> capacities, const std::vector<std::vector<std::uint32_t>>& paths);

}  // namespace kvtier::sim
