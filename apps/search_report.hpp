#pragma once
// The page `kvtier replay search-budgets --format html` prints.

#include <cstdint>
#include <string>
#include <vector>

#include "replay/budget_search.hpp"

namespace kvtier::app {

// The traces a search ran over, as opened and checked before it started.
struct SearchInputs {
  std::vector<std::string> calibration;
  std::vector<std::string> held_out;  // the calibration traces when none were given
  bool has_held_out = false;
  std::uint32_t layers = 0;
  bool in_memory = false;          // calibration traces replayed from memory
  std::uint64_t memory_bytes = 0;  // what holding them takes
};

// Everything the search-budgets reports (text, json, html) say.
struct SearchReport {
  std::string base;
  const SearchInputs& inputs;
  const replay::SearchOptions& options;
  const replay::SearchResult& result;
  const std::vector<replay::UniformComparison>& comparisons;
  std::string out_file;  // the front's CSV, or empty
};

// "64/128/96": per-layer budgets as every report of the search writes them.
[[nodiscard]] std::string joined_budgets(const std::vector<std::uint64_t>& budgets);

// The search and its traces; every budget vector evaluated, recall against mean budget, with
// the Pareto front and the winner marked; the front alone, and as a table; the winner rescaled
// to each target against uniform on the held-out traces, charted and as a table; the winner's
// and the rescaled budgets by layer, and the winner's recall by layer; every evaluation, folded.
[[nodiscard]] std::string search_html(const SearchReport& report, const std::string& version);

}  // namespace kvtier::app
