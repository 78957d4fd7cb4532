#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "sim/capacity_pool.hpp"
#include "sim/fifo_server.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/catch_tick.hpp"

using kvtier::sim::CapacityPool;
using kvtier::sim::FifoServer;
using kvtier::sim::Simulator;
using kvtier::sim::Tick;

TEST_CASE("a FIFO server runs jobs one at a time in arrival order", "[sim][fifo]") {
  Simulator sim;
  FifoServer stream(sim);
  std::string order;
  std::vector<Tick> finishes;
  auto job = [&](char name) {
    return [&, name] {
      order += name;
      finishes.push_back(sim.now());
    };
  };
  stream.submit(Tick::ns(3), job('a'));
  stream.submit(Tick::ns(1), job('b'));
  stream.submit(Tick::ns(2), job('c'));
  CHECK(stream.busy());
  CHECK(stream.queue_length() == 2);
  sim.run();
  CHECK(order == "abc");
  CHECK(finishes == std::vector<Tick>{Tick::ns(3), Tick::ns(4), Tick::ns(6)});
  CHECK(stream.busy_time() == Tick::ns(6));
  CHECK(stream.jobs_completed().value() == 3);
  CHECK(stream.waiting_times().max() == Tick::ns(4));  // c waited for a and b
  // Two jobs queued for 3 ns, then one for 1 ns, over 6 ns: (2·3 + 1·1) / 6.
  CHECK(stream.queue_length_gauge().time_average() == Approx(7.0 / 6.0));
  CHECK(stream.queue_length_gauge().max() == 2.0);
}

TEST_CASE("a FIFO server's busy time excludes idle gaps", "[sim][fifo]") {
  Simulator sim;
  FifoServer engine(sim);
  engine.submit(Tick::ns(2), [] {});
  sim.schedule_at(Tick::ns(10), [&] { engine.submit(Tick::ns(5), [] {}); });
  sim.run_until(Tick::ns(12));
  CHECK(engine.busy_time() == Tick::ns(4));  // 2 ns done, 2 ns of the job in service
  sim.run();
  CHECK(engine.busy_time() == Tick::ns(7));
  CHECK(sim.now() == Tick::ns(15));
  CHECK(engine.queue_length_gauge().max() == 0.0);  // a job meeting an idle server never queues
}

TEST_CASE("a job's callback sees the next job already in service", "[sim][fifo]") {
  Simulator sim;
  FifoServer server(sim);
  bool busy_in_callback = false;
  server.submit(Tick::ns(1), [&] { busy_in_callback = server.busy(); });
  server.submit(Tick::ns(1), [] {});
  sim.run();
  CHECK(busy_in_callback);
  CHECK_THROWS_AS(server.submit(-Tick::ns(1), [] {}), std::invalid_argument);
}

TEST_CASE("a capacity pool refuses what does not fit and tracks its high-water mark",
          "[sim][pool]") {
  Simulator sim;
  CapacityPool hbm(sim, 100);
  CHECK(hbm.try_allocate(60));
  CHECK_FALSE(hbm.try_allocate(50));
  CHECK(hbm.used() == 60);
  CHECK(hbm.refusals().value() == 1);
  CHECK(hbm.try_allocate(40));
  CHECK(hbm.available() == 0);
  CHECK_FALSE(hbm.try_allocate(1));
  hbm.free(70);
  CHECK(hbm.used() == 30);
  CHECK(hbm.high_water_mark() == 100);
  CHECK(hbm.refusals().value() == 2);
}

TEST_CASE("freeing more than is allocated is a logic error and changes nothing", "[sim][pool]") {
  Simulator sim;
  CapacityPool pool(sim, 100);
  REQUIRE(pool.try_allocate(10));
  CHECK_THROWS_AS(pool.free(11), std::logic_error);
  CHECK(pool.used() == 10);
  pool.free(10);
  CHECK(pool.used() == 0);
  CHECK_THROWS_AS(pool.free(1), std::logic_error);
}

TEST_CASE("a capacity pool's usage is averaged over simulated time", "[sim][pool]") {
  Simulator sim;
  CapacityPool pool(sim, 1000);
  sim.schedule_at(Tick::ns(2), [&] { REQUIRE(pool.try_allocate(400)); });
  sim.schedule_at(Tick::ns(6), [&] { pool.free(300); });
  sim.run_until(Tick::ns(10));
  // 0 for 2 ns, 400 for 4 ns, 100 for 4 ns: 2000 / 10.
  CHECK(pool.usage().time_average() == 200.0);
  CHECK(pool.usage().max() == 400.0);
}
