#pragma once
// Heuristic seeds for the budget search from measured per-layer recall: every replay reports
// the attention each layer kept, so after the uniform vectors of the initial design the search
// knows how fast each layer's recall grows with its budget. For policies whose layers evict
// independently (h2o, snapkv, adakv, knorm) a layer's recall depends on its own budget only, and
// the best split of a total budget is the fractional knapsack over each layer's concave
// recall curve; for others it is still a sensible starting shape. MOSAIC seeds its refinement
// with heuristic shapes too (REFERENCE.md §1.3, stage 4).

#include <cstdint>
#include <vector>

#include "replay/budget_rescale.hpp"

namespace kvtier::replay::detail {

struct RecallSample {
  double budget = 0.0;
  double recall = 0.0;
};

// samples[l]: layer l's measured (budget, recall) pairs, at least one at the floor. Returns the
// per-layer budgets with mean `mean_budget` (an integer, within the bounds) that maximise the
// sum of the layers' upper concave envelopes of recall (straight lines between samples): the
// envelope's segments are filled in order of recall gained per token (ties: lower layer, then
// lower budget); budget left once every segment is full (beyond the largest sample) is spread
// evenly. The result sums to exactly mean_budget × layers.
[[nodiscard]] std::vector<std::uint64_t> profile_allocation(
    const std::vector<std::vector<RecallSample>>& samples, std::uint64_t mean_budget,
    const BudgetBounds& bounds);

}  // namespace kvtier::replay::detail
