// Per-layer budgets (uniform, pyramid, explicit) across every budgeted policy, the oracle bound,
// the data a policy needs, and determinism of the whole library.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::ReplayDemand;
using kvtier::test::budgets_of;
using kvtier::test::held_tokens;
using kvtier::test::kept_mass;
using kvtier::test::RichShape;
using kvtier::test::run_policy;

namespace {

const RichShape kShape{};  // 3 layers, 120-token prompt, 60 steps, 4 heads, window 32, norms

ReplayDemand run(const std::string& policy) {
  auto source = kvtier::test::rich_attention(kShape, 5);
  return run_policy(source, policy);
}

std::string canonical_of(const std::string& policy, std::uint32_t layers = 3) {
  const auto registry = kvtier::replay::builtin_policies();
  std::string canonical;
  (void)registry.create(kvtier::replay::parse_policy_string(policy), {layers, 100, 10}, &canonical);
  return canonical;
}

}  // namespace

TEST_CASE("explicit allocation takes one budget per layer, separated by '/'", "[replay]") {
  CHECK(budgets_of("h2o:allocation=explicit,budgets=64/128/96", 3) ==
        std::vector<std::uint64_t>{64, 128, 96});
  // `budget` keeps meaning the mean: filled in when left out, checked when given.
  CHECK(canonical_of("h2o:allocation=explicit,budgets=64/128/96") ==
        "h2o:budget=96,allocation=explicit,budgets=64/128/96,recent=0.5");
  CHECK(canonical_of("h2o:budget=96,allocation=explicit,budgets=64/128/96") ==
        "h2o:budget=96,allocation=explicit,budgets=64/128/96,recent=0.5");
  CHECK(canonical_of("tova:allocation=explicit,budgets=64/65/65") ==
        "tova:budget=65,allocation=explicit,budgets=64/65/65");
  CHECK(canonical_of("tova:budget=64,allocation=explicit,budgets=64/65/65") ==
        "tova:budget=64,allocation=explicit,budgets=64/65/65");
  // One layer: a single integer is a list of one.
  CHECK(budgets_of("oracle:allocation=explicit,budgets=77", 1) == std::vector<std::uint64_t>{77});
  // The canonical string parses back to itself, for every budgeted policy.
  for (const char* name :
       {"h2o", "tova", "oracle", "dms", "knorm", "snapkv", "pyramidkv", "adakv"}) {
    INFO(name);
    const std::string canonical =
        canonical_of(std::string(name) + ":allocation=explicit,budgets=40/50/61");
    CHECK_THAT(canonical, Catch::Contains("budget=50,") &&
                              Catch::Contains("allocation=explicit,budgets=40/50/61"));
    CHECK(canonical_of(canonical) == canonical);
  }
  // Lists are left out of the canonical string when absent.
  CHECK(canonical_of("h2o") == "h2o:budget=1024,allocation=uniform,recent=0.5");
}

TEST_CASE("bad explicit budgets are rejected, naming the parameter", "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const auto fails = [&](const std::string& text, const std::string& what,
                         const std::string& where) {
    INFO(text);
    try {
      (void)registry.create(kvtier::replay::parse_policy_string(text), {3, 100, 10});
      FAIL("accepted");
    } catch (const kvtier::ConfigError& error) {
      CHECK_THAT(error.what(), Catch::Contains(what));
      CHECK_THAT(error.where(), Catch::Contains(where));
    }
  };
  for (const char* name :
       {"h2o", "tova", "oracle", "dms", "knorm", "snapkv", "pyramidkv", "adakv"}) {
    const std::string policy = std::string(name) + ":allocation=explicit,";
    fails(policy + "budgets=64/128", "budgets has 2 entries for a model of 3 layers",
          "parameter budgets");
    fails(policy + "budgets=64/128/96/10", "budgets has 4 entries", "parameter budgets");
    fails(policy + "budgets=64/x/96", "entry 2 'x' is not an integer",
          std::string("policy ") + name + ", parameter budgets");
    fails(policy + "budgets=64/12.5/96", "entry 2 '12.5' is not an integer", "parameter budgets");
    fails(policy + "budgets=64/0/96", "entry 2 value 0 is out of range", "parameter budgets");
    fails(policy + "budgets=64/-5/96", "entry 2 value -5 is out of range", "parameter budgets");
    fails(policy + "budgets=64//96", "entry 2 '' is not an integer", "parameter budgets");
    fails(policy + "budgets=", "an empty list", "parameter budgets");
    fails(policy + "budget=70,budgets=64/128/96", "budget 70 is not the mean of budgets (96)",
          "parameter budget");
    fails(std::string(name) + ":allocation=explicit", "allocation=explicit needs budgets",
          "parameter budgets");
    fails(std::string(name) + ":budgets=64/128/96",
          std::string("budgets needs allocation=explicit (allocation is ") +
              (std::string(name) == "pyramidkv" ? "pyramid" : "uniform") + ")",
          "parameter budgets");
  }
  fails("h2o:allocation=even", "'even' is not one of uniform, pyramid, explicit",
        "parameter allocation");
  fails("monarch:budgets=1/2/3", "has no parameter 'budgets'", "");
}

TEST_CASE("budgeted policies never exceed their budgets, explicit budgets included", "[replay]") {
  for (const char* allocation :
       {"budget=50", "budget=100,allocation=pyramid", "allocation=explicit,budgets=30/70/45"}) {
    for (const char* rest : {"h2o:recent=0.3", "tova:", "dms:delay=0", "dms:scorer=knorm,delay=0",
                             "knorm:", "knorm:recent=12"}) {
      std::string policy = std::string(rest);
      policy += (policy.back() == ':' ? "" : ",") + std::string(allocation);
      INFO(policy);
      const auto budgets = budgets_of(policy, kShape.layers);
      const auto demand = run(policy);
      for (std::uint64_t step = 0; step < kShape.steps; ++step) {
        for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
          REQUIRE(held_tokens(demand, step, layer) <= budgets[layer]);
        }
      }
      // The budgets bind: by the end every layer is full.
      for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
        CHECK(held_tokens(demand, kShape.steps - 1, layer) == budgets[layer]);
      }
    }
  }
}

TEST_CASE("prompt-compressing policies hold their budget of prompt tokens", "[replay]") {
  for (const char* policy :
       {"snapkv:budget=50", "snapkv:allocation=explicit,budgets=40/90/64",
        "pyramidkv:budget=80,window=32", "pyramidkv:allocation=explicit,budgets=40/90/64,window=16",
        // capped at the prompt: 120 (the whole prompt), 95, 70
        "pyramidkv:budget=95,window=32"}) {
    INFO(policy);
    const auto budgets = budgets_of(policy, kShape.layers, kShape.prompt);
    // Every token of the mean budget is used: L·B prompt tokens, or the whole prompt where a
    // layer's budget reaches it (PyramidKV gives the first layers' excess to the last).
    std::uint64_t held_prompt = 0;
    for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
      held_prompt += std::min(budgets[layer], kShape.prompt);
    }
    if (std::string_view(policy).find("explicit") == std::string_view::npos) {
      CHECK(held_prompt == kShape.layers * budgets_of(policy, 1)[0]);
    }
    const auto demand = run(policy);
    for (std::uint64_t step = 0; step < kShape.steps; ++step) {
      for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
        // Generated tokens are all kept; the prompt part is exactly the budget.
        REQUIRE(held_tokens(demand, step, layer) == budgets[layer] + step + 1);
      }
    }
  }
}

TEST_CASE("the oracle at the same budget bounds the decode-time policies", "[replay]") {
  const auto oracle = run("oracle:budget=40");
  const auto oracle_delayed = run("oracle:budget=56");
  for (const char* policy : {"h2o:budget=40", "tova:budget=40", "dms:budget=40,delay=0",
                             "dms:budget=40,scorer=knorm,delay=0", "knorm:budget=40",
                             "knorm:budget=40,recent=8", "dms:budget=40,delay=16"}) {
    INFO(policy);
    const auto demand = run(policy);
    // DMS holds marked tokens until they leave its window: up to budget + delay.
    const bool delayed = std::string(policy).find("delay=16") != std::string::npos;
    const ReplayDemand& bound = delayed ? oracle_delayed : oracle;
    // From step 1: policies scoring by attention hold the whole prompt during step 0, whose
    // attention they need before they can choose.
    for (std::uint64_t step = 1; step < kShape.steps; ++step) {
      for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
        REQUIRE(kept_mass(bound, step, layer) >= kept_mass(demand, step, layer) - 1e-6);
      }
    }
  }
}

TEST_CASE("no policy keeps more than the oracle at the number of tokens it holds", "[replay]") {
  auto source = kvtier::test::rich_attention(kShape, 5);
  std::vector<std::vector<float>> rows;
  for (const char* policy :
       {"h2o:budget=40", "dms:budget=40,delay=16", "knorm:budget=30,recent=4", "snapkv:budget=50",
        "pyramidkv:budget=70,window=32", "adakv:budget=50", "adakv:budget=50,mass=mean",
        "monarch:window=48,max_hot=64,threshold=0.01", "monarch:window=48,max_hot=64,attend=all",
        "tiered:delta=8,recent=8,evict=0.3", "streaming:sinks=4,window=30"}) {
    INFO(policy);
    const auto demand = run_policy(source, policy);
    const bool hot_only = std::string(policy).find("monarch") != std::string::npos &&
                          std::string(policy).find("attend=all") == std::string::npos;
    for (std::uint64_t step = 0; step < kShape.steps; ++step) {
      source.read_step(step, rows);
      for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
        // Held between steps: after the previous step (at step 0 at most the prompt). Monarch
        // reading hot pages only keeps at most what its HBM tokens can.
        std::uint64_t held = kShape.prompt;
        if (step > 0) {
          held = hot_only ? demand.at(step - 1, layer).tokens[0]
                          : held_tokens(demand, step - 1, layer);
        }
        REQUIRE(kept_mass(demand, step, layer) <=
                kvtier::test::oracle_bound(rows[layer], held) + 1e-5);
      }
    }
  }
}

TEST_CASE("a policy needing data the trace lacks is refused naming the dataset", "[replay]") {
  const auto refuses = [](RichShape shape, const std::string& policy, const std::string& dataset) {
    INFO(policy);
    auto source = kvtier::test::rich_attention(shape, 1);
    try {
      (void)run_policy(source, policy);
      FAIL("accepted");
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.what(), Catch::Contains(dataset));
    }
  };
  RichShape no_window = kShape;
  no_window.window = 0;
  RichShape no_norms = kShape;
  no_norms.kv_heads = 0;
  RichShape no_heads = kShape;
  no_heads.head_rows = false;
  for (const char* policy :
       {"snapkv:budget=50", "pyramidkv:budget=50", "adakv:budget=50,mass=mean"}) {
    refuses(no_window, policy, "/prefill/window");
  }
  refuses(no_norms, "knorm:budget=50", "/keys/norm");
  refuses(no_norms, "dms:budget=50,scorer=knorm", "/keys/norm");
  refuses(no_heads, "adakv:budget=50", "/attention/heads");
  // A window longer than the trace's is refused too, naming what to set.
  refuses(kShape, "pyramidkv:budget=100", "set window=32");
  // Policies that need nothing extra run on head-mean rows alone.
  RichShape bare = kShape;
  bare.window = 0;
  bare.kv_heads = 0;
  bare.head_rows = false;
  auto source = kvtier::test::rich_attention(bare, 1);
  for (const char* policy : {"monarch", "dms:budget=50", "h2o:budget=50", "tiered"}) {
    INFO(policy);
    CHECK_NOTHROW(run_policy(source, policy));
  }
}

TEST_CASE("every policy replays deterministically", "[replay]") {
  for (const char* policy :
       {"monarch:window=48,max_hot=64,threshold=0.01", "dms:budget=40,delay=16",
        "dms:budget=40,scorer=knorm,delay=8", "snapkv:budget=50", "pyramidkv:budget=70,window=32",
        "adakv:budget=50", "knorm:budget=40,recent=4",
        "h2o:allocation=explicit,budgets=30/70/45"}) {
    INFO(policy);
    const auto first = run(policy);
    const auto second = run(policy);
    for (std::uint64_t step = 0; step < kShape.steps; ++step) {
      for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
        const auto& a = first.at(step, layer);
        const auto& b = second.at(step, layer);
        REQUIRE(a.tokens == b.tokens);
        REQUIRE(a.mass == b.mass);
        REQUIRE(a.promoted == b.promoted);
        REQUIRE(a.compressed == b.compressed);
        REQUIRE(a.evicted == b.evicted);
      }
    }
  }
}

TEST_CASE("the registry lists every policy with its source and published defaults", "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  std::vector<std::string> names;
  for (const auto& info : registry.all()) {
    names.push_back(info.name);
    CHECK_FALSE(info.summary.empty());
    CHECK_FALSE(info.source.empty());
  }
  CHECK(names == std::vector<std::string>{"adakv", "dms", "full", "h2o", "knorm", "monarch",
                                          "oracle", "pyramidkv", "snapkv", "streaming", "tiered",
                                          "tova"});
  CHECK(canonical_of("monarch") ==
        "monarch:preset=default,window=512,max_hot=768,sticky_tokens=16,page=16,decay=0.92,"
        "threshold=0.12,sticky_after=2,attend=hot,compression=turboquant");
  CHECK(canonical_of("dms") == "dms:budget=1024,allocation=uniform,delay=256,scorer=attention");
  CHECK(canonical_of("snapkv") ==
        "snapkv:budget=1024,allocation=uniform,window=32,kernel=7,pooling=max");
  CHECK(canonical_of("pyramidkv") ==
        "pyramidkv:budget=1024,allocation=pyramid,window=64,kernel=7,pooling=max");
  CHECK(canonical_of("adakv") ==
        "adakv:budget=1024,allocation=uniform,window=32,kernel=7,pooling=max,floor=0.2,mass=heads");
  CHECK(canonical_of("knorm") == "knorm:budget=1024,allocation=uniform,recent=0");
}
