#pragma once
// The pages `kvtier validate --format html` prints.

#include <string>
#include <vector>

#include "validation/live.hpp"
#include "validation/published.hpp"
#include "validation/reference.hpp"

namespace kvtier::app {

// The median of |relative error| over the projected points (0 when none is).
[[nodiscard]] double median_abs_error(const std::vector<validation::Projection>& projections);
// "12.3%", or "inf" for a figure measured as 0 and projected otherwise.
[[nodiscard]] std::string percent(double fraction);

// The tables text and html share: a row per point (id, gpu, tp, model, batch, in/out, metric,
// published, projected, error or why it was skipped) and per figure (id, policy, metric,
// measured, projected, error, tolerance, verdict), with their headers and numeric columns.
struct ValidationTable {
  std::vector<std::string> header;
  std::vector<bool> numeric;
  std::vector<std::vector<std::string>> rows;
};
[[nodiscard]] ValidationTable published_table(
    const std::vector<validation::Projection>& projections);
[[nodiscard]] ValidationTable figures_table(const std::vector<validation::ReferenceCheck>& checks);

// Published measurements against their projections: how many were projected and within 10%
// and 20%, the median error; a parity chart per metric (log scales, y = x and ±10%, a colour per
// GPU); every point in a table with its source.
[[nodiscard]] std::string published_html(const std::vector<validation::Projection>& projections,
                                         const std::string& file, const std::string& version);

// Measurement files' figures against their projections: for each file, its compared figures
// as the share of their tolerance the error takes (over 1: outside; a figure of tolerance 0 is 0
// when exact); every figure in a table, skipped ones with the reason; then each live run step by
// step (time, context by tier, bytes copied each way, attention mass kept).
[[nodiscard]] std::string measurements_html(const std::vector<validation::ReferenceCheck>& checks,
                                            const std::vector<validation::LiveSteps>& live,
                                            const std::string& version);

}  // namespace kvtier::app
