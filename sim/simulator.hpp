#pragma once
// The discrete-event simulator: a clock and the events pending on it.
//
// No global state: a Simulator is a plain object, and everything that schedules events is handed
// one explicitly. Several simulators run independently in one process, on different threads;
// one simulator is used from one thread at a time.
//
// Resources built on a simulator (FlowNetwork, FifoServer, TimeSeries, ...) hold a reference to
// it and schedule events that refer to themselves; declare them after the simulator so they are
// destroyed first.

#include <cstdint>
#include <utility>

#include "sim/event_queue.hpp"
#include "sim/tick.hpp"

namespace kvtier::sim {

class Simulator {
 public:
  Simulator() = default;
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  [[nodiscard]] Tick now() const noexcept { return now_; }

  // Schedules `action` (any `void()` callable) to run at `when`. Scheduling before now() is a
  // logic error (std::logic_error): simulated time never goes back.
  template <class F>
  EventHandle schedule_at(Tick when, F&& action, Priority priority = kDefaultPriority) {
    check_not_in_past(when);
    return queue_.push(when, priority, /*background=*/false, std::forward<F>(action));
  }
  template <class F>
  EventHandle schedule_after(Tick delay, F&& action, Priority priority = kDefaultPriority) {
    return schedule_at(now_ + delay, std::forward<F>(action), priority);
  }

  // A background event runs like any other but does not keep run() going: a periodic sampler
  // reschedules itself forever, and run() must still stop once the modelled work is done.
  template <class F>
  EventHandle schedule_background_at(Tick when, F&& action, Priority priority = kDefaultPriority) {
    check_not_in_past(when);
    return queue_.push(when, priority, /*background=*/true, std::forward<F>(action));
  }

  // Cancels a pending event: it will not run. Returns whether it was pending; cancelling an
  // event that already ran, is running or was cancelled does nothing.
  bool cancel(EventHandle handle) { return queue_.cancel(handle); }
  [[nodiscard]] bool is_pending(EventHandle handle) const noexcept {
    return queue_.is_pending(handle);
  }

  // Runs events in order until no foreground event is pending (background events still pending
  // then stay pending).
  void run();
  // Runs every event due at or before `limit`, then advances the clock to `limit`. A limit
  // before now() is a logic error.
  void run_until(Tick limit);
  // Runs the next event, background or not; returns false when nothing is pending.
  bool step();

  [[nodiscard]] std::uint64_t events_executed() const noexcept { return executed_; }
  [[nodiscard]] std::size_t events_pending() const noexcept { return queue_.size(); }

 private:
  void check_not_in_past(Tick when) const {
    if (when < now_) {
      throw_in_past(when);
    }
  }
  [[noreturn]] void throw_in_past(Tick when) const;

  // Runs the earliest pending event; the queue must not be empty.
  void run_next() {
    now_ = queue_.next_time();
    ++executed_;
    queue_.run_next();
  }

  EventQueue queue_;
  Tick now_ = Tick::zero();
  std::uint64_t executed_ = 0;
  bool running_ = false;  // guards against run() being called from inside an event
};

}  // namespace kvtier::sim
