#pragma once
// A live run with the tiered KV cache (docs/LIVE.md): the engine decodes (greedy, or sampled with
// a seed) with its keys and values in the live cache of its backend (make_live_cache), and after
// every decode step
// the replay's policy object sees the step's attention (the head mean over query heads of the
// probabilities the engine used, per layer, over positions 0 .. n-1) and moves tokens between
// tiers; the cache moves the data.
// A second engine, when given, runs the full cache on the same tokens (teacher-forced) for the
// divergence figures. The policy's step is replay::ReplayStepper, the replay's own code.
//
// Trace-driven mode (LiveOptions::follow, `kvtier live --follow-trace`): the policy observes a
// recorded trace's rows instead of the engine's attention and the engine runs the trace's tokens,
// so the cache makes exactly the moves the replay of that trace makes, whatever the weights —
// timing of large model shapes can be measured with random weights.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"
#include "kernels/engine.hpp"
#include "kernels/sampler.hpp"
#include "kernels/tiered_cache.hpp"
#include "replay/attention.hpp"
#include "replay/engine.hpp"

namespace kvtier::kernels {

struct LiveOptions {
  config::PolicySpec policy;
  int max_new_tokens = 0;
  // How each token is chosen from the tiered run's logits; the full-cache reference applies a
  // sampler of the same seed to its own logits for the agreement figure. Greedy in follow mode
  // (its tokens are forced).
  SamplingOptions sampling;
  // Hard limit of the T0 arena; 0: the full cache of prompt + max_new_tokens in every layer.
  std::uint64_t t0_budget_bytes = 0;
  // What moves the CUDA backend's full-precision slots (TieredCacheOptions::copies).
  CacheCopies copies = CacheCopies::kKernels;
  // Host threads recoding T1 <-> T2 tokens between steps (TieredCacheOptions::recode_threads).
  int recode_threads = TieredCacheOptions{}.recode_threads;
  // Layers the CUDA backend stages ahead of the one computing
  // (TieredCacheOptions::staging_lookahead).
  int staging_lookahead = TieredCacheOptions{}.staging_lookahead;
  // Keep every decode step's logits in LiveResult::logits (tests).
  bool keep_logits = false;
  // Trace-driven mode: model layer l reads the source's layer replay::project_layers(source
  // layers, model layers)[l], positions 1:1; the prompt passed to run_live must hold the
  // source's prompt_tokens() tokens, max_new_tokens ≤ its steps(), and decode step t runs
  // forced_tokens[t] (max_new_tokens of them) instead of the sampled token. Not owned.
  replay::AttentionSource* follow = nullptr;
  std::vector<std::int32_t> forced_tokens;
};

// One decode step's figures (the step series of the measurement file).
// Its latency is LiveResult::step_seconds.
struct LiveStep {
  std::uint64_t h2d_bytes = 0;  // all host-to-device copies of the step
  std::uint64_t d2h_bytes = 0;
  double h2d_seconds = 0.0;  // their busy time (TieredCacheStats' seconds)
  double d2h_seconds = 0.0;
  // Token-layers per tier after the step, summed over layers.
  std::array<std::uint64_t, replay::kTierCount> tier_token_layers{};
  // Mean over layers of the step's attention mass on held tokens (T0–T2): the engine's own
  // attention in a live run (≈ 1: evicted tokens are already out of its softmax), the
  // trace's in trace-driven mode (the replay's kept mass).
  double kept_mass = 0.0;
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
  std::vector<LiveStep> steps;
  // What the policy did, step by step and layer by layer, as replay::replay records it.
  replay::ReplayDemand demand{0, 0};
  bool followed_trace = false;
  TieredCacheStats cache;
  CacheAllocation allocation;
  // Tokens per tier after the last step, summed over layers.
  std::array<std::uint64_t, replay::kTierCount> final_tier_tokens{};
  // Against the full cache (when a reference engine ran).
  bool has_reference = false;
  // Leading generated tokens that the full cache, choosing with the same sampler and seed from
  // its own logits, chooses too: how long a full-cache run would have produced the same text
  // (greedy: the same argmax). In follow mode, the two caches' greedy choices.
  std::uint64_t agreement = 0;
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

// `engine` is a CPU engine (the cache's CPU backend) or a CUDA engine (its CUDA backend, which
// needs the engine's observer delivery synchronous unless the run follows a source); `reference`
// (optional, not the same engine) runs the full cache. Errors: ConfigError for a bad policy,
// max_new_tokens < 1 or a run past max_position_embeddings, a T0 budget too small, bad sampling
// options or sampling in follow mode, or a followed source that does not fit (prompt length,
// steps, forced tokens); DataError for bad tokens.
[[nodiscard]] LiveResult run_live(Engine& engine, Engine* reference,
                                  std::span<const std::int32_t> prompt, const LiveOptions& options);

// Step latency percentile (nearest rank), seconds; 0 for no steps.
[[nodiscard]] double percentile(std::vector<double> values, double fraction);

}  // namespace kvtier::kernels
