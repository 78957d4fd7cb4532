// The live tiered KV cache (kernels/tiered_cache.hpp, kernels/live.hpp) on stories260K: tiering
// without eviction or compression is exact (Proposition 1 of the tiered hierarchy), the T0 arena
// keeps to its budget, eviction makes the model diverge, runs are deterministic, and the
// replay's policies drive the cache.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "kernels/divergence.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/live.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/tokenizer.hpp"
#include "replay/parameters.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::kernels::testing::stories_model;

std::vector<std::int32_t> prompt() {
  return kk::testing::stories_prompt("Once upon a time, there was a little girl named Lily");
}

kk::LiveResult live(const std::string& policy, int steps, std::uint64_t budget = 0,
                    bool keep_logits = false,
                    const kk::SamplingOptions& sampling = kk::SamplingOptions::greedy()) {
  const auto engine = kk::make_cpu_engine(stories_model());
  const auto reference = kk::make_cpu_engine(stories_model());
  kk::LiveOptions options;
  options.policy = kvtier::replay::parse_policy_string(policy);
  options.max_new_tokens = steps;
  options.t0_budget_bytes = budget;
  options.keep_logits = keep_logits;
  options.sampling = sampling;
  return kk::run_live(*engine, reference.get(), prompt(), options);
}

// Greedy tokens of the full cache on the engine's own path, as generate() would give them.
std::vector<std::int32_t> full_greedy(int steps) {
  const auto engine = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> tokens = prompt();
  std::span<const float> logits = engine->prefill(tokens);
  std::vector<std::int32_t> out;
  for (int step = 0; step < steps; ++step) {
    const auto next =
        static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    logits = engine->decode(next);
  }
  return out;
}

constexpr int kSteps = 200;
// One token of one layer: K and V of 4 KV heads of dimension 8, float32.
constexpr std::uint64_t kTokenLayerBytes = 2ULL * 4 * 8 * sizeof(float);

// "tiered:delta=8,recent=16,sinks=4," + params: small windows so that a 200-step run re-tiers
// often and fills T1.
std::string tiered(const std::string& params) {
  std::string policy = "tiered:delta=8,recent=16,sinks=4,";
  policy += params;
  return policy;
}

}  // namespace

TEST_CASE("tiering without eviction or compression is bit-identical to the full cache",
          "[kernels][live]") {
  const std::vector<std::int32_t> golden = full_greedy(kSteps);
  for (const std::string prefetch : {"full", "differential"}) {
    for (const std::string hbm : {"0", "0.3", "0.7", "1"}) {
      std::string params = "evict=0,compress=0,hbm=";
      params += hbm;
      params += ",prefetch=";
      params += prefetch;
      const std::string policy = tiered(params);
      INFO(policy);
      const kk::LiveResult result = live(policy, kSteps);
      CHECK(result.tokens == golden);
      CHECK(result.identical_logit_steps == static_cast<std::uint64_t>(kSteps));
      CHECK(result.mean_kl == 0.0);
      CHECK(result.agreement == static_cast<std::uint64_t>(kSteps));
      CHECK(result.final_tier_tokens[3] == 0);
      CHECK(result.cache.t0_peak_bytes <= result.t0_budget_bytes);
      if (hbm != "1") {
        // T1 really held tokens and attention really read them from staging.
        CHECK(result.final_tier_tokens[1] > 0);
        CHECK(result.cache.h2d_prefetch.tokens > 0);
        CHECK(result.cache.d2h_offload.tokens > 0);
      }
    }
  }
}

TEST_CASE("differential prefetch copies each T1 token once, full prefetch every step",
          "[kernels][live]") {
  const kk::LiveResult full = live(tiered("evict=0,hbm=0,prefetch=full"), kSteps);
  const kk::LiveResult differential = live(tiered("evict=0,hbm=0,prefetch=differential"), kSteps);
  // Each offloaded token is staged once, at the next step's attention; tokens offloaded after
  // the last step are never read.
  CHECK(differential.cache.h2d_prefetch.tokens > 0);
  CHECK(differential.cache.h2d_prefetch.tokens <= differential.cache.d2h_offload.tokens);
  CHECK(differential.cache.h2d_prefetch.tokens + 5ULL * 8 >= differential.cache.d2h_offload.tokens);
  CHECK(full.cache.h2d_prefetch.tokens > differential.cache.h2d_prefetch.tokens);
  CHECK(full.cache.h2d_prefetch.bytes == full.cache.h2d_prefetch.tokens * kTokenLayerBytes);
  CHECK(full.tokens == differential.tokens);
}

TEST_CASE("the T0 arena never passes its budget", "[kernels][live]") {
  const kk::LiveResult unlimited = live(tiered("evict=0.2,hbm=0.3"), kSteps);
  const std::uint64_t needed = unlimited.cache.t0_peak_bytes;
  const std::uint64_t full_cache = unlimited.t0_budget_bytes;
  CHECK(needed < full_cache);
  // Exactly the peak suffices, and the run is the same.
  const kk::LiveResult tight = live(tiered("evict=0.2,hbm=0.3"), kSteps, needed);
  CHECK(tight.cache.t0_peak_bytes <= needed);
  CHECK(tight.tokens == unlimited.tokens);
  // One token-layer less does not: the arena refuses instead of growing.
  const std::uint64_t token_layer = kTokenLayerBytes;
  CHECK_THROWS_AS(live(tiered("evict=0.2,hbm=0.3"), kSteps, needed - token_layer),
                  kvtier::ConfigError);
  // The full cache needs the whole prompt + steps in every layer.
  CHECK_THROWS_AS(live("full", kSteps, full_cache - token_layer), kvtier::ConfigError);
  CHECK(live("full", kSteps, full_cache).identical_logit_steps == kSteps);
}

TEST_CASE("eviction makes the model diverge, more with a higher eviction ratio",
          "[kernels][live]") {
  std::vector<double> kl;
  for (const std::string evict : {"0", "0.25", "0.5", "0.9"}) {
    const kk::LiveResult result = live(tiered("hbm=0.5,evict=") + evict, kSteps);
    INFO("evict " << evict << ": mean KL " << result.mean_kl << ", agreement " << result.agreement
                  << ", evicted " << result.final_tier_tokens[3]);
    CHECK(std::isfinite(result.mean_kl));
    if (evict != "0") {
      CHECK(result.final_tier_tokens[3] > 0);
      CHECK(result.mean_kl > 0.0);
    }
    kl.push_back(result.mean_kl);
  }
  CHECK(kl.front() == 0.0);
  for (std::size_t i = 1; i < kl.size(); ++i) {
    CHECK(kl[i] >= kl[i - 1]);
  }
}

TEST_CASE("8-bit T2 is an approximation: small divergence, compressed bytes read",
          "[kernels][live]") {
  const kk::LiveResult result = live(tiered("evict=0,hbm=0,compress=1"), kSteps);
  CHECK(result.final_tier_tokens[2] > 0);
  CHECK(result.final_tier_tokens[1] == 0);
  CHECK(result.cache.h2d_compressed.tokens > 0);
  // int8 codes for 2 x 4 heads x 8 dims plus a float scale per head for K and for V.
  CHECK(result.cache.h2d_compressed.bytes == result.cache.h2d_compressed.tokens * (64 + 32));
  CHECK(result.mean_kl > 0.0);
  const kk::LiveResult evicting = live(tiered("evict=0.5,hbm=0"), kSteps);
  CHECK(result.mean_kl < evicting.mean_kl);
}

TEST_CASE("the mean KL is KL(full || tiered) over the decode steps, teacher-forced",
          "[kernels][live]") {
  constexpr int kShortRun = 60;
  const kk::LiveResult result = live(tiered("hbm=0.5,evict=0.5"), kShortRun, 0, true);
  REQUIRE(result.logits.size() == static_cast<std::size_t>(kShortRun));
  // The full cache reads the tokens the tiered run decoded.
  const auto full = kk::make_cpu_engine(stories_model());
  (void)full->prefill(prompt());
  double forward_sum = 0.0;
  double reverse_sum = 0.0;
  double forward_max = 0.0;
  for (int step = 0; step < kShortRun; ++step) {
    const auto index = static_cast<std::size_t>(step);
    const std::span<const float> reference = full->decode(result.tokens[index]);
    const double forward = kk::kl_divergence(reference, result.logits[index]);
    forward_sum += forward;
    forward_max = std::max(forward_max, forward);
    reverse_sum += kk::kl_divergence(result.logits[index], reference);
  }
  CHECK(result.mean_kl > 0.0);
  CHECK(result.mean_kl == Approx(forward_sum / kShortRun).epsilon(1e-12));
  CHECK(result.max_kl == Approx(forward_max).epsilon(1e-12));
  CHECK(result.mean_kl != Approx(reverse_sum / kShortRun).epsilon(1e-6));
}

TEST_CASE("copy time is charged to the kind of copy that moved bytes", "[kernels][live]") {
  for (const std::string params :
       {"hbm=0.5,evict=0", "hbm=0.3,evict=0.2,compress=0.5", "hbm=0,evict=0,compress=1"}) {
    const kk::LiveResult result = live(tiered(params), kSteps);
    INFO(params);
    CHECK(result.cache.d2h_offload.bytes > 0);
    const kk::TieredCacheStats& stats = result.cache;
    for (const kk::CopyCounter* counter :
         {&stats.h2d_prefetch, &stats.h2d_compressed, &stats.h2d_promote, &stats.d2h_offload,
          &stats.host_recode}) {
      CHECK((counter->bytes == 0) == (counter->seconds == 0.0));
    }
    // Each step's share: busy exactly when it copied, and the steps' shares within the totals
    // (the start placement's moves are in no step).
    double h2d_seconds = 0.0;
    double d2h_seconds = 0.0;
    for (const kk::LiveStep& step : result.steps) {
      CHECK((step.h2d_bytes == 0) == (step.h2d_seconds == 0.0));
      CHECK((step.d2h_bytes == 0) == (step.d2h_seconds == 0.0));
      h2d_seconds += step.h2d_seconds;
      d2h_seconds += step.d2h_seconds;
    }
    CHECK(h2d_seconds > 0.0);
    CHECK(h2d_seconds <= stats.h2d().seconds * (1 + 1e-9));
    CHECK(d2h_seconds <= stats.d2h_offload.seconds * (1 + 1e-9));
  }
}

TEST_CASE("live runs are deterministic", "[kernels][live]") {
  const std::string policy = tiered("hbm=0.3,evict=0.2,compress=0.5,prefetch=differential");
  const kk::LiveResult first = live(policy, 120, 0, true);
  const kk::LiveResult second = live(policy, 120, 0, true);
  CHECK(first.tokens == second.tokens);
  CHECK(first.logits == second.logits);
  CHECK(first.mean_kl == second.mean_kl);
  CHECK(first.cache.h2d().bytes == second.cache.h2d().bytes);
  CHECK(first.cache.d2h_offload.bytes == second.cache.d2h_offload.bytes);
  CHECK(first.cache.t0_peak_bytes == second.cache.t0_peak_bytes);
  CHECK(first.final_tier_tokens == second.final_tier_tokens);
}

TEST_CASE("a sampled live run: agreement is how long the full cache would sample the same",
          "[kernels][live]") {
  const kk::SamplingOptions sampling = kk::SamplingOptions::nucleus(0.8F, 0.9F, 7);
  const auto engine = kk::make_cpu_engine(stories_model());
  kk::GenerationOptions generation;
  generation.max_new_tokens = kSteps;
  generation.sampling = sampling;
  const kk::GenerationResult full_run = kk::generate(*engine, prompt(), generation);
  const std::vector<std::int32_t> full(full_run.generated().begin(), full_run.generated().end());
  REQUIRE(full.size() == static_cast<std::size_t>(kSteps));
  REQUIRE(full != full_greedy(kSteps));  // the sampler really samples

  // Without eviction the tiered cache samples exactly the full cache's tokens.
  const kk::LiveResult exact = live(tiered("evict=0,hbm=0.3"), kSteps, 0, false, sampling);
  CHECK(exact.tokens == full);
  CHECK(exact.agreement == static_cast<std::uint64_t>(kSteps));

  // With eviction, the agreement is the common prefix with the full cache's sampled run.
  for (const std::string evict : {"0.3", "0.6"}) {
    INFO("evict " << evict);
    const kk::LiveResult evicting =
        live(tiered("hbm=0.5,evict=") + evict, kSteps, 0, false, sampling);
    const auto diverged =
        std::mismatch(evicting.tokens.begin(), evicting.tokens.end(), full.begin());
    const auto common = static_cast<std::uint64_t>(diverged.first - evicting.tokens.begin());
    CHECK(common < static_cast<std::uint64_t>(kSteps));
    CHECK(evicting.agreement == common);
    // Another seed samples other tokens.
    const kk::LiveResult reseeded = live(tiered("hbm=0.5,evict=") + evict, kSteps, 0, false,
                                         kk::SamplingOptions::nucleus(0.8F, 0.9F, 8));
    CHECK(reseeded.tokens != evicting.tokens);
  }
  CHECK_THROWS_AS(live("full", 10, 0, false, kk::SamplingOptions::nucleus(-1.0F, 0.9F, 7)),
                  kvtier::ConfigError);
}

TEST_CASE("the replay's eviction policies drive the live cache", "[kernels][live]") {
  const std::uint64_t prompt_tokens = prompt().size();
  SECTION("full keeps everything in T0, exactly") {
    const kk::LiveResult result = live("full", 60);
    CHECK(result.identical_logit_steps == 60);
    CHECK(result.final_tier_tokens[0] == 5 * (prompt_tokens + 60));
    CHECK(result.policy == "full");
  }
  SECTION("budgeted policies hold their budget in T0 and evict the rest") {
    for (const std::string policy : {"streaming:sinks=4,window=28", "h2o:budget=32",
                                     "tova:budget=32", "dms:budget=32,delay=8"}) {
      INFO(policy);
      const kk::LiveResult result = live(policy, 100);
      CHECK(result.final_tier_tokens[3] > 0);
      CHECK(result.final_tier_tokens[0] + result.final_tier_tokens[3] == 5 * (prompt_tokens + 100));
      CHECK(result.cache.t0_peak_bytes <= 5ULL * (32 + 8 + 1) * kTokenLayerBytes);
      CHECK(result.mean_kl > 0.0);
      CHECK(result.cache.h2d().bytes == 0);
    }
  }
  SECTION("a prompt longer than the budget is held whole until the first decode step") {
    // Prefilled into T0 entire; h2o, tova and dms evict from the first step on, so T0 peaks at
    // the prompt and that step's token, in every layer. (streaming cuts the prompt right after
    // the prefill, so its peak is the prompt alone.)
    REQUIRE(prompt_tokens > 4);
    for (const std::string policy : {"h2o:budget=4", "tova:budget=4", "dms:budget=4,delay=0"}) {
      INFO(policy);
      const kk::LiveResult result = live(policy, 20);
      CHECK(result.cache.t0_peak_bytes == 5ULL * (prompt_tokens + 1) * kTokenLayerBytes);
      CHECK(result.final_tier_tokens[0] <= 5 * (4 + 1));
    }
    const kk::LiveResult streaming = live("streaming:sinks=1,window=3", 20);
    CHECK(streaming.cache.t0_peak_bytes == 5ULL * prompt_tokens * kTokenLayerBytes);
  }
  SECTION("monarch pages cold tokens to T2 and reads them") {
    const kk::LiveResult result =
        live("monarch:attend=all,compression=int8,window=16,max_hot=32,sticky_tokens=4", 100);
    CHECK(result.final_tier_tokens[2] > 0);
    CHECK(result.final_tier_tokens[3] == 0);
    CHECK(result.cache.h2d_compressed.tokens > 0);
  }
  SECTION("policies a live run cannot drive are refused") {
    CHECK_THROWS_AS(live("snapkv", 10), kvtier::ConfigError);
    CHECK_THROWS_AS(live("oracle", 10), kvtier::ConfigError);
    CHECK_THROWS_AS(live("monarch", 10), kvtier::ConfigError);
    // Monarch's own formats are not what the cache stores (int8 with head-vector scales).
    CHECK_THROWS_AS(live("monarch:attend=all", 10), kvtier::ConfigError);
    CHECK_THROWS_AS(live("tiered:hbm=2", 10), kvtier::ConfigError);
  }
}

TEST_CASE("the engine refuses a live run past its positions", "[kernels][live]") {
  CHECK_THROWS_AS(live("full", 600), kvtier::ConfigError);
  CHECK_THROWS_AS(live("full", 0), kvtier::ConfigError);
}
