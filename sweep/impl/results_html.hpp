#pragma once
// results.html: a sweep's results as a page for people (docs/SWEEPS.md, "The report"). Each
// headline metric (kHeadlineMetrics) is charted against one axis, one line per policy and
// combination of the other axes' values, split into several charts when one would hold more
// lines than can be told apart; then the points that could not run and the table.

#include <string>

#include "sweep/impl/folder.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep::detail {

// The axis along x: of the axes with several values, the one with the most (ties: one whose
// values are all numbers, then the earlier). A ZIP sweep of several axes is charted against its
// points, each named by its values.
[[nodiscard]] std::string results_html(const ResultTable& table, const Manifest& manifest);

// Lines on one chart at most; more are split over charts by the other axes' values.
inline constexpr std::size_t kMaxLinesPerChart = 14;
// Rows the page's table shows at most (results.csv has all).
inline constexpr std::size_t kMaxTableRows = 2000;

}  // namespace kvtier::sweep::detail
