#pragma once
// A KV policy decides, step by step, where each token of each layer lives. The replay engine
// appends each step's token (in HBM), accounts the step's attention mass by tier, then hands
// the policy the attention its model would have produced (evicted tokens' share removed) so it
// can update its scores and move tokens.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "replay/attention.hpp"
#include "replay/compressed_format.hpp"
#include "replay/placement.hpp"

namespace kvtier::replay {

struct ReplayShape {
  std::uint32_t layers = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t steps = 0;
};

// Data beyond the head-mean decode rows that a policy reads. The engine checks that the source
// holds each input a policy declares before the first step (DataError naming the dataset).
enum class PolicyInput { kHeadRows, kPrefillWindow, kKeyNorms };

// "per-head decode rows (/attention/heads: capture with --granularity heads)".
[[nodiscard]] std::string_view describe(PolicyInput input);

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
  // head_rows[l]: every head's row, heads × rows[l].size(), head-major; empty unless the
  // policy declared PolicyInput::kHeadRows.
  const std::vector<std::vector<float>>& head_rows;
  std::uint32_t heads = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;

  // The optional data this policy reads (none by default).
  [[nodiscard]] virtual std::vector<PolicyInput> inputs() const;
  // Once, before start(), when inputs() is not empty: reads the prefill window or key norms.
  virtual void load_inputs(AttentionSource& source);
  // Once, after the prompt's tokens have been placed in HBM in every layer.
  virtual void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement);
  // Every step, after the step's own token has been appended in HBM to every layer.
  virtual void observe(const StepView& view, std::vector<LayerPlacement>& placement) = 0;
  // The attention share of `layer` this policy keeps at this step when its placement cannot
  // say: a bound that is not a placement (the oracle), or a policy whose heads keep different
  // tokens (the layer placement then holds the union). Called before observe() for the step,
  // with view.kept_mass not yet filled. Negative (the default) when the kept mass follows from
  // the placement; otherwise the engine books it on HBM and the rest as lost.
  [[nodiscard]] virtual double own_kept_mass(const StepView& view, std::uint32_t layer) const;
  // How a T2 (compressed) token is stored, for the simulator's byte counts (the tiered
  // hierarchy's int8 codes with a float32 scale per head vector, as the live cache stores it).
  [[nodiscard]] virtual CompressedFormat compressed_format() const { return kInt8HeadScaled; }
  // Whether attention reads the T2 tokens (dequantised), as a T2 tier does, or leaves them out
  // (Monarch's attend=hot: its cold pages are held but not read, their mass lost), so that the
  // simulator stages only what attention reads.
  [[nodiscard]] virtual bool attends_compressed() const { return true; }
};

}  // namespace kvtier::replay
