#pragma once
// A quantity sampled at a fixed interval of simulated time (HBM in use, link utilisation).
//
// Sample k is taken at start + k·interval by a background event at kLastPriority, so it sees the
// state after every other event of that picosecond, and it does not keep Simulator::run() going:
// sampling stops being scheduled once the modelled work is done and run() returns.

#include <functional>
#include <vector>

#include "sim/event_queue.hpp"
#include "sim/tick.hpp"

namespace kvtier::sim {

class Simulator;

class TimeSeries {
 public:
  // `probe` returns the value to record; it is called only at sample times.
  TimeSeries(Simulator& simulator, Tick interval, std::function<double()> probe);
  TimeSeries(const TimeSeries&) = delete;
  TimeSeries& operator=(const TimeSeries&) = delete;
  ~TimeSeries();

  // Takes the first sample at now() and schedules the rest. Starting twice is a logic error.
  void start();
  // Stops sampling; samples taken so far stay.
  void stop();

  [[nodiscard]] Tick interval() const noexcept { return interval_; }
  [[nodiscard]] Tick start_time() const noexcept { return start_; }
  [[nodiscard]] const std::vector<double>& values() const noexcept { return values_; }

 private:
  void take_sample();

  Simulator& simulator_;
  Tick interval_;
  std::function<double()> probe_;
  Tick start_;
  std::vector<double> values_;
  EventHandle next_sample_;
  bool started_ = false;
};

}  // namespace kvtier::sim
