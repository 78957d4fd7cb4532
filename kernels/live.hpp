#pragma once
// A live run with the tiered KV cache (docs/LIVE.md): the engine decodes greedily with its keys
// and values in a TieredKvCache, and after every decode step the replay's policy object sees
// the step's attention (the head mean over query heads of the probabilities the engine used,
// per layer, over positions 0 .. n-1) and moves tokens between tiers; the cache moves the data.
// A second engine, when given, runs the full cache on the same tokens (teacher-forced) for the
// divergence figures.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"
#include "kernels/engine.hpp"
#include "kernels/tiered_cache.hpp"

namespace kvtier::kernels {

struct LiveOptions {
  config::PolicySpec policy;
  int max_new_tokens = 0;
  // Hard limit of the T0 arena; 0: the full cache of prompt + max_new_tokens in every layer.
  std::uint64_t t0_budget_bytes = 0;
  // Keep every decode step's logits in LiveResult::logits (tests).
  bool keep_logits = false;
};

struct LiveResult {
  std::string policy;  // canonical: every parameter
  PrefetchMode prefetch = PrefetchMode::kFull;
  std::uint64_t t0_budget_bytes = 0;
  std::uint64_t prompt_tokens = 0;
  // The generated tokens: the first from the prefill's logits, token t from decode step t - 1.
  // Every one of them is run (max_new_tokens decode steps), as a trace capture does.
  std::vector<std::int32_t> tokens;
  double prefill_seconds = 0.0;
  // Per decode step: the engine's decode, the policy's observe and the cache's moves.
  std::vector<double> step_seconds;
  TieredCacheStats cache;
  // Tokens per tier after the last step, summed over layers.
  std::array<std::uint64_t, replay::kTierCount> final_tier_tokens{};
  // Against the full cache (when a reference engine ran).
  bool has_reference = false;
  // Leading generated tokens equal to the full cache's greedy tokens.
  std::uint64_t greedy_agreement = 0;
  // KL(full || tiered) of the next-token distributions, nats, over the decode steps (the
  // prefill's distribution is the same for both); both read the same context (teacher-forced).
  double mean_kl = 0.0;
  double max_kl = 0.0;
  // Decode steps whose logits equal the full cache's bit for bit.
  std::uint64_t identical_logit_steps = 0;
  std::vector<std::vector<float>> logits;  // keep_logits: each decode step's logits
};

// Policies the live cache runs (the rest read inputs a live run does not provide, or are bounds
// rather than placements); ConfigError naming the policy otherwise.
void check_live_policy(const std::string& name);

// `engine` must accept an external KV store (the CPU engine does); `reference` (optional, not
// the same engine) runs the full cache. Errors: ConfigError for a bad policy, max_new_tokens < 1
// or a run past max_position_embeddings, or a T0 budget too small; DataError for bad tokens.
[[nodiscard]] LiveResult run_live(Engine& engine, Engine* reference,
                                  std::span<const std::int32_t> prompt, const LiveOptions& options);

// Step latency percentile (nearest rank), seconds; 0 for no steps.
[[nodiscard]] double percentile(std::vector<double> values, double fraction);

}  // namespace kvtier::kernels
