// Clusters: several engines behind a router on one simulator, the routing policies, and the
// merged report.

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "serving/cluster.hpp"
#include "serving/router.hpp"
#include "serving/simulation.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::Cluster;
using kvtier::serving::Metric;
using kvtier::serving::RequestSpec;
using kvtier::serving::SimulationReport;
using kvtier::serving::Workload;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;

namespace {

RunSpec run_with(std::vector<std::string> sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

RunSpec cluster_run(std::uint32_t engines, const std::string& routing,
                    std::vector<std::string> sets = {}) {
  sets.push_back("cluster.engines=" + std::to_string(engines));
  sets.push_back("cluster.routing=" + routing);
  return run_with(sets);
}

std::map<std::string, double> by_name(const std::vector<Metric>& metrics) {
  std::map<std::string, double> values;
  for (const Metric& metric : metrics) {
    values[metric.name] = metric.value;
  }
  return values;
}

// A request arriving at `seconds` whose prompt starts with 2,048 tokens of content `id`, then
// 128 of its own; 16 out.
RequestSpec after_prefix_at(double seconds, std::uint64_t id) {
  RequestSpec request = request_at(seconds, 2048 + 128, 16);
  request.shared_tokens = 2048;
  request.segment_tokens = 2048;
  request.segments = {id};
  return request;
}

std::vector<std::uint64_t> routed(const RunSpec& run, Workload workload) {
  return serve(run, std::move(workload))->cluster->routed();
}

const std::vector<std::string> kPrefixCaching = {"memory.kv_block_tokens=16",
                                                 "memory.prefix_caching=true",
                                                 "workload.prefill_chunk_tokens=4096"};

}  // namespace

TEST_CASE("a cluster of one engine reports what the engine alone does, and its own figures",
          "[cluster]") {
  const SimulationReport alone = kvtier::serving::simulate(run_with({}));
  const SimulationReport cluster = kvtier::serving::simulate(cluster_run(1, "ROUND_ROBIN"));
  REQUIRE(cluster.metrics.size() == alone.metrics.size() + 6);
  for (std::size_t i = 0; i < alone.metrics.size(); ++i) {
    CHECK(cluster.metrics[i].name == alone.metrics[i].name);
    CHECK(cluster.metrics[i].value == alone.metrics[i].value);
  }
  const auto figures = by_name(cluster.metrics);
  CHECK(figures.at("cluster_engines") == 1);
  CHECK(figures.at("cluster_gpus") == 1);
  CHECK(figures.at("cluster_nodes") == 1);
  CHECK(figures.at("engine_requests_min") == 8);
  CHECK(figures.at("engine_requests_max") == 8);
  CHECK(figures.at("engine_busy_imbalance") == 1.0);
  CHECK(cluster.notes.size() == alone.notes.size() + 1);
  // The engine's own metrics: requests_routed, then the report's own up to simulated_events.
  REQUIRE(cluster.engines.size() == 1);
  const std::vector<Metric>& engine = cluster.engines.front();
  REQUIRE(engine.size() == alone.metrics.size());
  CHECK(engine.front().name == "requests_routed");
  CHECK(engine.front().value == 8);
  for (std::size_t i = 1; i < engine.size(); ++i) {
    CHECK(engine[i].name == alone.metrics[i - 1].name);
    CHECK(engine[i].value == alone.metrics[i - 1].value);
  }
  CHECK(alone.engines.empty());
}

TEST_CASE("requests that never meet get the same latencies from any number of engines",
          "[cluster]") {
  std::vector<RequestSpec> requests;
  for (int i = 0; i < 7; ++i) {
    requests.push_back(request_at(10.0 * i, 128, 16));
  }
  const auto one = serve(cluster_run(1, "ROUND_ROBIN"), open_loop(requests));
  const auto three = serve(cluster_run(3, "ROUND_ROBIN"), open_loop(requests));
  CHECK(three->cluster->routed() == std::vector<std::uint64_t>{3, 2, 2});
  const auto& alone = one->cluster->engine(0);
  for (std::size_t e = 0; e < 3; ++e) {
    const auto& engine = three->cluster->engine(e);
    CHECK(engine.totals().requests_completed == three->cluster->routed()[e]);
    CHECK(engine.ttft().max() == alone.ttft().min());
    CHECK(engine.ttft().min() == alone.ttft().max());
    CHECK(engine.e2e().max() == alone.e2e().max());
  }
}

TEST_CASE("simultaneous requests on separate engines each run alone", "[cluster]") {
  const std::vector<RequestSpec> pair = {request_at(0, 512, 16), request_at(0, 512, 16)};
  const auto lone = serve(cluster_run(1, "ROUND_ROBIN"), open_loop({request_at(0, 512, 16)}));
  const auto batched = serve(cluster_run(1, "ROUND_ROBIN"), open_loop(pair));
  const auto spread = serve(cluster_run(2, "ROUND_ROBIN"), open_loop(pair));
  const Tick alone = lone->cluster->engine(0).ttft().max();
  CHECK(spread->cluster->engine(0).ttft().max() == alone);
  CHECK(spread->cluster->engine(1).ttft().max() == alone);
  CHECK(batched->cluster->engine(0).ttft().max() > alone);
}

TEST_CASE("least-outstanding routing sends requests past a busy engine, round robin does not",
          "[cluster]") {
  // A long request first, then three short ones a second apart, each done long before the next.
  const Workload workload = open_loop({request_at(0, 128, 2000), request_at(1, 128, 4),
                                       request_at(2, 128, 4), request_at(3, 128, 4)});
  CHECK(routed(cluster_run(2, "ROUND_ROBIN"), workload) == std::vector<std::uint64_t>{2, 2});
  CHECK(routed(cluster_run(2, "LEAST_OUTSTANDING"), workload) == std::vector<std::uint64_t>{1, 3});
}

TEST_CASE("prefix-hash routing keeps a prefix on one engine and spreads the rest", "[cluster]") {
  std::vector<RequestSpec> prefixed;
  std::vector<RequestSpec> plain;
  for (int i = 0; i < 6; ++i) {
    prefixed.push_back(after_prefix_at(5.0 * i, 41));
    plain.push_back(request_at(5.0 * i, 128, 16));
  }
  const RunSpec run = cluster_run(3, "PREFIX_HASH", kPrefixCaching);
  std::vector<std::uint64_t> counts = routed(run, open_loop(prefixed));
  std::sort(counts.begin(), counts.end());
  CHECK(counts == std::vector<std::uint64_t>{0, 0, 6});
  CHECK(routed(run, open_loop(plain)) == std::vector<std::uint64_t>{2, 2, 2});
  // On its engine the prefix is computed once, as on one engine alone.
  const auto one = serve(cluster_run(1, "PREFIX_HASH", kPrefixCaching), open_loop(prefixed));
  const auto three = serve(run, open_loop(prefixed));
  std::uint64_t hits = 0;
  for (std::size_t e = 0; e < 3; ++e) {
    hits += three->cluster->engine(e).totals().prefix_hit_tokens;
  }
  CHECK(hits == one->cluster->engine(0).totals().prefix_hit_tokens);
  CHECK(hits == 5 * 2048);
}

TEST_CASE("KV-aware routing follows the cached blocks, round robin scatters them", "[cluster]") {
  // Prefixes X X Y Y X X Y Y, one at a time: round robin sends every second one to the engine
  // that has not cached its prefix; KV-aware routing sends each to the engine that has.
  std::vector<RequestSpec> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(after_prefix_at(5.0 * i, (i / 2) % 2));
  }
  const auto hits = [&requests](const RunSpec& run) {
    const auto served = serve(run, open_loop(requests));
    std::uint64_t tokens = 0;
    for (std::size_t e = 0; e < served->cluster->size(); ++e) {
      tokens += served->cluster->engine(e).totals().prefix_hit_tokens;
    }
    return tokens;
  };
  std::vector<std::string> kv_aware = kPrefixCaching;
  kv_aware.emplace_back("cluster.kv_overlap_weight=1");
  const std::uint64_t one_engine = hits(cluster_run(1, "ROUND_ROBIN", kPrefixCaching));
  CHECK(one_engine == 6 * 2048);
  CHECK(hits(cluster_run(2, "KV_AWARE", kv_aware)) == one_engine);
  CHECK(hits(cluster_run(2, "ROUND_ROBIN", kPrefixCaching)) < one_engine);
}

TEST_CASE("KV-aware routing trades cache hits against load by its overlap weight", "[cluster]") {
  // X alone, then four X at once: a heavy weight keeps them with the cached prefix; weight 0
  // balances the active blocks (the queued requests' included) and ignores the cache.
  std::vector<RequestSpec> requests = {after_prefix_at(0, 3)};
  for (int i = 0; i < 4; ++i) {
    requests.push_back(after_prefix_at(10, 3));
  }
  const auto with_weight = [](double weight) {
    std::vector<std::string> sets = kPrefixCaching;
    std::string text = std::to_string(weight);
    sets.push_back("cluster.kv_overlap_weight=" + text);
    return cluster_run(2, "KV_AWARE", sets);
  };
  CHECK(routed(with_weight(100), open_loop(requests)) == std::vector<std::uint64_t>{5, 0});
  CHECK(routed(with_weight(0), open_loop(requests)) == std::vector<std::uint64_t>{3, 2});
}

TEST_CASE("a cluster's report sums its engines' totals and merges their latencies", "[cluster]") {
  const RunSpec run = cluster_run(2, "ROUND_ROBIN", {"workload.closed_loop.num_requests=9"});
  const SimulationReport report = kvtier::serving::simulate(run);
  const auto cluster = by_name(report.metrics);
  REQUIRE(report.engines.size() == 2);
  const auto first = by_name(report.engines[0]);
  const auto second = by_name(report.engines[1]);
  CHECK(first.at("requests_routed") + second.at("requests_routed") == 9);
  CHECK(cluster.at("requests_completed") == 9);
  CHECK(cluster.at("output_tokens") == first.at("output_tokens") + second.at("output_tokens"));
  CHECK(cluster.at("iterations") == first.at("iterations") + second.at("iterations"));
  CHECK(cluster.at("duration_s") == std::max(first.at("duration_s"), second.at("duration_s")));
  CHECK(cluster.at("hbm_kv_used_peak_gib") ==
        std::max(first.at("hbm_kv_used_peak_gib"), second.at("hbm_kv_used_peak_gib")));
  CHECK(cluster.at("engine_requests_min") == 4);
  CHECK(cluster.at("engine_requests_max") == 5);
  // Means over every request: the engines' means weighted by their requests.
  const double mean_ttft = (first.at("ttft_mean_ms") * first.at("requests_completed") +
                            second.at("ttft_mean_ms") * second.at("requests_completed")) /
                           9.0;
  CHECK(cluster.at("ttft_mean_ms") == Approx(mean_ttft).epsilon(1e-12));
  // Busy time over both GPUs for the cluster's duration.
  const double busy = first.at("gpu_busy_fraction") * first.at("duration_s") +
                      second.at("gpu_busy_fraction") * second.at("duration_s");
  CHECK(cluster.at("gpu_busy_fraction") ==
        Approx(busy / (2 * cluster.at("duration_s"))).epsilon(1e-12));
  // The closed loop keeps its 4 requests in flight across the cluster, not on each engine.
  CHECK(first.at("mean_running_requests") + second.at("mean_running_requests") <= 4.0 + 1e-9);
  CHECK(cluster.at("mean_running_requests") ==
        Approx((first.at("mean_running_requests") + second.at("mean_running_requests")) / 2));

  const std::string json = kvtier::serving::report_json({report}, run, "test");
  CHECK(json.find("\"engines\": [{\"requests_routed\": 5") != std::string::npos);
  const std::string csv = kvtier::serving::engines_csv({report});
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);
  CHECK(csv.rfind("policy,engine,requests_routed,requests_completed,", 0) == 0);
  CHECK(kvtier::serving::engines_csv({kvtier::serving::simulate(run_with({}))}).empty());
}

TEST_CASE("a cluster's same run gives the same report", "[cluster]") {
  std::vector<std::string> sets = kPrefixCaching;
  sets.emplace_back("cluster.kv_overlap_weight=1");
  const RunSpec run = cluster_run(3, "KV_AWARE", sets);
  const std::string first =
      kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "test");
  CHECK(kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "test") == first);
}

TEST_CASE("cluster configs are checked field by field", "[cluster]") {
  using kvtier::test::problems;
  const std::string run = kvtier::test::quickstart_run();
  const auto one_problem = [&](const std::vector<std::string>& sets, const std::string& field,
                               const std::string& text) {
    const std::vector<std::string> lines = problems<RunSpec>(run, sets);
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines.front(), Catch::Contains(field) && Catch::Contains(text));
  };
  one_problem({"cluster.engines=2", "cluster.routing=KV_AWARE", "memory.kv_block_tokens=16"},
              "cluster.kv_overlap_weight", "KV_AWARE routing needs kv_overlap_weight");
  one_problem({"cluster.engines=2", "cluster.routing=KV_AWARE", "cluster.kv_overlap_weight=1"},
              "cluster.routing", "set memory.kv_block_tokens");
  one_problem({"cluster.engines=2", "cluster.routing=ROUND_ROBIN", "cluster.kv_overlap_weight=1"},
              "cluster.kv_overlap_weight", "ROUND_ROBIN has no use for it");
  CHECK_FALSE(problems<RunSpec>(run, {"cluster.engines=0", "cluster.routing=ROUND_ROBIN"}).empty());
  CHECK_FALSE(problems<RunSpec>(run, {"cluster.engines=2"}).empty());  // routing is required
  CHECK(problems<RunSpec>(run, {"cluster.engines=2", "cluster.routing=PREFIX_HASH"}).empty());

  // Built in code, past the loader's checks.
  RunSpec unchecked = run_with({});
  unchecked.mutable_cluster()->set_engines(2);
  Workload workload = open_loop({request_at(0, 128, 16)});
  kvtier::sim::Simulator simulator;
  CHECK_THROWS_AS(Cluster(simulator, unchecked, workload, nullptr), kvtier::ConfigError);
  unchecked.mutable_cluster()->set_routing(kvtier::config::KV_AWARE);
  unchecked.mutable_cluster()->set_kv_overlap_weight(1);
  CHECK_THROWS_WITH(Cluster(simulator, unchecked, workload, nullptr),
                    Catch::Contains("set memory.kv_block_tokens"));
  unchecked.mutable_cluster()->set_engines(0);
  CHECK_THROWS_WITH(Cluster(simulator, unchecked, workload, nullptr),
                    Catch::Contains("at least one engine"));
}

TEST_CASE("an engine refuses a request submitted twice", "[cluster]") {
  const RunSpec run = run_with({});
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run, open_loop({request_at(0, 128, 16)}));
  kvtier::serving::EngineHooks hooks;
  hooks.completed = [](std::uint32_t) {};
  engine.start_serving(std::move(hooks));
  engine.submit(0);
  CHECK_THROWS_AS(engine.submit(0), std::logic_error);
  CHECK_THROWS_AS(engine.submit(1), std::logic_error);
  simulator.run();
  CHECK(engine.totals().requests_completed == 1);
}
