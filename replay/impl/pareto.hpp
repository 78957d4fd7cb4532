#pragma once
// Two-objective Pareto bookkeeping for the budget search: minimise the mean budget, maximise
// the recall. Non-dominated sorting and crowding distance follow NSGA-II (Deb et al. 2002);
// every order is total (ties broken by index), so results do not depend on input permutations
// of equal points or on the standard library's sort.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::replay::detail {

struct Objectives {
  double mean_budget = 0.0;  // minimised
  double recall = 0.0;       // maximised
};

// a is no worse in both objectives and better in one.
[[nodiscard]] bool dominates(const Objectives& a, const Objectives& b);

// Non-dominated sorting depth of every point: 0 for points no other point dominates, 1 for the
// points only rank-0 points dominate, and so on.
[[nodiscard]] std::vector<std::uint32_t> pareto_ranks(std::span<const Objectives> points);

// Crowding distance of every point within its rank (NSGA-II): the normalised perimeter of the
// box its neighbours on the same front span; the ends of each front are infinite.
[[nodiscard]] std::vector<double> crowding_distances(std::span<const Objectives> points,
                                                     std::span<const std::uint32_t> ranks);

// Indices of the best `count` points by (rank ascending, crowding distance descending, index
// ascending): the NSGA-II environmental selection.
[[nodiscard]] std::vector<std::size_t> select_best(std::span<const Objectives> points,
                                                   std::size_t count);

// The rank-0 points, by mean budget ascending (then recall descending, then index). Points
// with equal objectives are all kept.
[[nodiscard]] std::vector<std::size_t> pareto_front(std::span<const Objectives> points);

// The knee of a front given in pareto_front order: with the mean budget and the recall each
// scaled to [0, 1] over the front, the point farthest above the chord from the front's first
// point to its last (the largest recall gained beyond the chord's straight-line trade-off).
// Equal distances: the lower mean budget. Returns a position in `front`.
[[nodiscard]] std::size_t knee_point(std::span<const Objectives> front);

}  // namespace kvtier::replay::detail
