// Analytic checks of the bandwidth-shared link model: every expected time below is worked out
// by hand from max-min fairness and the link capacities, in picoseconds.
#include <catch2/catch.hpp>

#include <functional>
#include <stdexcept>
#include <vector>

#include "sim/flow_network.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/catch_tick.hpp"

using kvtier::sim::FlowHandle;
using kvtier::sim::FlowNetwork;
using kvtier::sim::LinkId;
using kvtier::sim::Simulator;
using kvtier::sim::Tick;

namespace {

// Records when a flow's completion callback ran.
struct Finish {
  Tick at = Tick::ps(-1);
  auto recorder(const Simulator& sim) {
    return [this, &sim] { at = sim.now(); };
  }
};

}  // namespace

TEST_CASE("N bytes over an idle link finish at t0 + setup + ceil(N / bandwidth)", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("pcie", 3e9);
  Finish done;
  const Tick t0 = Tick::us(1);
  const Tick setup = Tick::ns(2500);
  sim.schedule_at(t0, [&] { net.start_flow({link}, 1'000'003, setup, done.recorder(sim)); });
  sim.run();
  // 1'000'003 bytes at 3 GB/s = 333'334'333.33 ps, rounded up.
  CHECK(done.at == t0 + setup + Tick::ps(333'334'334));
  CHECK(net.busy_time(link) == Tick::ps(333'334'334));
  CHECK(net.bytes_carried(link) == 1'000'003.0);
  CHECK(net.flows_in_progress() == 0);
}

TEST_CASE("two equal flows on one link each get half and finish together", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 10e9);
  Finish a, b;
  const FlowHandle fa = net.start_flow({link}, 1'000'000, Tick::zero(), a.recorder(sim));
  const FlowHandle fb = net.start_flow({link}, 1'000'000, Tick::zero(), b.recorder(sim));
  CHECK(net.rate(fa) == 5e9);
  CHECK(net.rate(fb) == 5e9);
  sim.run();
  // 1e6 bytes at 5 GB/s = 200 us.
  CHECK(a.at == Tick::us(200));
  CHECK(b.at == Tick::us(200));
  CHECK(net.bytes_carried(link) == 2e6);
}

TEST_CASE("a flow starting mid-way slows the first exactly as max-min predicts", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 4e9);
  Finish a, b;
  // A: 8e6 bytes alone at 4 GB/s would take 2 ms. B (2e6 bytes) joins at 1 ms, when A has 4e6
  // left; both run at 2 GB/s, so B ends 1 ms later (t = 2 ms) and A has 2e6 left, which it moves
  // alone at 4 GB/s in 0.5 ms (t = 2.5 ms).
  net.start_flow({link}, 8'000'000, Tick::zero(), a.recorder(sim));
  sim.schedule_at(Tick::ms(1),
                  [&] { net.start_flow({link}, 2'000'000, Tick::zero(), b.recorder(sim)); });
  sim.run();
  CHECK(b.at == Tick::ms(2));
  CHECK(a.at == Tick::us(2500));
  CHECK(net.busy_time(link) == Tick::us(2500));
}

TEST_CASE("a flow over two links runs at the slower link's rate and leaves the rest to others",
          "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId fast = net.add_link("fast", 10e9);
  const LinkId slow = net.add_link("slow", 2e9);
  Finish through, local;
  const FlowHandle f1 =
      net.start_flow({fast, slow}, 1'000'000, Tick::zero(), through.recorder(sim));
  const FlowHandle f2 = net.start_flow({fast}, 4'000'000, Tick::zero(), local.recorder(sim));
  // f1 is held to 2 GB/s by `slow`; f2 takes the 8 GB/s of `fast` that f1 cannot use.
  CHECK(net.rate(f1) == 2e9);
  CHECK(net.rate(f2) == 8e9);
  sim.run();
  CHECK(through.at == Tick::us(500));
  CHECK(local.at == Tick::us(500));
}

TEST_CASE("setup latency delays a flow without taking bandwidth", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  Finish delayed, quick;
  const FlowHandle slow_start = net.start_flow({link}, 1000, Tick::us(1), delayed.recorder(sim));
  net.start_flow({link}, 500, Tick::zero(), quick.recorder(sim));
  CHECK(net.rate(slow_start) == 0.0);
  CHECK(net.in_progress(slow_start));
  sim.run();
  CHECK(quick.at == Tick::ns(500));                // alone at 1 GB/s during the other's setup
  CHECK(delayed.at == Tick::us(1) + Tick::us(1));  // setup, then 1000 bytes alone
}

TEST_CASE("duplex coupling reduces capacity only while the other direction is busy",
          "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId h2d = net.add_link("h2d", 10e9);
  const LinkId d2h = net.add_link("d2h", 10e9);
  net.couple(h2d, d2h, 0.5, 0.8);
  Finish x, y;
  const FlowHandle fx = net.start_flow({h2d}, 10'000'000, Tick::zero(), x.recorder(sim));
  CHECK(net.rate(fx) == 10e9);  // d2h idle: no interference
  FlowHandle fy;
  double h2d_during = 0.0;
  double d2h_during = 0.0;
  // Y joins at 0.5 ms, when X has 5e6 left. While both run, h2d gives 5 GB/s and d2h 8 GB/s:
  // Y's 2e6 bytes take 0.25 ms (t = 0.75 ms); X moves 1.25e6 meanwhile and its last 3.75e6
  // bytes go at the full 10 GB/s in 0.375 ms (t = 1.125 ms).
  sim.schedule_at(Tick::us(500), [&] {
    fy = net.start_flow({d2h}, 2'000'000, Tick::zero(), y.recorder(sim));
    h2d_during = net.effective_capacity(h2d);
    d2h_during = net.effective_capacity(d2h);
  });
  sim.run();
  CHECK(h2d_during == 5e9);
  CHECK(d2h_during == 8e9);
  CHECK(y.at == Tick::us(750));
  CHECK(x.at == Tick::us(1125));
  CHECK(net.effective_capacity(h2d) == 10e9);
  CHECK(net.busy_time(d2h) == Tick::us(250));
  CHECK(net.bytes_carried(d2h) == 2e6);
}

TEST_CASE("a cancelled flow never completes and frees its share at once", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  Finish a, b;
  net.start_flow({link}, 1'000'000, Tick::zero(), a.recorder(sim));
  const FlowHandle fb = net.start_flow({link}, 1'000'000, Tick::zero(), b.recorder(sim));
  bool cancelled = false;
  bool cancelled_again = true;
  // At 1 ms each flow has moved 5e5 bytes; A's last 5e5 then go alone at 1 GB/s (0.5 ms).
  sim.schedule_at(Tick::ms(1), [&] {
    cancelled = net.cancel_flow(fb);
    cancelled_again = net.cancel_flow(fb);
  });
  sim.run();
  CHECK(cancelled);
  CHECK_FALSE(cancelled_again);
  CHECK(b.at == Tick::ps(-1));
  CHECK(a.at == Tick::us(1500));
  CHECK(net.bytes_carried(link) == 1.5e6);
  CHECK_FALSE(net.in_progress(fb));
}

TEST_CASE("a flow cancelled during setup never takes bandwidth", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  Finish a, b;
  net.start_flow({link}, 1000, Tick::zero(), a.recorder(sim));
  const FlowHandle fb = net.start_flow({link}, 1000, Tick::ns(100), b.recorder(sim));
  CHECK(net.cancel_flow(fb));
  sim.run();
  CHECK(a.at == Tick::us(1));
  CHECK(b.at == Tick::ps(-1));
  CHECK(net.bytes_carried(link) == 1000.0);
}

TEST_CASE("a completion callback can start the next transfer", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  std::vector<Tick> finishes;
  std::function<void()> next = [&] {
    finishes.push_back(sim.now());
    if (finishes.size() < 3) {
      net.start_flow({link}, 1000, Tick::ns(10), next);
    }
  };
  net.start_flow({link}, 1000, Tick::ns(10), next);
  sim.run();
  CHECK(finishes == std::vector<Tick>{Tick::ns(1010), Tick::ns(2020), Tick::ns(3030)});
  // Busy only while bytes moved, not during the setups.
  CHECK(net.busy_time(link) == Tick::ns(3000));
}

TEST_CASE("a zero-byte flow completes when its setup ends", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  Finish done;
  net.start_flow({link}, 0, Tick::ns(7), done.recorder(sim));
  sim.run();
  CHECK(done.at == Tick::ns(7));
}

TEST_CASE("flow network inputs are checked", "[sim][flow]") {
  Simulator sim;
  FlowNetwork net(sim);
  const LinkId link = net.add_link("link", 1e9);
  CHECK_THROWS_AS(net.add_link("dead", 0.0), std::invalid_argument);
  CHECK_THROWS_AS(net.start_flow({}, 1, Tick::zero(), [] {}), std::invalid_argument);
  CHECK_THROWS_AS(net.start_flow({link, link}, 1, Tick::zero(), [] {}), std::invalid_argument);
  CHECK_THROWS_AS(net.start_flow({LinkId{9}}, 1, Tick::zero(), [] {}), std::invalid_argument);
  CHECK_THROWS_AS(net.start_flow({link}, 1, -Tick::ns(1), [] {}), std::invalid_argument);
  CHECK_THROWS_AS(net.couple(link, link, 0.5, 0.5), std::invalid_argument);
  const LinkId other = net.add_link("other", 1e9);
  CHECK_THROWS_AS(net.couple(link, other, 1.5, 0.5), std::invalid_argument);
  CHECK(net.flows_in_progress() == 0);
}
