#pragma once
// A KV policy decides, step by step, where each token of each layer lives. The replay engine
// appends each step's token (in HBM), accounts the step's attention mass by tier, then hands
// the policy the attention its model would have produced (evicted tokens' share removed) so it
// can update its scores and move tokens.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "replay/placement.hpp"

namespace kvtier::replay {

struct ReplayShape {
  std::uint32_t layers = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t steps = 0;
};

// One step as a policy sees it.
struct StepView {
  std::uint64_t step = 0;
  // rows[l][i]: attention of the step's query to token i in layer l, from the full-cache trace.
  const std::vector<std::vector<float>>& rows;
  // kept_mass[l]: the share of rows[l] on tokens that are not evicted. A policy that wants the
  // attention its own model would have seen scales rows[l][i] by 1 / kept_mass[l] for tokens
  // it still holds (softmax renormalises over what is left).
  std::span<const double> kept_mass;
  // total_mass[l]: Σ rows[l]; not finite when the row holds NaN or infinity.
  std::span<const double> total_mass;
};

class Policy {
 public:
  virtual ~Policy() = default;

  // Once, after the prompt's tokens have been placed in HBM in every layer.
  virtual void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement);
  // Every step, after the step's own token has been appended in HBM to every layer.
  virtual void observe(const StepView& view, std::vector<LayerPlacement>& placement) = 0;
  // The attention share a bound keeps at this step when it is not a placement (the oracle);
  // negative for ordinary policies, whose kept mass follows from the placement.
  [[nodiscard]] virtual double bound_kept_mass(const std::vector<float>& row,
                                               std::uint32_t layer) const;
};

}  // namespace kvtier::replay
