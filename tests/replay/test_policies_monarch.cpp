// Monarch's hot/cold paging: whole pages, shared by every layer, never evicted; the window is
// always hot and the hot set stays within max_hot rounded up to pages.

#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::LayerPlacement;
using kvtier::replay::ReplayDemand;
using kvtier::replay::Tier;
using kvtier::test::RichShape;

namespace {

RichShape monarch_shape() {
  RichShape shape;
  shape.prompt = 150;
  shape.steps = 250;
  return shape;
}

struct PageChecks {
  std::uint64_t window = 0;
  std::uint64_t max_hot = 0;
  std::uint64_t page = 16;
  std::uint64_t steps_checked = 0;
  std::uint64_t most_hot_outside_window = 0;  // hot tokens beyond the window's pages
};

// Replays `policy`, checking the placement after start and after every step.
ReplayDemand run_checked(const std::string& policy, PageChecks& checks,
                         const RichShape& shape = monarch_shape()) {
  auto source = kvtier::test::rich_attention(shape, 3);
  auto inner = kvtier::test::make_policy(policy, source);
  kvtier::test::CheckedPolicy checked(
      std::move(inner), [&](std::int64_t step, const std::vector<LayerPlacement>& placement) {
        INFO("step " << step);
        const LayerPlacement& first = placement.front();
        const std::uint64_t tokens = first.size();
        // Every layer holds every token in the same tier.
        for (const LayerPlacement& layer : placement) {
          for (std::uint64_t token = 0; token < tokens; ++token) {
            REQUIRE(layer.tier(token) == first.tier(token));
          }
        }
        // Nothing evicted; cold tokens are compressed on the host.
        REQUIRE(first.count(Tier::kEvicted) == 0);
        REQUIRE(first.count(Tier::kHost) == 0);
        // Pages are whole.
        for (std::uint64_t start = 0; start < tokens; start += checks.page) {
          for (std::uint64_t token = start; token < std::min(tokens, start + checks.page);
               ++token) {
            REQUIRE(first.tier(token) == first.tier(start));
          }
        }
        // The window is hot; the hot tokens fit in max_hot rounded up to whole pages.
        for (std::uint64_t token = tokens > checks.window ? tokens - checks.window : 0;
             token < tokens; ++token) {
          REQUIRE(first.tier(token) == Tier::kHbm);
        }
        const std::uint64_t capacity =
            (checks.max_hot + checks.page - 1) / checks.page * checks.page;
        REQUIRE(first.count(Tier::kHbm) <= capacity);
        const std::uint64_t window_start = tokens > checks.window ? tokens - checks.window : 0;
        const std::uint64_t window_pages_start = window_start / checks.page * checks.page;
        std::uint64_t outside = 0;
        for (std::uint64_t token = 0; token < window_pages_start; ++token) {
          outside += first.tier(token) == Tier::kHbm ? 1 : 0;
        }
        checks.most_hot_outside_window = std::max(checks.most_hot_outside_window, outside);
        ++checks.steps_checked;
      });
  return kvtier::replay::replay(source, checked);
}

// One layer, a 32-token prompt; every step's attention falls evenly on the last 16 tokens
// (0.0625 each, below the threshold), except step 15, whose own token (position 47, the last
// of page 2) takes 0.5.
kvtier::replay::InMemoryAttention one_heavy_step() {
  constexpr std::uint64_t kPrompt = 32;
  constexpr std::uint64_t kSteps = 60;
  std::vector<std::vector<std::vector<float>>> rows(kSteps);
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    std::vector<float> row(kPrompt + step + 1, 0.0F);
    for (std::uint64_t token = row.size() - 16; token < row.size(); ++token) {
      row[token] = step == 15 ? 0.5F / 15 : 1.0F / 16;
    }
    if (step == 15) {
      row.back() = 0.5F;
    }
    rows[step] = {row};
  }
  return {1, kPrompt, std::move(rows)};
}

}  // namespace

TEST_CASE("monarch pages whole pages shared by all layers and never evicts", "[replay]") {
  for (const auto& [policy, window, max_hot] :
       {std::tuple<std::string, std::uint64_t, std::uint64_t>{
            "monarch:window=40,max_hot=72,threshold=0.01", 40, 72},
        {"monarch:window=64,max_hot=80,threshold=0.005,sticky_tokens=4", 64, 80},
        {"monarch:window=33,max_hot=50,threshold=0.02,page=8", 33, 50},
        {"monarch:window=48,max_hot=200", 48, 200}}) {
    INFO(policy);
    PageChecks checks;
    checks.window = window;
    checks.max_hot = max_hot;
    if (policy.find("page=8") != std::string::npos) {
      checks.page = 8;
    }
    const auto demand = run_checked(policy, checks);
    CHECK(checks.steps_checked == monarch_shape().steps + 1);
    CHECK(demand.summary().evicted == 0);
    // Paging happens: cold pages exist and pages come back.
    CHECK(demand.at(monarch_shape().steps - 1, 0).tokens[2] > 0);
  }
}

TEST_CASE("monarch promotes high-EMA tokens beyond the window and sticky set", "[replay]") {
  PageChecks checks;
  checks.window = 40;
  checks.max_hot = 120;
  const auto demand = run_checked("monarch:window=40,max_hot=120,threshold=0.05", checks);
  // More hot than the window's pages and the 16 sticky prompt tokens (one page), and cold
  // pages paged back in.
  CHECK(checks.most_hot_outside_window > 16);
  CHECK(demand.summary().promoted > 0);
  // With a threshold no token reaches, only the window and the first sticky page are hot.
  PageChecks strict = checks;
  strict.most_hot_outside_window = 0;
  const auto none = run_checked("monarch:window=40,max_hot=120,threshold=1", strict);
  CHECK(strict.most_hot_outside_window == 16);
  CHECK(none.summary().promoted == 0);
}

TEST_CASE(
    "monarch's EMA keeps a page hot past the window until it decays, and pages it back in "
    "when room frees",
    "[replay]") {
  kvtier::replay::InMemoryAttention source = one_heavy_step();
  const std::string common = "monarch:window=16,sticky_tokens=0,sticky_after=1000,";
  SECTION("decay 0.92: cold once 0.5 * 0.92^k falls below 0.12 (k = 18)") {
    const auto demand = kvtier::test::run_policy(source, common + "max_hot=64");
    // Step 31: the window (48..63) leaves page 2 behind; its EMA 0.5·0.92^16 = 0.132 keeps it.
    CHECK(demand.at(31, 0).tokens[0] == 32);
    CHECK(demand.at(32, 0).tokens[0] == 33);  // 0.121: still hot, with page 4's first token
    CHECK(demand.at(33, 0).tokens[0] == 18);  // 0.111: cold
    CHECK(demand.at(33, 0).compressed == 16);
    CHECK(demand.summary().promoted == 0);
    CHECK(demand.summary().mean_kept_mass == Approx(1.0).epsilon(1e-5));
  }
  SECTION("decay 0.99 with room for two pages: out when the window spans two, back when one") {
    const auto demand = kvtier::test::run_policy(source, common + "max_hot=32,decay=0.99");
    CHECK(demand.at(31, 0).tokens[0] == 32);   // window = page 3, page 2 by its EMA
    CHECK(demand.at(32, 0).compressed == 16);  // pages 3 and 4 (one token): no room for page 2
    CHECK(demand.at(32, 0).tokens[0] == 17);
    CHECK(demand.at(47, 0).promoted == 16);  // window = page 4 alone: page 2 comes back
    CHECK(demand.at(47, 0).tokens[0] == 32);
    CHECK(demand.at(48, 0).compressed == 16);
  }
}

TEST_CASE("a token promoted sticky_after times stays hot after its EMA has decayed", "[replay]") {
  // Token 47 is promoted three times, as Monarch counts: at step 15, hot in the window with a
  // score of 0.5 >= the 0.12 threshold, and at steps 31 and 32, kept hot past the window by
  // its EMA (0.5·0.92^16 = 0.132, 0.121). At step 33 the EMA (0.111) no longer keeps it.
  kvtier::replay::InMemoryAttention source = one_heavy_step();
  const std::string common = "monarch:window=16,sticky_tokens=0,max_hot=64,";
  // sticky_after=3: sticky from step 32, so page 2 stays hot beside the window's pages for
  // good — 16 + 18 tokens at step 33 (window 50..65: pages 3 and 4), 16 + 28 at step 59.
  const auto sticky = kvtier::test::run_policy(source, common + "sticky_after=3");
  CHECK(sticky.at(33, 0).tokens[0] == 34);
  CHECK(sticky.at(59, 0).tokens[0] == 44);
  CHECK(sticky.at(59, 0).tokens[2] == 92 - 44);
  // sticky_after=4: three promotions are not enough, and page 2 goes cold at step 33.
  const auto not_sticky = kvtier::test::run_policy(source, common + "sticky_after=4");
  CHECK(not_sticky.at(33, 0).tokens[0] == 18);
  CHECK(not_sticky.at(59, 0).tokens[0] == 28);
}

TEST_CASE("monarch reads only hot pages unless told to read all", "[replay]") {
  auto source = kvtier::test::rich_attention(monarch_shape(), 3);
  const auto hot = kvtier::test::run_policy(source, "monarch:window=40,max_hot=72");
  const auto all = kvtier::test::run_policy(source, "monarch:window=40,max_hot=72,attend=all");
  bool lost_some = false;
  for (std::uint64_t step = 0; step < monarch_shape().steps; ++step) {
    for (std::uint32_t layer = 0; layer < monarch_shape().layers; ++layer) {
      const auto& record = hot.at(step, layer);
      // The cold pages' share is lost to the model that step, though no token is evicted.
      CHECK(record.mass[2] == 0.0F);
      CHECK(record.tokens[3] == 0);
      lost_some = lost_some || record.mass[3] > 1e-4F;
      // Reading everything keeps all the attention (the cold share on T2).
      CHECK(kvtier::test::kept_mass(all, step, layer) == Approx(1.0).epsilon(1e-5));
    }
  }
  CHECK(lost_some);
  CHECK(all.at(monarch_shape().steps - 1, 0).mass[2] > 0.0F);
  // The demand says so, for the simulator, which stages only what attention reads.
  CHECK_FALSE(hot.attends_compressed());
  CHECK(all.attends_compressed());
}

TEST_CASE("monarch presets set window, max_hot and sticky tokens, and explicit values win",
          "[replay]") {
  const auto registry = kvtier::replay::builtin_policies();
  const auto canonical = [&](const std::string& text) {
    std::string result;
    (void)registry.create(kvtier::replay::parse_policy_string(text), {2, 10, 10}, &result);
    return result;
  };
  CHECK_THAT(canonical("monarch:preset=fast"),
             Catch::Contains("preset=fast,window=256,max_hot=384,sticky_tokens=16,"));
  CHECK_THAT(canonical("monarch:preset=accurate"),
             Catch::Contains("preset=accurate,window=768,max_hot=1024,sticky_tokens=32,"));
  CHECK_THAT(canonical("monarch:preset=fast,window=300,sticky_tokens=4"),
             Catch::Contains("preset=fast,window=300,max_hot=384,sticky_tokens=4,"));
  CHECK_THROWS_WITH(
      registry.create(kvtier::replay::parse_policy_string("monarch:window=760"), {2, 10, 10}),
      Catch::Contains("window 760 (plus a partial page of 15) does not fit in max_hot 768"));
  CHECK_THROWS_WITH(
      registry.create(kvtier::replay::parse_policy_string("monarch:preset=fast,window=512"),
                      {2, 10, 10}),
      Catch::Contains("does not fit in max_hot 384"));
}

TEST_CASE("monarch's cold pages cost its compression format's bytes", "[replay]") {
  using kvtier::replay::CompressedFormat;
  auto source = kvtier::test::rich_attention(monarch_shape(), 3);
  CHECK(kvtier::test::run_policy(source, "monarch").compressed_format() ==
        CompressedFormat{16.0, 0});
  CHECK(kvtier::test::run_policy(source, "monarch:compression=polar-int4").compressed_format() ==
        CompressedFormat{6.25, 0});
  // The live cache's format: int8 codes and a float32 scale per head vector, as tiered's T2.
  CHECK(kvtier::test::run_policy(source, "monarch:compression=int8").compressed_format() ==
        kvtier::replay::kInt8HeadScaled);
  CHECK(kvtier::test::run_policy(source, "tiered").compressed_format() == CompressedFormat{8.0, 4});
  // stories260K (4 KV heads of 8): 64 bytes of codes + 32 of scales, as the live cache stores;
  // Llama-3.1-8B (8 of 128): 2,048 + 64.
  CHECK(kvtier::replay::kInt8HeadScaled.token_layer_bytes(4, 8) == 96.0);
  CHECK(kvtier::replay::kInt8HeadScaled.token_layer_bytes(8, 128) == 2112.0);
  CHECK(CompressedFormat{16.0, 0}.token_layer_bytes(8, 128) == 4096.0);
}

TEST_CASE("monarch with a window longer than the trace keeps everything hot", "[replay]") {
  auto source = kvtier::test::rich_attention(monarch_shape(), 3);
  const auto monarch = kvtier::test::run_policy(source, "monarch:window=400,max_hot=1024");
  const auto full = kvtier::test::run_policy(source, "full");
  for (std::uint64_t step = 0; step < monarch_shape().steps; ++step) {
    for (std::uint32_t layer = 0; layer < monarch_shape().layers; ++layer) {
      CHECK(monarch.at(step, layer).tokens == full.at(step, layer).tokens);
      CHECK(monarch.at(step, layer).mass == full.at(step, layer).mass);
    }
  }
}
