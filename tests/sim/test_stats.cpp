#include <catch2/catch.hpp>

#include <sstream>
#include <stdexcept>

#include "sim/json_writer.hpp"
#include "sim/simulator.hpp"
#include "sim/stats.hpp"
#include "sim/stats_registry.hpp"
#include "sim/time_series.hpp"
#include "tests/sim/catch_tick.hpp"

using kvtier::sim::Counter;
using kvtier::sim::JsonWriter;
using kvtier::sim::LatencyDistribution;
using kvtier::sim::Simulator;
using kvtier::sim::StatsRegistry;
using kvtier::sim::Tick;
using kvtier::sim::TimeSeries;
using kvtier::sim::TimeWeightedGauge;

TEST_CASE("percentiles follow the nearest-rank rule on known samples", "[sim][stats]") {
  LatencyDistribution latency;
  // Recorded out of order on purpose.
  for (const std::int64_t ps : {50, 15, 40, 20, 35}) {
    latency.record(Tick::ps(ps));
  }
  CHECK(latency.percentile(0) == Tick::ps(15));
  CHECK(latency.percentile(5) == Tick::ps(15));   // rank ceil(0.25) = 1
  CHECK(latency.percentile(30) == Tick::ps(20));  // rank ceil(1.5) = 2
  CHECK(latency.percentile(40) == Tick::ps(20));  // rank 2 exactly
  CHECK(latency.percentile(50) == Tick::ps(35));  // rank ceil(2.5) = 3
  CHECK(latency.percentile(100) == Tick::ps(50));
  CHECK(latency.mean_ps() == 32.0);
  CHECK(latency.count() == 5);
}

TEST_CASE("p50, p90 and p99 of 1..100 are 50, 90 and 99", "[sim][stats]") {
  LatencyDistribution latency;
  for (std::int64_t ps = 100; ps >= 1; --ps) {
    latency.record(Tick::ps(ps));
  }
  CHECK(latency.percentile(50) == Tick::ps(50));
  CHECK(latency.percentile(90) == Tick::ps(90));
  CHECK(latency.percentile(99) == Tick::ps(99));
  CHECK(latency.percentile(29) == Tick::ps(29));  // 0.29·100 is 29.000000000000004 in double
  CHECK(latency.min() == Tick::ps(1));
  CHECK(latency.max() == Tick::ps(100));
  latency.record(Tick::ps(1000));  // recording after a query keeps the answers exact
  CHECK(latency.max() == Tick::ps(1000));
}

TEST_CASE("merged distributions answer as one that recorded every sample", "[sim][stats]") {
  LatencyDistribution first;
  LatencyDistribution second;
  LatencyDistribution together;
  for (const std::int64_t ps : {7, 3, 9, 1}) {
    first.record(Tick::ps(ps));
    together.record(Tick::ps(ps));
  }
  CHECK(first.percentile(50) == Tick::ps(3));  // a query sorts `first` before the merge
  for (const std::int64_t ps : {2, 8, 4}) {
    second.record(Tick::ps(ps));
    together.record(Tick::ps(ps));
  }
  LatencyDistribution merged;
  merged.merge(LatencyDistribution{});  // an empty one adds nothing
  merged.merge(first);
  merged.merge(second);
  REQUIRE(merged.count() == 7);
  for (const double p : {0.0, 14.0, 50.0, 71.0, 90.0, 100.0}) {
    CHECK(merged.percentile(p) == together.percentile(p));
  }
  CHECK(merged.mean_ps() == together.mean_ps());
  CHECK(merged.percentile(50) == Tick::ps(4));
}

TEST_CASE("an empty distribution has no percentiles", "[sim][stats]") {
  const LatencyDistribution latency;
  CHECK_THROWS_AS(latency.percentile(50), std::logic_error);
  CHECK_THROWS_AS(latency.mean_ps(), std::logic_error);
}

TEST_CASE("a time-weighted gauge averages over simulated time", "[sim][stats]") {
  Simulator sim;
  TimeWeightedGauge gauge(sim);
  sim.schedule_at(Tick::ns(2), [&] { gauge.set(10); });
  sim.schedule_at(Tick::ns(6), [&] { gauge.add(-6); });
  sim.schedule_at(Tick::ns(6), [&] { gauge.set(4); });
  sim.run_until(Tick::ns(10));
  // 0 for 2 ns, 10 for 4 ns, 4 for 4 ns: 56 / 10.
  CHECK(gauge.time_average() == Approx(5.6).epsilon(1e-15));
  CHECK(gauge.max() == 10.0);
  CHECK(gauge.min() == 0.0);
  CHECK(gauge.value() == 4.0);
}

TEST_CASE("a gauge with no elapsed time reports its value", "[sim][stats]") {
  Simulator sim;
  TimeWeightedGauge gauge(sim, 3.0);
  CHECK(gauge.time_average() == 3.0);
}

TEST_CASE("a time series samples at start + k·interval after the tick's other events",
          "[sim][stats]") {
  Simulator sim;
  int level = 0;
  TimeSeries series(sim, Tick::ns(10), [&] { return static_cast<double>(level); });
  series.start();
  sim.schedule_at(Tick::zero(), [&] { level = 1; });  // same tick as sample 0: seen by it
  sim.schedule_at(Tick::ns(15), [&] { level = 2; });
  sim.schedule_at(Tick::ns(20), [&] { level = 3; });
  sim.schedule_at(Tick::ns(35), [&] { level = 4; });
  sim.run();
  // Samples at 0, 10, 20, 30; the one due at 40 ns is a background event and run() stops at 35.
  CHECK(series.values() == std::vector<double>{1, 1, 3, 3});
  sim.run_until(Tick::ns(50));
  CHECK(series.values() == std::vector<double>{1, 1, 3, 3, 4, 4});
  series.stop();
  sim.run_until(Tick::ns(100));
  CHECK(series.values().size() == 6);
}

TEST_CASE("the JSON writer emits compact, deterministic JSON", "[sim][stats]") {
  std::ostringstream out;
  JsonWriter json(out);
  json.begin_object();
  json.field("name", "a\"b");
  json.field("n", std::int64_t{-3});
  json.field("x", 0.1);
  json.field("nan", 0.0 / 0.0);
  json.key("list");
  json.begin_array();
  json.value(true);
  json.null();
  json.begin_object();
  json.end_object();
  json.end_array();
  json.end_object();
  CHECK(out.str() == R"({"name":"a\"b","n":-3,"x":0.1,"nan":null,"list":[true,null,{}]})");
}

TEST_CASE("the registry dumps every statistic by name in sorted order", "[sim][stats]") {
  Simulator sim;
  Counter copies;
  TimeWeightedGauge used(sim);
  LatencyDistribution waits;
  TimeSeries series(sim, Tick::ns(5), [&] { return used.value(); });
  StatsRegistry registry;
  registry.add("z.copies", copies);
  registry.add("a.used", used);
  registry.add("m.waits", waits);
  registry.add("s.series", series);
  registry.add_value("b.ratio", [] { return 0.25; });
  CHECK_THROWS_AS(registry.add("a.used", copies), std::invalid_argument);
  series.start();
  sim.schedule_at(Tick::ns(5), [&] {
    copies.add(2);
    used.set(8);
    waits.record(Tick::ps(7));
  });
  sim.run_until(Tick::ns(10));
  CHECK(registry.to_json() ==
        R"({"a.used":{"type":"gauge","value":8,"time_average":4,"min":0,"max":8},)"
        R"("b.ratio":{"type":"value","value":0.25},)"
        R"("m.waits":{"type":"distribution","count":1,"min_ps":7,"p50_ps":7,"p90_ps":7,)"
        R"("p99_ps":7,"max_ps":7,"mean_ps":7},)"
        R"("s.series":{"type":"time_series","start_ps":0,"interval_ps":5000,"values":[0,8,8]},)"
        R"("z.copies":{"type":"counter","value":2}})");
}
