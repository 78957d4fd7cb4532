#pragma once
// Full validation of an attention trace (`kvtier trace validate`): the structure the reader
// checks on open, then every value: each decode row a probability distribution (sum 1 within
// row_sum_tolerance, no negative, NaN or infinite weight), top-k indices inside their row and
// distinct, residual masses consistent, prefill rows causal, key norms finite, tokens inside
// the vocabulary.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/errors.hpp"

namespace kvtier::traces {

struct TraceProblem {
  std::string what;
  std::string where;  // "FILE, dataset /attention/mean/layer_003, step 17"
};

struct ValidationReport {
  std::vector<TraceProblem> problems;
  // Problems of one kind in one dataset beyond the first few are counted, not listed.
  std::uint64_t unlisted_problems = 0;
  std::uint64_t rows_checked = 0;
  [[nodiscard]] bool valid() const noexcept { return problems.empty(); }
};

struct ValidationOptions {
  // Listed problems per dataset and kind of problem; the rest are counted.
  std::uint32_t max_listed_per_kind = 20;
  // Weights held in memory at once while scanning.
  std::uint64_t block_elements = 1U << 22;
};

// Never throws for a bad file: what cannot be opened is the report's one problem.
[[nodiscard]] ValidationReport validate_trace(const std::filesystem::path& path,
                                              const ValidationOptions& options = {});

// The report's problems as one DataError (exit 3) printing one line per problem.
class InvalidTrace : public DataError {
 public:
  explicit InvalidTrace(const ValidationReport& report);
  [[nodiscard]] std::vector<std::string> lines() const override;

 private:
  std::vector<std::string> lines_;
};

}  // namespace kvtier::traces
