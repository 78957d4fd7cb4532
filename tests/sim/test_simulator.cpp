#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/random.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/catch_tick.hpp"

using kvtier::sim::EventHandle;
using kvtier::sim::kLastPriority;
using kvtier::sim::Priority;
using kvtier::sim::RandomStream;
using kvtier::sim::Simulator;
using kvtier::sim::Tick;

TEST_CASE("events run in time order and see their own time as now", "[sim][simulator]") {
  Simulator sim;
  std::vector<std::int64_t> seen;
  for (const std::int64_t t : {30, 10, 20}) {
    sim.schedule_at(Tick::ps(t), [&] { seen.push_back(sim.now().picoseconds()); });
  }
  sim.run();
  CHECK(seen == std::vector<std::int64_t>{10, 20, 30});
  CHECK(sim.now() == Tick::ps(30));
  CHECK(sim.events_executed() == 3);
}

TEST_CASE("ties on time run by priority, then in scheduling order", "[sim][simulator]") {
  Simulator sim;
  std::string order;
  sim.schedule_at(
      Tick::ns(1), [&] { order += 'c'; }, Priority{5});
  sim.schedule_at(
      Tick::ns(1), [&] { order += 'a'; }, Priority{-5});
  sim.schedule_at(
      Tick::ns(1), [&] { order += 'd'; }, Priority{5});
  sim.schedule_at(Tick::ns(1), [&] { order += 'b'; });
  sim.schedule_at(
      Tick::ns(1), [&] { order += 'z'; }, kLastPriority);
  sim.schedule_at(
      Tick::ps(999), [&] { order += '0'; }, kLastPriority);
  sim.run();
  CHECK(order == "0abcdz");
}

TEST_CASE("an event scheduled for now by a running event runs after it", "[sim][simulator]") {
  Simulator sim;
  std::string order;
  sim.schedule_at(Tick::ns(1), [&] {
    order += 'a';
    sim.schedule_after(Tick::zero(), [&] { order += 'c'; });
  });
  sim.schedule_at(Tick::ns(1), [&] { order += 'b'; });
  sim.run();
  CHECK(order == "abc");
}

TEST_CASE("a cancelled event does not run", "[sim][simulator]") {
  Simulator sim;
  bool ran = false;
  const EventHandle handle = sim.schedule_at(Tick::ns(5), [&] { ran = true; });
  CHECK(sim.is_pending(handle));
  CHECK(sim.cancel(handle));
  CHECK_FALSE(sim.is_pending(handle));
  sim.run();
  CHECK_FALSE(ran);
  CHECK(sim.events_executed() == 0);
}

TEST_CASE("cancelling twice, after running, or with an empty handle is harmless",
          "[sim][simulator]") {
  Simulator sim;
  int runs = 0;
  const EventHandle once = sim.schedule_at(Tick::ns(1), [&] { ++runs; });
  const EventHandle cancelled = sim.schedule_at(Tick::ns(2), [&] { ++runs; });
  CHECK(sim.cancel(cancelled));
  CHECK_FALSE(sim.cancel(cancelled));
  sim.run();
  CHECK(runs == 1);
  CHECK_FALSE(sim.cancel(once));
  CHECK_FALSE(sim.cancel(EventHandle()));
  // The freed slot is reused; the stale handles must not reach the new event.
  bool new_event_ran = false;
  sim.schedule_after(Tick::ns(1), [&] { new_event_ran = true; });
  CHECK_FALSE(sim.cancel(once));
  CHECK_FALSE(sim.cancel(cancelled));
  sim.run();
  CHECK(new_event_ran);
}

TEST_CASE("an event cancelling itself while running is a no-op", "[sim][simulator]") {
  Simulator sim;
  EventHandle self;
  bool cancel_result = true;
  self = sim.schedule_at(Tick::ns(1), [&] { cancel_result = sim.cancel(self); });
  sim.run();
  CHECK_FALSE(cancel_result);
  CHECK(sim.events_executed() == 1);
}

TEST_CASE("an event can cancel a later event due at the same time", "[sim][simulator]") {
  Simulator sim;
  bool second_ran = false;
  EventHandle second;
  sim.schedule_at(Tick::ns(1), [&] { sim.cancel(second); });
  second = sim.schedule_at(Tick::ns(1), [&] { second_ran = true; });
  sim.run();
  CHECK_FALSE(second_ran);
}

TEST_CASE("scheduling in the past is a logic error", "[sim][simulator]") {
  Simulator sim;
  sim.schedule_at(Tick::ns(10), [] {});
  sim.run();
  CHECK_THROWS_AS(sim.schedule_at(Tick::ns(9), [] {}), std::logic_error);
  CHECK_THROWS_AS(sim.schedule_after(-Tick::ps(1), [] {}), std::logic_error);
  CHECK_NOTHROW(sim.schedule_at(Tick::ns(10), [] {}));
  CHECK_THROWS_AS(sim.run_until(Tick::ns(5)), std::logic_error);
}

TEST_CASE("run_until runs events up to and including the limit, then sets the clock",
          "[sim][simulator]") {
  Simulator sim;
  std::vector<std::int64_t> seen;
  for (const std::int64_t t : {5, 10, 15}) {
    sim.schedule_at(Tick::ns(t), [&] { seen.push_back(sim.now().picoseconds() / 1000); });
  }
  sim.run_until(Tick::ns(10));
  CHECK(seen == std::vector<std::int64_t>{5, 10});
  CHECK(sim.now() == Tick::ns(10));
  CHECK(sim.events_pending() == 1);
  sim.run_until(Tick::ns(12));
  CHECK(sim.now() == Tick::ns(12));
  sim.run();
  CHECK(seen.back() == 15);
}

TEST_CASE("step runs exactly one event", "[sim][simulator]") {
  Simulator sim;
  int runs = 0;
  sim.schedule_at(Tick::ns(1), [&] { ++runs; });
  sim.schedule_at(Tick::ns(2), [&] { ++runs; });
  CHECK(sim.step());
  CHECK(runs == 1);
  CHECK(sim.now() == Tick::ns(1));
  CHECK(sim.step());
  CHECK_FALSE(sim.step());
  CHECK(runs == 2);
}

TEST_CASE("background events do not keep run() going", "[sim][simulator]") {
  Simulator sim;
  int ticks = 0;
  std::function<void()> tick = [&] {
    ++ticks;
    sim.schedule_background_at(sim.now() + Tick::ns(1), tick);
  };
  sim.schedule_background_at(Tick::zero(), tick);
  sim.schedule_at(Tick::ns(3), [] {});
  sim.run();
  CHECK(sim.now() == Tick::ns(3));
  // At 0, 1 and 2 ns; the one due at 3 ns was scheduled after the foreground event at 3 ns, which
  // was the last foreground event, so run() returned before it.
  CHECK(ticks == 3);
  CHECK(sim.events_pending() == 1);
}

TEST_CASE("running the simulator from inside an event is refused", "[sim][simulator]") {
  Simulator sim;
  bool refused = false;
  sim.schedule_at(Tick::ns(1), [&] {
    try {
      sim.run();
    } catch (const std::logic_error&) {
      refused = true;
    }
  });
  sim.run();
  CHECK(refused);
}

TEST_CASE("an exception thrown by an event leaves the simulator usable", "[sim][simulator]") {
  Simulator sim;
  bool later_ran = false;
  sim.schedule_at(Tick::ns(1), [] { throw std::runtime_error("model failure"); });
  sim.schedule_at(Tick::ns(2), [&] { later_ran = true; });
  CHECK_THROWS_AS(sim.run(), std::runtime_error);
  sim.run();
  CHECK(later_ran);
}

TEST_CASE("callables too large to store inline still run and are destroyed", "[sim][simulator]") {
  Simulator sim;
  std::array<std::int64_t, 16> payload{};
  payload[15] = 42;
  auto shared = std::make_shared<int>(0);
  std::int64_t seen = 0;
  sim.schedule_at(Tick::ns(1), [payload, shared, &seen] { seen = payload[15]; });
  const EventHandle dropped = sim.schedule_at(Tick::ns(2), [payload, shared] {});
  CHECK(shared.use_count() == 3);
  sim.cancel(dropped);
  sim.run();
  CHECK(seen == 42);
  CHECK(shared.use_count() == 1);
}

TEST_CASE("heavy cancellation keeps the order exact", "[sim][simulator]") {
  // Schedules many events, cancels most of them (forcing the queue to drop stale entries), and
  // checks the survivors run in (time, sequence) order.
  Simulator sim;
  RandomStream random(7);
  std::vector<std::pair<std::int64_t, int>> expected;
  std::vector<std::pair<std::int64_t, int>> seen;
  for (int i = 0; i < 20'000; ++i) {
    const auto t = static_cast<std::int64_t>(random.uniform_below(1000));
    const EventHandle handle = sim.schedule_at(
        Tick::ps(t), [&seen, &sim, i] { seen.emplace_back(sim.now().picoseconds(), i); });
    if (i % 10 != 0) {
      sim.cancel(handle);
    } else {
      expected.emplace_back(t, i);
    }
  }
  std::stable_sort(expected.begin(), expected.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  sim.run();
  CHECK(seen == expected);
}
