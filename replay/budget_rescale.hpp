#pragma once
// Stage 3 of the MOSAIC per-layer budget search (REFERENCE.md §1.3; docs/REPLAY.md, "Budget
// search"): a winner's per-layer budget shape, found at one mean budget, rescaled to any other
// mean budget so that the budgets sum to exactly target × layers and stay inside the bounds.

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::replay {

// Tokens a layer may hold between steps. MOSAIC searches b_l ∈ [64, 4096] (floor 16 in some
// runs).
struct BudgetBounds {
  std::uint64_t floor = 64;
  std::uint64_t cap = 4096;
};

// ConfigError unless 1 ≤ floor ≤ cap ≤ 2^24 (16M tokens, beyond any context; the limit keeps
// the rescaling's arithmetic exact to well under a millionth of a token).
void check_budget_bounds(const BudgetBounds& bounds);

// Rescales `shape` (per-layer budgets; any non-negative values) to mean `target_mean`:
//   1. affine map b_l = floor + (w_l − floor)·(T − L·floor)/(Σw − L·floor), T = target × L: it
//      sends the shape's mean to the target and keeps the floor fixed, so a layer the search
//      held at the floor stays there and the excess over the floor scales (a shape whose mean
//      is at or below the floor has no excess to scale and is shifted instead: b_l = w_l + (T −
//      Σw)/L);
//   2. clamp to the cap, then to the floor;
//   3. the remainder T − Σb is spread over the layers not at a bound, in proportion to their
//      budgets; layers pushed past a bound are clamped and the rest spread again (when every
//      layer that could move sits at a bound, all layers that can move in the needed direction
//      share it);
//   4. largest-remainder rounding: every layer gets ⌊b_l⌋ and the T − Σ⌊b_l⌋ largest fractional
//      parts one token more (equal fractions: the lower layer first).
// The result sums to exactly target_mean × shape.size(), each entry in [floor, cap].
// ConfigError for an empty shape, bad bounds, or a target outside [floor, cap] (no vector in
// the bounds has that mean).
[[nodiscard]] std::vector<std::uint64_t> rescale_budgets(std::span<const std::uint64_t> shape,
                                                         std::uint64_t target_mean,
                                                         const BudgetBounds& bounds = {});

// Largest-remainder rounding, step 4 above and PyramidKV's allocation (replay/registry.hpp):
// non-negative `values` to integers summing to `total`, each ⌊v⌋ and the total − Σ⌊v⌋ largest
// fractional parts one more (equal fractions: the lower index first), none taken by an entry at
// `cap`. Values are compared in millionths of a token, so fractions equal in exact arithmetic
// but not in a double's last bits tie. std::logic_error when the total is out of that reach.
[[nodiscard]] std::vector<std::uint64_t> round_to_total(std::span<const double> values,
                                                        std::uint64_t total,
                                                        std::uint64_t cap = UINT64_MAX);

}  // namespace kvtier::replay
