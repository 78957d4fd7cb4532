// Properties every policy must have, checked on seeded synthetic attention.

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::ReplayDemand;
using kvtier::replay::Tier;

namespace {

constexpr std::uint32_t kLayers = 3;
constexpr std::uint64_t kPrompt = 40;
constexpr std::uint64_t kSteps = 300;

ReplayDemand run(const std::string& policy, std::uint64_t steps = kSteps) {
  auto source = kvtier::test::synthetic_attention(kLayers, kPrompt, steps, 11);
  const auto registry = kvtier::replay::builtin_policies();
  auto instance =
      registry.create(kvtier::replay::parse_policy_string(policy), {kLayers, kPrompt, steps});
  return kvtier::replay::replay(source, *instance);
}

double kept(const ReplayDemand& demand, std::uint64_t step, std::uint32_t layer) {
  return demand.at(step, layer).kept_share();
}

}  // namespace

TEST_CASE("full keeps every token in HBM and all attention mass", "[replay]") {
  const auto demand = run("full");
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      CHECK(kept(demand, step, layer) == Approx(1.0).epsilon(1e-5));
      CHECK(demand.at(step, layer).tokens[0] == kPrompt + step + 1);
    }
  }
  CHECK(demand.summary().mean_hbm_fraction == 1.0);
}

TEST_CASE("tiered without eviction and T2 loses no mass for every HBM ratio", "[replay]") {
  for (const char* hbm : {"0", "0.3", "0.5", "0.7", "1"}) {
    INFO("hbm " << hbm);
    const auto demand = run(std::string("tiered:hbm=") + hbm + ",evict=0,delta=16,recent=32");
    // Exactly: kept is 1 − T3's share, and T3's share is 0 with nothing evicted.
    CHECK(demand.summary().mean_kept_mass == 1.0);
    CHECK(demand.summary().min_kept_mass == 1.0);
    CHECK(demand.summary().evicted == 0);
  }
  // With a low HBM ratio tokens really do leave HBM.
  CHECK(run("tiered:hbm=0.3,evict=0,delta=16,recent=32").summary().final_hbm_fraction < 0.7);
}

TEST_CASE("attention is recorded as shares of each row, whatever the row sums to", "[replay]") {
  // The synthetic rows scaled by 1.5: the recorded masses are still shares that sum to 1.
  auto unit = kvtier::test::synthetic_attention(kLayers, kPrompt, kSteps, 11);
  std::vector<std::vector<std::vector<float>>> rows(kSteps);
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    unit.read_step(step, rows[step]);
    for (auto& row : rows[step]) {
      for (float& weight : row) {
        weight *= 1.5F;
      }
    }
  }
  for (const char* policy : {"tiered:hbm=0.5,evict=0,delta=16,recent=32",
                             "tiered:hbm=0.5,evict=0.2,delta=16,recent=32", "h2o:budget=64"}) {
    INFO(policy);
    kvtier::replay::InMemoryAttention scaled(kLayers, kPrompt, rows);
    const auto demand = kvtier::test::run_policy(scaled, policy);
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        const auto& mass = demand.at(step, layer).mass;
        double sum = 0.0;
        for (const float share : mass) {
          REQUIRE(share >= 0.0F);
          REQUIRE(share <= 1.0F);
          sum += share;
        }
        REQUIRE(sum == Approx(1.0).epsilon(1e-6));
      }
    }
    CHECK(demand.summary().mean_kept_mass <= 1.0);
  }
  kvtier::replay::InMemoryAttention scaled(kLayers, kPrompt, rows);
  CHECK(kvtier::test::run_policy(scaled, "tiered:hbm=0.5,evict=0,delta=16,recent=32")
            .summary()
            .mean_kept_mass == 1.0);
}

TEST_CASE("tiered evicts the share r of unprotected tokens and splits the rest by beta",
          "[replay]") {
  const auto demand = run("tiered:hbm=0.5,evict=0.2,delta=10,recent=20,sinks=4");
  // After the last re-tiering (step 299 is the 30th multiple of 10): 300 generated tokens,
  // 276 unprotected, 55 evicted, 221 survivors: 110 in HBM, 111 on the host.
  const auto& last = demand.at(kSteps - 1, 0);
  CHECK(last.tokens[3] == 55);
  CHECK(last.tokens[1] == 111);
  CHECK(last.tokens[0] == kPrompt + 4 + 20 + 110);
  // Placement is shared by every layer.
  CHECK(demand.at(kSteps - 1, 2).tokens == last.tokens);
  CHECK(demand.summary().mean_kept_mass < 1.0);
}

TEST_CASE("tiered can hold the low-score share of host tokens compressed (T2)", "[replay]") {
  const auto demand = run("tiered:hbm=0.5,evict=0,compress=0.5,delta=10,recent=20");
  const auto& last = demand.at(kSteps - 1, 0);
  CHECK(last.tokens[2] > 0);
  CHECK(last.tokens[2] == Approx(last.tokens[1]).margin(1));
}

TEST_CASE("a placement counts where promotions and compressions came from", "[replay]") {
  // The simulator books them on the bus by their source: T2 -> T0 at compressed size, T0 -> T2
  // as an offload, T1 <-> T2 nowhere (a recode in host memory).
  kvtier::replay::LayerPlacement layer;
  for (int token = 0; token < 6; ++token) {
    layer.append();
  }
  layer.move(0, Tier::kHost);        // T0 -> T1
  layer.move(1, Tier::kCompressed);  // T0 -> T2
  layer.move(0, Tier::kCompressed);  // T1 -> T2
  layer.move(2, Tier::kHost);
  layer.move(1, Tier::kHost);  // T2 -> T1
  layer.move(2, Tier::kHbm);   // T1 -> T0
  layer.move(0, Tier::kHbm);   // T2 -> T0
  const kvtier::replay::TierMoves& moves = layer.moves();
  CHECK(moves.demoted == 2);
  CHECK(moves.newly_host == 3);
  CHECK(moves.compressed == 2);
  CHECK(moves.compressed_from_hbm == 1);
  CHECK(moves.promoted == 2);
  CHECK(moves.promoted_from_compressed == 1);
  CHECK(moves.evicted == 0);
}

TEST_CASE("budgeted policies never exceed their budget", "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const auto budgets_of = [&](const std::string& policy) {
    const auto spec = kvtier::replay::parse_policy_string(policy);
    if (spec.name() == "streaming") {
      return std::vector<std::uint64_t>(kLayers, 64);  // 4 sinks + a window of 60
    }
    const kvtier::replay::PolicyParameters params(spec.name(), registry.find(spec.name())->params,
                                                  spec);
    return kvtier::replay::layer_budgets(params, kLayers);
  };
  for (const char* policy :
       {"h2o:budget=64", "h2o:budget=64,allocation=pyramid", "tova:budget=50",
        "tova:budget=90,allocation=pyramid", "streaming:sinks=4,window=60",
        "h2o:allocation=explicit,budgets=64/30/90", "tova:allocation=explicit,budgets=64/30/90",
        "dms:budget=64,delay=0"}) {
    INFO(policy);
    const auto budgets = budgets_of(policy);
    const auto demand = run(policy);
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        const auto& record = demand.at(step, layer);
        CHECK(record.tokens[0] + record.tokens[1] + record.tokens[2] <= budgets[layer]);
      }
    }
    // The budget binds: by the end every layer is full.
    CHECK(demand.at(kSteps - 1, 0).tokens[0] == budgets[0]);
  }
}

TEST_CASE("pyramid budgets fall with depth and average the mean budget", "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const auto* info = registry.find("h2o");
  REQUIRE(info != nullptr);
  const kvtier::replay::PolicyParameters params(
      "h2o", info->params,
      kvtier::replay::parse_policy_string("h2o:budget=512,allocation=pyramid"));
  const auto budgets = kvtier::replay::layer_budgets(params, 32);
  REQUIRE(budgets.size() == 32);
  CHECK(budgets.front() > budgets.back());
  CHECK(std::is_sorted(budgets.rbegin(), budgets.rend()));
  // Exactly L·B: rounding each layer on its own gives mirrored pairs that both round up.
  CHECK(std::accumulate(budgets.begin(), budgets.end(), std::uint64_t{0}) == 512U * 32U);
  for (const std::int64_t mean : {74, 100, 994, 1024, 4096}) {
    for (const std::uint32_t layers : {2U, 5U, 32U, 80U}) {
      INFO("budget " << mean << ", " << layers << " layers");
      const kvtier::replay::PolicyParameters each(
          "h2o", info->params,
          kvtier::replay::parse_policy_string("h2o:allocation=pyramid,budget=" +
                                              std::to_string(mean)));
      const auto pyramid = kvtier::replay::layer_budgets(each, layers);
      CHECK(std::accumulate(pyramid.begin(), pyramid.end(), std::int64_t{0}) == mean * layers);
    }
  }
}

TEST_CASE(
    "a prompt-compressing pyramid is uniform for a short prompt and capped at the prompt, "
    "as PyramidKV's code does",
    "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const auto* info = registry.find("pyramidkv");
  REQUIRE(info != nullptr);
  const kvtier::replay::PolicyParameters params(
      "pyramidkv", info->params, kvtier::replay::parse_policy_string("pyramidkv:budget=400"));
  using Budgets = std::vector<std::uint64_t>;
  // B 400, w 64: a prompt shorter than 2(B − w) = 672 is compressed with B in every layer.
  const Budgets uniform(5, 400);
  CHECK(kvtier::replay::layer_budgets(params, 5, 512) == uniform);
  CHECK(kvtier::replay::layer_budgets(params, 5, 671) == uniform);
  // From 672 on, the pyramid: min 16.8, max 655.2 — beyond a 700-token prompt's 636 tokens past
  // the window, so max becomes 636 and min 2·336 − 636 = 36: 636, 486, 336, 186, 36, each + 64.
  CHECK(kvtier::replay::layer_budgets(params, 5, 700) == Budgets{700, 550, 400, 250, 100});
  // A prompt long enough leaves the paper's pyramid; no prompt (decode-time policies) as well.
  const Budgets uncapped{719, 560, 400, 240, 81};
  CHECK(kvtier::replay::layer_budgets(params, 5, 4096) == uncapped);
  CHECK(kvtier::replay::layer_budgets(params, 5) == uncapped);
}

TEST_CASE("streaming with a window longer than the trace equals full", "[replay]") {
  const auto streaming = run("streaming:sinks=4,window=100000");
  const auto full = run("full");
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      CHECK(streaming.at(step, layer).tokens == full.at(step, layer).tokens);
      CHECK(streaming.at(step, layer).mass == full.at(step, layer).mass);
    }
  }
}

TEST_CASE("the oracle keeps at least as much mass as any policy with the same budget", "[replay]") {
  const auto oracle = run("oracle:budget=64");
  for (const char* policy : {"h2o:budget=64", "tova:budget=64", "streaming:sinks=4,window=60",
                             "dms:budget=64,delay=0", "h2o:allocation=explicit,budgets=64/64/64"}) {
    INFO(policy);
    const auto demand = run(policy);
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        CHECK(kept(oracle, step, layer) >= kept(demand, step, layer) - 1e-6);
      }
    }
  }
}

TEST_CASE("replay is deterministic", "[replay]") {
  const auto first = run("tiered:hbm=0.4,evict=0.1,delta=8");
  const auto second = run("tiered:hbm=0.4,evict=0.1,delta=8");
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      CHECK(first.at(step, layer).tokens == second.at(step, layer).tokens);
      CHECK(first.at(step, layer).mass == second.at(step, layer).mass);
    }
  }
}

TEST_CASE("policy strings are checked against each policy's declared parameters", "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const kvtier::replay::ReplayShape shape{2, 10, 10};
  std::string canonical;
  (void)registry.create(kvtier::replay::parse_policy_string("tiered:hbm=0.3,evict=0.05"), shape,
                        &canonical);
  CHECK(canonical ==
        "tiered:hbm=0.3,evict=0.05,delta=64,compress=0,recent=128,sinks=4,prefetch=full");
  const auto fails = [&](const std::string& text, const std::string& expected) {
    INFO(text);
    CHECK_THROWS_WITH(registry.create(kvtier::replay::parse_policy_string(text), shape),
                      Catch::Contains(expected));
  };
  fails("lru", "unknown policy 'lru'");
  fails("tiered:beta=0.5", "has no parameter 'beta'");
  fails("tiered:hbm=1.5", "out of range");
  fails("tiered:delta=2.5", "not an integer");
  fails("tiered:delta=99999999999999999999", "value 1e+20 is out of range");  // past int64
  fails("tiered:prefetch=sometimes", "not one of full, differential");
  fails("tiered:hbm=0.5,hbm=0.4", "given twice");
  fails("full:budget=3", "it takes none");
  CHECK_THROWS_WITH(kvtier::replay::parse_policy_string("tiered:hbm"),
                    Catch::Contains("NAME=VALUE"));
}

namespace {

using Rows = std::vector<std::vector<std::vector<float>>>;  // [step][layer][position]

Rows synthetic_rows() {
  auto source = kvtier::test::synthetic_attention(kLayers, kPrompt, kSteps, 11);
  Rows rows(kSteps);
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    source.read_step(step, rows[step]);
  }
  return rows;
}

ReplayDemand run_rows(const std::string& policy, Rows rows) {
  kvtier::replay::InMemoryAttention source(kLayers, kPrompt, std::move(rows));
  const auto registry = kvtier::replay::builtin_policies();
  auto instance =
      registry.create(kvtier::replay::parse_policy_string(policy), {kLayers, kPrompt, kSteps});
  return kvtier::replay::replay(source, *instance);
}

}  // namespace

TEST_CASE("a row that is not finite scores nothing and leaves the layer's later choices intact",
          "[replay]") {
  // One NaN weight in layer 1 at step 5, on a token every policy holds, as a broken step of a
  // live run would give. Accumulated, it would pin its token for good or turn every later
  // comparison with it false.
  constexpr std::uint64_t kBroken = 5;
  constexpr std::uint32_t kLayer = 1;
  const Rows clean = synthetic_rows();
  Rows broken = clean;
  broken[kBroken][kLayer][0] = std::numeric_limits<float>::quiet_NaN();  // a sink: held
  // H2O and DMS accumulate nothing from the row, as if it were zeros; TOVA keeps the previous
  // step's scores, as if that row were seen again (the new token scoring 0, and never a candidate).
  Rows zeros = clean;
  std::fill(zeros[kBroken][kLayer].begin(), zeros[kBroken][kLayer].end(), 0.0F);
  Rows repeated = clean;
  repeated[kBroken][kLayer] = clean[kBroken - 1][kLayer];
  repeated[kBroken][kLayer].push_back(0.0F);
  for (const auto& [policy, equivalent] :
       {std::pair{"h2o:budget=24,recent=0.25", &zeros}, std::pair{"dms:budget=24,delay=4", &zeros},
        std::pair{"tova:budget=24", &repeated}}) {
    INFO(policy);
    const ReplayDemand skipped = run_rows(policy, broken);
    const ReplayDemand expected = run_rows(policy, *equivalent);
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        INFO("step " << step << ", layer " << layer);
        CHECK(skipped.at(step, layer).tokens == expected.at(step, layer).tokens);
        if (step != kBroken) {  // the broken step's own mass is the NaN row's
          CHECK(skipped.at(step, layer).mass == expected.at(step, layer).mass);
        }
      }
    }
    // And the layer goes on choosing: its kept mass after the broken step is close to the clean
    // run's, not collapsed.
    const ReplayDemand reference = run_rows(policy, clean);
    double skipped_mass = 0.0;
    double clean_mass = 0.0;
    for (std::uint64_t step = kBroken + 1; step < kSteps; ++step) {
      skipped_mass += kept(skipped, step, kLayer);
      clean_mass += kept(reference, step, kLayer);
    }
    CHECK(skipped_mass == Approx(clean_mass).epsilon(0.05));
  }
}

namespace {

// Steps `policy` over one layer of `prompt` tokens, step t's row (over prompt + t + 1 tokens,
// the step's own last) given by `row_of(t, length)`; `check(t, placement)` after each step.
template <typename RowOf, typename Check>
void step_one_layer(const std::string& policy, std::uint64_t prompt, std::uint64_t steps,
                    RowOf row_of, Check check) {
  const kvtier::replay::ReplayShape shape{1, prompt, steps};
  const auto registry = kvtier::replay::builtin_policies();
  auto instance = registry.create(kvtier::replay::parse_policy_string(policy), shape);
  std::vector<kvtier::replay::LayerPlacement> placement(1);
  for (std::uint64_t token = 0; token < prompt; ++token) {
    placement[0].append();
  }
  instance->start(shape, placement);
  kvtier::replay::ReplayStepper stepper(*instance, 1);
  std::vector<kvtier::replay::StepLayerRecord> records(1);
  for (std::uint64_t step = 0; step < steps; ++step) {
    const std::vector<std::vector<float>> rows = {row_of(step, prompt + step + 1)};
    stepper.step(step, rows, {}, 0, placement, records, true);
    check(step, placement[0]);
  }
}

}  // namespace

TEST_CASE("TOVA never evicts the query's own token, even when it scores lowest", "[replay]") {
  // Every older token is attended equally and the newest not at all; one row is not finite
  // (the previous scores stand, the new token's 0).
  constexpr std::uint64_t kBroken = 7;
  const auto row_of = [](std::uint64_t step, std::uint64_t length) {
    std::vector<float> row(length, 1.0F / static_cast<float>(length - 1));
    row.back() = 0.0F;
    if (step == kBroken) {
      row.front() = std::numeric_limits<float>::quiet_NaN();
    }
    return row;
  };
  step_one_layer("tova:budget=8", 4, 40, row_of,
                 [](std::uint64_t step, const kvtier::replay::LayerPlacement& layer) {
                   INFO("step " << step);
                   CHECK(layer.tier(layer.size() - 1) != Tier::kEvicted);
                   CHECK(layer.resident() <= 8);
                 });
}

TEST_CASE("H2O keeps its whole recent window, even the tokens scoring lowest", "[replay]") {
  // budget 8, recent 0.5: the newest 4 tokens are never candidates. They get no attention (the
  // lowest accumulated scores); the older ones share it all.
  constexpr std::uint64_t kRecent = 4;
  const auto row_of = [](std::uint64_t, std::uint64_t length) {
    std::vector<float> row(length, 0.0F);
    std::fill(row.begin(), row.end() - kRecent, 1.0F / static_cast<float>(length - kRecent));
    return row;
  };
  step_one_layer("h2o:budget=8,recent=0.5", 6, 40, row_of,
                 [](std::uint64_t step, const kvtier::replay::LayerPlacement& layer) {
                   INFO("step " << step);
                   for (std::uint64_t token = layer.size() - kRecent; token < layer.size();
                        ++token) {
                     CHECK(layer.tier(token) != Tier::kEvicted);
                   }
                   CHECK(layer.resident() == std::min<std::uint64_t>(layer.size(), 8));
                 });
}
