#pragma once
// Stages 1–2 of the MOSAIC per-layer budget search (REFERENCE.md §1.3; docs/REPLAY.md, "Budget
// search"): over per-layer budget vectors b ∈ [floor, cap]^L, minimise the mean budget and
// maximise the attention recall that a budgeted policy (h2o, snapkv, adakv, knorm) keeps when
// replayed with those budgets over calibration traces. Differential evolution proposes
// candidates; a small MLP, trained on the Pareto ranks of the points evaluated so far, screens
// the proposals so that only the most promising are replayed. Beside them, allocations built
// from the per-layer recall every replay measures (replay/impl/layer_profile.hpp) seed the
// design and each generation. The result is the Pareto front and one winner shape, which
// stage 3 (replay/budget_rescale.hpp) rescales to any mean budget.
//
// Output depends only on the inputs and the seed, never on the number of threads: a
// generation's candidates are replayed in parallel and merged in proposal order.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "replay/attention.hpp"
#include "replay/budget_rescale.hpp"
#include "replay/policy.hpp"
#include "replay/registry.hpp"

namespace kvtier::replay {

// The recall a per-layer budget vector earns in each layer (kept attention mass, in [0, 1]);
// the vector's recall is their mean. Called from several threads at once, so it must be
// thread-safe, and deterministic for the search to be.
using RecallFunction = std::function<std::vector<double>(std::span<const std::uint64_t> budgets)>;

// Opens a fresh source over one trace; called from worker threads, one source per replay.
using SourceFactory = std::function<std::unique_ptr<AttentionSource>()>;

// The policy string that runs `base` ("h2o" or "h2o:recent=0.3") with per-layer `budgets`:
// "h2o:recent=0.3,allocation=explicit,budgets=64/128/96" (the registry sets `budget` to the
// list's mean); a uniform vector is written
// as the uniform allocation ("h2o:recent=0.3,budget=96"), the baseline's own string.
[[nodiscard]] std::string explicit_budget_policy(const std::string& base,
                                                 std::span<const std::uint64_t> budgets);

// ConfigError unless `base` is a policy string of the registry whose policy takes per-layer
// budgets (it declares a `budgets` parameter) and sets none of budget, allocation, budgets
// (the search sets them).
void check_base_policy(const PolicyRegistry& registry, const std::string& base);

// Recall from replay: `base` with the budgets replayed over every source; each layer's mean
// kept attention mass over the steps, averaged with equal weight per source (the mean over
// layers is the replay summary's mean_kept_mass). ConfigError when a source's layer count
// differs from the vector's length.
class ReplayRecall {
 public:
  ReplayRecall(const PolicyRegistry& registry, std::string base,
               std::vector<SourceFactory> sources);
  [[nodiscard]] std::vector<double> operator()(std::span<const std::uint64_t> budgets) const;

 private:
  const PolicyRegistry* registry_;
  std::string base_;
  std::vector<SourceFactory> sources_;
};

// A read-only copy of a trace held in memory, shared by all its copies: many threads can
// replay it at once without re-reading the file (copies are cheap; factory() hands them out).
class MemoryTrace final : public AttentionSource {
 public:
  // Reads every step of `source`: the head-mean rows and the optional data in `inputs`.
  explicit MemoryTrace(AttentionSource& source, std::span<const PolicyInput> inputs = {});
  // rows[step][layer], each prompt + step + 1 weights (as InMemoryAttention).
  MemoryTrace(std::uint32_t layers, std::uint64_t prompt_tokens,
              std::vector<std::vector<std::vector<float>>> rows, std::string name);

  [[nodiscard]] SourceFactory factory() const;

  [[nodiscard]] std::uint32_t layers() const override;
  [[nodiscard]] std::uint64_t prompt_tokens() const override;
  [[nodiscard]] std::uint64_t steps() const override;
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::uint32_t heads() const override;
  void read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::uint32_t prefill_window() const override;
  [[nodiscard]] std::vector<float> read_prefill_window(std::uint32_t layer) override;
  [[nodiscard]] std::uint32_t kv_heads() const override;
  [[nodiscard]] std::vector<float> read_key_norms(std::uint32_t layer) override;
  [[nodiscard]] std::string name() const override;

 private:
  struct Data;
  std::shared_ptr<const Data> data_;
};

struct SearchOptions {
  BudgetBounds bounds;
  std::uint32_t evaluations = 180;  // recall evaluations (replays of the calibration set)
  std::uint64_t seed = 1;
  unsigned jobs = 1;  // threads replaying candidates; never changes the result
  // The winner: 0 for the knee of the front (pareto.hpp knee_point); otherwise the front point
  // with the best recall at a mean budget of at most this many tokens.
  std::uint64_t winner_max_mean = 0;
  // false: DE's first proposals are replayed without the classifier's screening (to measure
  // what the screening buys; bench/budget_search.cpp).
  bool screening = true;
};

struct BudgetPoint {
  std::vector<std::uint64_t> budgets;
  double mean_budget = 0.0;
  double recall = 0.0;               // mean of layer_recall
  std::vector<double> layer_recall;  // per layer
  std::uint32_t evaluation = 0;      // 1-based, in evaluation order
  std::uint32_t generation = 0;      // 0: the initial design
};

struct SearchResult {
  std::vector<BudgetPoint> evaluated;  // every point, in evaluation order
  std::vector<BudgetPoint> front;      // the non-dominated points, by mean budget ascending
  std::size_t winner = 0;              // position in `front`
  std::string winner_rule;             // how the winner was chosen, for reports
  std::uint32_t generations = 0;       // DE generations after the initial design
  std::uint64_t proposals = 0;         // DE proposals the classifier screened
};

// Runs stages 1–2 for `layers` layers. ConfigError for bad options (bounds, no evaluations,
// no threads); errors from `recall` pass through (the lowest candidate's, whatever the threads).
[[nodiscard]] SearchResult search_budgets(std::uint32_t layers, const RecallFunction& recall,
                                          const SearchOptions& options);

// The winner rescaled to each target mean budget (stage 3) against the uniform allocation at
// the same mean, both scored by `recall` (typically held-out traces).
struct UniformComparison {
  std::uint64_t target_mean = 0;
  std::vector<std::uint64_t> budgets;  // the rescaled winner
  double searched_recall = 0.0;
  double uniform_recall = 0.0;
};
[[nodiscard]] std::vector<UniformComparison> compare_with_uniform(
    const RecallFunction& recall, std::span<const std::uint64_t> winner,
    std::span<const std::uint64_t> target_means, const BudgetBounds& bounds, unsigned jobs);

}  // namespace kvtier::replay
