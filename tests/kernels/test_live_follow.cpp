// Trace-driven live runs (LiveOptions::follow, `kvtier live --follow-trace`): the cache makes
// exactly the moves the replay of the followed attention makes — the policy's step is the
// replay's own code — so what is replayed is what runs, whatever the model's weights.

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/live.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "replay/engine.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/synthetic_attention.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "traces/synth.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::kernels::testing::stories_model;
namespace kr = kvtier::replay;

constexpr std::uint32_t kPrompt = 24;
constexpr std::uint32_t kSteps = 150;

// Synthetic reasoning attention over `layers` layers of stories260K's shape.
std::unique_ptr<kr::SyntheticAttention> source(std::uint32_t layers) {
  kvtier::config::ModelSpec spec = stories_model()->spec;
  spec.set_num_hidden_layers(layers);
  kvtier::config::SyntheticAttention params = kvtier::traces::synthetic_preset("reasoning", 7);
  return std::make_unique<kr::SyntheticAttention>(spec, kPrompt, kSteps, params);
}

std::vector<std::int32_t> tokens(std::uint32_t count, std::int32_t first) {
  std::vector<std::int32_t> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    out.push_back(static_cast<std::int32_t>((first + 37 * static_cast<std::int32_t>(i)) % 512));
  }
  return out;
}

kk::LiveResult follow(kr::AttentionSource& followed, const std::string& policy, int steps,
                      kk::Engine* reference = nullptr) {
  const auto engine = kk::make_cpu_engine(stories_model());
  kk::LiveOptions options;
  options.policy = kr::parse_policy_string(policy);
  options.max_new_tokens = steps;
  options.follow = &followed;
  options.forced_tokens = tokens(static_cast<std::uint32_t>(steps), 5);
  const std::vector<std::int32_t> prompt = tokens(kPrompt, 1);
  return kk::run_live(*engine, reference, prompt, options);
}

kr::ReplayDemand replayed(kr::AttentionSource& followed, const std::string& policy) {
  const kr::ReplayShape shape{followed.layers(), followed.prompt_tokens(), followed.steps()};
  const auto instance = kr::builtin_policies().create(kr::parse_policy_string(policy), shape);
  return kr::replay(followed, *instance);
}

}  // namespace

TEST_CASE("a followed run makes the replay's moves, step by step and layer by layer",
          "[kernels][live][follow]") {
  for (const std::string policy :
       {"tiered:hbm=0.3,evict=0.2,delta=8,recent=16,sinks=4",
        "tiered:hbm=0.5,evict=0.1,compress=0.5,delta=8,recent=16,prefetch=differential",
        "h2o:budget=64", "streaming:sinks=4,window=60", "tova:budget=64", "dms:budget=64,delay=16",
        "monarch:attend=all,compression=int8,window=32,max_hot=64", "full"}) {
    CAPTURE(policy);
    const auto followed = source(5);
    const kr::ReplayDemand expected = replayed(*followed, policy);
    const auto again = source(5);
    const kk::LiveResult result = follow(*again, policy, static_cast<int>(kSteps));
    REQUIRE(result.followed_trace);
    REQUIRE(result.demand.steps() == kSteps);
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      CAPTURE(layer);
      REQUIRE(result.demand.start(layer) == expected.start(layer));
    }
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        CAPTURE(step, layer);
        REQUIRE(result.demand.at(step, layer) == expected.at(step, layer));
      }
    }
    // The data followed the placement: the cache holds what the replay's last step holds.
    std::array<std::uint64_t, kr::kTierCount> final_tokens{};
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      for (std::size_t tier = 0; tier < kr::kTierCount; ++tier) {
        final_tokens[tier] += expected.at(kSteps - 1, layer).tokens[tier];
      }
    }
    REQUIRE(result.final_tier_tokens == final_tokens);
    REQUIRE(result.steps.back().tier_token_layers == final_tokens);
    const kr::ReplaySummary summary = expected.summary();
    double kept = 0.0;
    for (const kk::LiveStep& step : result.steps) {
      kept += step.kept_mass;
    }
    REQUIRE(kept / kSteps == Approx(summary.mean_kept_mass).epsilon(1e-12));
    // The forced tokens were run.
    REQUIRE(result.tokens == tokens(kSteps, 5));
  }
}

TEST_CASE("a followed trace with other layer counts is projected onto the model's layers",
          "[kernels][live][follow]") {
  const std::string policy = "tiered:hbm=0.4,evict=0.2,delta=8,recent=16";
  for (const std::uint32_t layers : {2U, 9U}) {
    CAPTURE(layers);
    const auto followed = source(layers);
    const kr::ReplayDemand expected = replayed(*followed, policy);
    const auto again = source(layers);
    const kk::LiveResult result = follow(*again, policy, 60);
    const std::vector<std::uint32_t> map = kr::project_layers(layers, 5);
    REQUIRE(map.front() == 0);
    REQUIRE(map.back() == layers - 1);
    for (std::uint64_t step = 0; step < 60; ++step) {
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        CAPTURE(step, layer);
        REQUIRE(result.demand.at(step, layer) == expected.at(step, map[layer]));
      }
    }
  }
}

TEST_CASE("a followed run copies what its placement implies and still measures divergence",
          "[kernels][live][follow]") {
  const auto followed = source(5);
  const auto reference = kk::make_cpu_engine(stories_model());
  const kk::LiveResult exact =
      follow(*followed, "tiered:hbm=0.3,evict=0,delta=8,recent=16", 100, reference.get());
  // Tiering alone: the placement comes from elsewhere, the logits are still the full cache's.
  REQUIRE(exact.cache.h2d_prefetch.tokens > 0);
  REQUIRE(exact.identical_logit_steps == 100);
  REQUIRE(exact.mean_kl == 0.0);
  const auto again = source(5);
  const kk::LiveResult evicting =
      follow(*again, "tiered:hbm=0.3,evict=0.5,delta=8,recent=16", 100, reference.get());
  REQUIRE(evicting.final_tier_tokens[3] > 0);
  REQUIRE(evicting.mean_kl > 0.0);
}

TEST_CASE("a followed source must fit the run", "[kernels][live][follow]") {
  const auto followed = source(5);
  const auto engine = kk::make_cpu_engine(stories_model());
  kk::LiveOptions options;
  options.policy = kr::parse_policy_string("tiered");
  options.follow = followed.get();
  options.max_new_tokens = 10;
  options.forced_tokens = tokens(10, 5);
  // A prompt of another length.
  REQUIRE_THROWS_AS(kk::run_live(*engine, nullptr, tokens(kPrompt - 1, 1), options),
                    kvtier::ConfigError);
  // More steps than the source holds.
  options.max_new_tokens = static_cast<int>(kSteps) + 1;
  options.forced_tokens = tokens(kSteps + 1, 5);
  REQUIRE_THROWS_AS(kk::run_live(*engine, nullptr, tokens(kPrompt, 1), options),
                    kvtier::ConfigError);
}
