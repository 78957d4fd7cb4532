#include "sim/time_series.hpp"

#include <stdexcept>
#include <utility>

#include "sim/simulator.hpp"

namespace kvtier::sim {

TimeSeries::TimeSeries(Simulator& simulator, Tick interval, std::function<double()> probe)
    : simulator_(simulator), interval_(interval), probe_(std::move(probe)) {
  if (interval_ <= Tick::zero()) {
    throw std::invalid_argument("sim::TimeSeries: the sampling interval must be > 0");
  }
  if (!probe_) {
    throw std::invalid_argument("sim::TimeSeries: no probe to sample");
  }
}

TimeSeries::~TimeSeries() {
  stop();
}

void TimeSeries::start() {
  if (started_) {
    throw std::logic_error("sim::TimeSeries: started twice");
  }
  started_ = true;
  start_ = simulator_.now();
  // The first sample, too, goes through the queue at kLastPriority, so a series started by an
  // event sees the state after the rest of that picosecond.
  next_sample_ = simulator_.schedule_background_at(
      start_, [this] { take_sample(); }, kLastPriority);
}

void TimeSeries::stop() {
  simulator_.cancel(next_sample_);
}

void TimeSeries::take_sample() {
  values_.push_back(probe_());
  // Sample times are computed from the start, not by adding the interval repeatedly, so they
  // are exactly start + k·interval however long the run.
  const Tick next = start_ + interval_ * static_cast<std::int64_t>(values_.size());
  next_sample_ = simulator_.schedule_background_at(
      next, [this] { take_sample(); }, kLastPriority);
}

}  // namespace kvtier::sim
