// The classic "hold model" benchmark of a discrete-event kernel: `timers` concurrent timers, each
// of which, when it fires, schedules itself again after a pseudo-random delay, until `events`
// events have run. The pending set stays at `timers` events, so the figure measures the cost of
// one pop + one push at that queue size, plus the callback dispatch.
//
// Usage: kvtier_bench_des_hold [timers=1000] [events=10000000] [seed=1] [callbacks=inline|heap]
// Prints one JSON line: events/s, wall time, and heap allocations made while the simulation ran
// (the kernel's goal is zero per event; this binary counts them by replacing operator new).
// `heap` pads each event's capture past sim::InlineCallback's inline buffer, forcing one
// allocation per event: it measures what the small-buffer callable saves.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "sim/random.hpp"
#include "sim/simulator.hpp"

namespace {

// Counts allocations so the benchmark can report them; relaxed atomics because nothing orders
// on them. Process-wide by nature (operator new is), and confined to this executable.
std::atomic<std::uint64_t> allocation_count{0};

}  // namespace

void* operator new(std::size_t size) {
  allocation_count.fetch_add(1, std::memory_order_relaxed);
  if (void* memory = std::malloc(size == 0 ? 1 : size)) {
    return memory;
  }
  throw std::bad_alloc();
}
void operator delete(void* memory) noexcept {
  std::free(memory);
}
void operator delete(void* memory, std::size_t /*size*/) noexcept {
  std::free(memory);
}

namespace {

using kvtier::sim::InlineCallback;
using kvtier::sim::RandomStream;
using kvtier::sim::Simulator;
using kvtier::sim::Tick;

// Mean delay 1 us: uniform over [1, 2'000'000] ps.
constexpr std::uint64_t kMaxDelayPs = 2'000'000;

class HoldModel {
 public:
  HoldModel(Simulator& simulator, std::uint64_t seed, std::uint64_t events, bool heap_callbacks)
      : simulator_(simulator), random_(seed), events_(events), heap_callbacks_(heap_callbacks) {}

  void start(std::uint64_t timers) {
    for (std::uint64_t i = 0; i < timers && scheduled_ < events_; ++i) {
      schedule_next();
    }
  }

 private:
  void schedule_next() {
    ++scheduled_;
    const auto delay = static_cast<std::int64_t>(1 + random_.uniform_below(kMaxDelayPs));
    if (heap_callbacks_) {
      const std::array<std::uint64_t, 6> padding{};
      auto on_fire = [this, padding] {
        static_cast<void>(padding);
        fire();
      };
      static_assert(!InlineCallback::stores_inline<decltype(on_fire)>());
      simulator_.schedule_after(Tick::ps(delay), std::move(on_fire));
    } else {
      simulator_.schedule_after(Tick::ps(delay), [this] { fire(); });
    }
  }

  void fire() {
    if (scheduled_ < events_) {
      schedule_next();
    }
  }

  Simulator& simulator_;
  RandomStream random_;
  std::uint64_t events_;
  bool heap_callbacks_;
  std::uint64_t scheduled_ = 0;
};

std::uint64_t parse_count(const char* text, const char* name) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') {
    std::cerr << "kvtier_bench_des_hold: " << name << " must be a whole number, got '" << text
              << "'\n";
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view callbacks = argc > 4 ? argv[4] : "inline";
  if (argc > 5 || (callbacks != "inline" && callbacks != "heap")) {
    std::cerr << "usage: kvtier_bench_des_hold [timers=1000] [events=10000000] [seed=1] "
                 "[callbacks=inline|heap]\n";
    return 2;
  }
  const std::uint64_t timers = argc > 1 ? parse_count(argv[1], "timers") : 1000;
  const std::uint64_t events = argc > 2 ? parse_count(argv[2], "events") : 10'000'000;
  const std::uint64_t seed = argc > 3 ? parse_count(argv[3], "seed") : 1;

  Simulator simulator;
  HoldModel model(simulator, seed, events, callbacks == "heap");
  model.start(timers);

  const std::uint64_t allocations_before = allocation_count.load(std::memory_order_relaxed);
  const auto started = std::chrono::steady_clock::now();
  simulator.run();
  const auto finished = std::chrono::steady_clock::now();
  const std::uint64_t allocations =
      allocation_count.load(std::memory_order_relaxed) - allocations_before;

  const double wall_s = std::chrono::duration<double>(finished - started).count();
  const auto executed = simulator.events_executed();
  std::printf(
      "{\"benchmark\":\"des_hold\",\"implementation\":\"kvtier\",\"callbacks\":\"%s\","
      "\"timers\":%llu,"
      "\"events\":%llu,\"seed\":%llu,\"wall_s\":%.6f,\"events_per_s\":%.0f,"
      "\"allocations_during_run\":%llu,\"final_time_ps\":%lld}\n",
      std::string(callbacks).c_str(), static_cast<unsigned long long>(timers),
      static_cast<unsigned long long>(executed), static_cast<unsigned long long>(seed), wall_s,
      static_cast<double>(executed) / wall_s, static_cast<unsigned long long>(allocations),
      static_cast<long long>(simulator.now().picoseconds()));
  return 0;
}
