// A randomised model using every resource, run twice with one seed, with another seed, and on
// two threads at once: the JSON dump must depend on the seed alone.
#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "sim/capacity_pool.hpp"
#include "sim/fifo_server.hpp"
#include "sim/flow_network.hpp"
#include "sim/random.hpp"
#include "sim/simulator.hpp"
#include "sim/stats.hpp"
#include "sim/stats_registry.hpp"
#include "sim/time_series.hpp"

using namespace kvtier::sim;  // NOLINT(google-build-using-namespace): test brevity

namespace {

// Requests arrive at random, reserve memory, copy a random amount over one of three paths
// through a small PCIe-like network (with duplex coupling), then run a compute job on a FIFO
// stream and free their memory.
std::string run_scenario(std::uint64_t seed) {
  Simulator sim;
  RandomStream arrivals(seed, 0);
  RandomStream sizes(seed, 1);
  FlowNetwork net(sim);
  const LinkId h2d = net.add_link("h2d", 25e9);
  const LinkId d2h = net.add_link("d2h", 25e9);
  const LinkId ddr = net.add_link("ddr", 40e9);
  net.couple(h2d, d2h, 0.85, 0.9);
  const std::vector<std::vector<LinkId>> paths{{ddr, h2d}, {d2h, ddr}, {h2d}};
  FifoServer stream(sim);
  CapacityPool hbm(sim, 64ull << 20);
  LatencyDistribution latency;
  Counter refused;
  TimeSeries hbm_series(sim, Tick::us(20), [&] { return static_cast<double>(hbm.used()); });
  hbm_series.start();

  Tick next_arrival = Tick::zero();
  for (int request = 0; request < 300; ++request) {
    next_arrival += Tick::ps(static_cast<std::int64_t>(1 + arrivals.uniform_below(3'000'000)));
    sim.schedule_at(next_arrival, [&, request] {
      const std::uint64_t bytes = 4096 + sizes.uniform_below(8u << 20);
      if (!hbm.try_allocate(bytes)) {
        refused.add();
        return;
      }
      const Tick arrived = sim.now();
      const auto& path = paths[static_cast<std::size_t>(request) % paths.size()];
      net.start_flow(path, bytes, Tick::ns(1500), [&, bytes, arrived] {
        stream.submit(Tick::ns(static_cast<std::int64_t>(bytes / 4096)), [&, bytes, arrived] {
          hbm.free(bytes);
          latency.record(sim.now() - arrived);
        });
      });
    });
  }
  sim.run();

  StatsRegistry registry;
  registry.add("hbm.usage", hbm.usage());
  registry.add("hbm.series", hbm_series);
  registry.add("request.latency", latency);
  registry.add("request.refused", refused);
  registry.add("stream.jobs", stream.jobs_completed());
  registry.add("stream.queue", stream.queue_length_gauge());
  for (const LinkId link : {h2d, d2h, ddr}) {
    registry.add_value(net.link_name(link) + ".bytes",
                       [&net, link] { return net.bytes_carried(link); });
    registry.add_value(net.link_name(link) + ".busy_ps", [&net, link] {
      return static_cast<double>(net.busy_time(link).picoseconds());
    });
  }
  registry.add_value("sim.events", [&] { return static_cast<double>(sim.events_executed()); });
  registry.add_value("sim.end_ps", [&] { return static_cast<double>(sim.now().picoseconds()); });
  return registry.to_json();
}

}  // namespace

TEST_CASE("the same seed gives an identical JSON dump", "[sim][determinism]") {
  const std::string first = run_scenario(42);
  CHECK(first == run_scenario(42));
  CHECK(first != run_scenario(43));
  CHECK(first.find("\"request.latency\":{\"type\":\"distribution\",\"count\":") !=
        std::string::npos);
}

TEST_CASE("simulators on two threads run independently and match sequential runs",
          "[sim][determinism]") {
  const std::string expected_a = run_scenario(1);
  const std::string expected_b = run_scenario(2);
  std::string got_a;
  std::string got_b;
  {
    std::jthread thread_a([&] { got_a = run_scenario(1); });
    std::jthread thread_b([&] { got_b = run_scenario(2); });
  }
  CHECK(got_a == expected_a);
  CHECK(got_b == expected_b);
  CHECK(got_a != got_b);
}
