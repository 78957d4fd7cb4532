#include "replay/budget_rescale.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"

namespace kvtier::replay {
namespace {

constexpr std::uint64_t kLargestCap = std::uint64_t{1} << 24;
// Rounding works on budgets in millionths of a token: fractions that are equal in exact
// arithmetic but differ in the last bits of a double become equal again, so "ties to the lower
// layer" holds for them too.
constexpr double kUnitsPerToken = 1e6;

double clamp_to_bounds(double value, const BudgetBounds& bounds) {
  // Cap before floor (REFERENCE.md §1.3); the order matters only for bounds that the check
  // rejects, but it is the documented rule.
  value = std::min(value, static_cast<double>(bounds.cap));
  return std::max(value, static_cast<double>(bounds.floor));
}

// Step 3: spreads total − Σb over the layers that can take it until the sum is the total.
void redistribute(std::vector<double>& budgets, double total, const BudgetBounds& bounds) {
  const auto floor = static_cast<double>(bounds.floor);
  const auto cap = static_cast<double>(bounds.cap);
  // Each pass either ends the loop or pins at least one more layer to the bound it moves
  // towards (the remainder keeps its sign), and the fallback opens every layer once: 2L + 2
  // passes always suffice.
  for (std::size_t pass = 0; pass < 2 * budgets.size() + 2; ++pass) {
    const double remainder = total - std::accumulate(budgets.begin(), budgets.end(), 0.0);
    if (std::abs(remainder) < 0.5 / kUnitsPerToken) {
      return;
    }
    const bool grow = remainder > 0;
    const auto movable = [&](double b) { return grow ? b < cap : b > floor; };
    const auto inside = [&](double b) { return b > floor && b < cap; };
    double weight = 0.0;
    bool any_inside = false;
    for (const double b : budgets) {
      if (inside(b)) {
        any_inside = true;
        weight += b;
      }
    }
    if (!any_inside) {
      // Every layer sits at a bound, e.g. layers at the cap and at the floor with the
      // remainder positive: the floor layers are the only ones left to take it.
      for (const double b : budgets) {
        weight += movable(b) ? b : 0.0;
      }
    }
    if (weight <= 0) {
      throw std::logic_error("rescale_budgets: no layer can take the remainder");
    }
    for (double& b : budgets) {
      if (any_inside ? inside(b) : movable(b)) {
        b = clamp_to_bounds(b + remainder * b / weight, bounds);
      }
    }
  }
}

}  // namespace

void check_budget_bounds(const BudgetBounds& bounds) {
  if (bounds.floor < 1) {
    throw ConfigError("the budget floor must be at least 1 token");
  }
  if (bounds.cap > kLargestCap) {
    throw ConfigError("the budget cap " + std::to_string(bounds.cap) + " is above " +
                      std::to_string(kLargestCap) + " tokens");
  }
  if (bounds.floor > bounds.cap) {
    throw ConfigError("the budget floor " + std::to_string(bounds.floor) + " is above the cap " +
                      std::to_string(bounds.cap));
  }
}

std::vector<std::uint64_t> rescale_budgets(std::span<const std::uint64_t> shape,
                                           std::uint64_t target_mean, const BudgetBounds& bounds) {
  check_budget_bounds(bounds);
  if (shape.empty()) {
    throw ConfigError("cannot rescale a budget shape of no layers");
  }
  if (target_mean < bounds.floor || target_mean > bounds.cap) {
    throw ConfigError("target mean budget " + std::to_string(target_mean) +
                      " is infeasible: every layer holds between the floor " +
                      std::to_string(bounds.floor) + " and the cap " + std::to_string(bounds.cap) +
                      " tokens, so the mean must lie in that range");
  }
  const auto layers = static_cast<double>(shape.size());
  const auto floor = static_cast<double>(bounds.floor);
  const double total = static_cast<double>(target_mean) * layers;
  double shape_total = 0.0;
  for (const std::uint64_t w : shape) {
    shape_total += static_cast<double>(w);
  }

  // 1. Affine map, then 2. clamp.
  std::vector<double> budgets(shape.size());
  const double excess = shape_total - layers * floor;
  for (std::size_t l = 0; l < shape.size(); ++l) {
    const auto w = static_cast<double>(shape[l]);
    const double mapped = excess > 0 ? floor + (w - floor) * ((total - layers * floor) / excess)
                                     : w + (total - shape_total) / layers;
    budgets[l] = clamp_to_bounds(mapped, bounds);
  }
  // 3. Remainder among the layers not at a bound.
  redistribute(budgets, total, bounds);

  // 4. Largest remainder.
  return round_to_total(budgets, target_mean * shape.size(), bounds.cap);
}

std::vector<std::uint64_t> round_to_total(std::span<const double> values, std::uint64_t total,
                                          std::uint64_t cap) {
  const auto units_per_token = static_cast<std::int64_t>(kUnitsPerToken);
  std::vector<std::uint64_t> result(values.size());
  std::vector<std::int64_t> fractions(values.size());
  auto missing = static_cast<std::int64_t>(total);
  for (std::size_t l = 0; l < values.size(); ++l) {
    const std::int64_t units = std::llround(values[l] * kUnitsPerToken);
    result[l] = static_cast<std::uint64_t>(units / units_per_token);
    fractions[l] = units % units_per_token;
    missing -= static_cast<std::int64_t>(result[l]);
  }
  std::vector<std::size_t> order;
  for (std::size_t l = 0; l < values.size(); ++l) {
    if (result[l] < cap) {
      order.push_back(l);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return fractions[a] > fractions[b]; });
  if (missing < 0 || static_cast<std::size_t>(missing) > order.size()) {
    throw std::logic_error("round_to_total: rounding is " + std::to_string(missing) +
                           " tokens off the total");
  }
  for (std::int64_t i = 0; i < missing; ++i) {
    ++result[order[static_cast<std::size_t>(i)]];
  }
  return result;
}

}  // namespace kvtier::replay
