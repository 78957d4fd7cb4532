#include "replay/impl/pareto.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kvtier::replay::detail {

bool dominates(const Objectives& a, const Objectives& b) {
  return a.mean_budget <= b.mean_budget && a.recall >= b.recall &&
         (a.mean_budget < b.mean_budget || a.recall > b.recall);
}

std::vector<std::uint32_t> pareto_ranks(std::span<const Objectives> points) {
  // O(n²) per front: the search evaluates a few hundred points at most.
  constexpr std::uint32_t kUnranked = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> ranks(points.size(), kUnranked);
  std::size_t ranked = 0;
  for (std::uint32_t rank = 0; ranked < points.size(); ++rank) {
    std::vector<std::size_t> front;
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (ranks[i] != kUnranked) {
        continue;
      }
      bool dominated = false;
      for (std::size_t j = 0; j < points.size() && !dominated; ++j) {
        dominated = ranks[j] == kUnranked && dominates(points[j], points[i]);
      }
      if (!dominated) {
        front.push_back(i);
      }
    }
    for (const std::size_t i : front) {
      ranks[i] = rank;
    }
    ranked += front.size();
  }
  return ranks;
}

std::vector<double> crowding_distances(std::span<const Objectives> points,
                                       std::span<const std::uint32_t> ranks) {
  std::vector<double> distance(points.size(), 0.0);
  const std::uint32_t fronts =
      ranks.empty() ? 0 : *std::max_element(ranks.begin(), ranks.end()) + 1;
  for (std::uint32_t rank = 0; rank < fronts; ++rank) {
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (ranks[i] == rank) {
        members.push_back(i);
      }
    }
    for (const auto value : {&Objectives::mean_budget, &Objectives::recall}) {
      std::sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
        return points[a].*value != points[b].*value ? points[a].*value < points[b].*value : a < b;
      });
      const double span = points[members.back()].*value - points[members.front()].*value;
      distance[members.front()] = std::numeric_limits<double>::infinity();
      distance[members.back()] = std::numeric_limits<double>::infinity();
      if (span <= 0) {
        continue;
      }
      for (std::size_t k = 1; k + 1 < members.size(); ++k) {
        distance[members[k]] +=
            (points[members[k + 1]].*value - points[members[k - 1]].*value) / span;
      }
    }
  }
  return distance;
}

std::vector<std::size_t> select_best(std::span<const Objectives> points, std::size_t count) {
  const auto ranks = pareto_ranks(points);
  const auto distance = crowding_distances(points, ranks);
  std::vector<std::size_t> order(points.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (ranks[a] != ranks[b]) {
      return ranks[a] < ranks[b];
    }
    if (distance[a] != distance[b]) {
      return distance[a] > distance[b];
    }
    return a < b;
  });
  order.resize(std::min(count, order.size()));
  return order;
}

std::vector<std::size_t> pareto_front(std::span<const Objectives> points) {
  const auto ranks = pareto_ranks(points);
  std::vector<std::size_t> front;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (ranks[i] == 0) {
      front.push_back(i);
    }
  }
  std::sort(front.begin(), front.end(), [&](std::size_t a, std::size_t b) {
    if (points[a].mean_budget != points[b].mean_budget) {
      return points[a].mean_budget < points[b].mean_budget;
    }
    if (points[a].recall != points[b].recall) {
      return points[a].recall > points[b].recall;
    }
    return a < b;
  });
  return front;
}

std::size_t knee_point(std::span<const Objectives> front) {
  if (front.size() < 3) {
    return 0;  // no interior point: the cheaper end
  }
  const Objectives& first = front.front();
  const Objectives& last = front.back();
  const double budget_span = last.mean_budget - first.mean_budget;
  const double recall_span = last.recall - first.recall;
  if (budget_span <= 0 || recall_span <= 0) {
    return 0;
  }
  std::size_t best = 0;
  double best_gain = 0.0;
  for (std::size_t k = 0; k < front.size(); ++k) {
    // After scaling, the chord is y = x; the distance above it is (y − x)/√2.
    const double x = (front[k].mean_budget - first.mean_budget) / budget_span;
    const double y = (front[k].recall - first.recall) / recall_span;
    if (y - x > best_gain) {
      best_gain = y - x;
      best = k;
    }
  }
  return best;
}

}  // namespace kvtier::replay::detail
