#pragma once
// A server that runs one job at a time in arrival order: a CUDA stream, or a copy engine whose
// copies do not overlap. A job occupies the server for its service time, then its completion
// callback runs.
//
// Statistics: jobs completed, busy time (for utilisation), queue length (waiting jobs, not the
// one in service) as a time-weighted gauge, and each job's wait from submission to start.

#include <cstdint>
#include <deque>

#include "sim/event_queue.hpp"
#include "sim/inline_callback.hpp"
#include "sim/stats.hpp"
#include "sim/tick.hpp"

namespace kvtier::sim {

class Simulator;

class FifoServer {
 public:
  explicit FifoServer(Simulator& simulator);
  FifoServer(const FifoServer&) = delete;
  FifoServer& operator=(const FifoServer&) = delete;
  ~FifoServer();

  // Queues a job needing `service_time` (≥ 0) on the server; `on_done` runs when it completes.
  // The next queued job has already started when `on_done` runs, so busy() reflects it.
  void submit(Tick service_time, InlineCallback on_done);

  [[nodiscard]] bool busy() const noexcept { return in_service_; }
  [[nodiscard]] std::size_t queue_length() const noexcept { return waiting_.size(); }
  // Time spent serving jobs, up to now (a job in service counts up to now).
  [[nodiscard]] Tick busy_time() const;
  [[nodiscard]] const Counter& jobs_completed() const noexcept { return completed_; }
  [[nodiscard]] const TimeWeightedGauge& queue_length_gauge() const noexcept { return queued_; }
  [[nodiscard]] const LatencyDistribution& waiting_times() const noexcept { return waits_; }

 private:
  struct Job {
    Tick service_time;
    Tick submitted;
    InlineCallback on_done;
  };

  void begin(Job job);
  void finish_current();

  Simulator& simulator_;
  std::deque<Job> waiting_;
  InlineCallback current_on_done_;
  Tick current_started_;
  EventHandle completion_;
  bool in_service_ = false;

  Tick busy_time_completed_;  // busy time of jobs already finished
  Counter completed_;
  TimeWeightedGauge queued_;
  LatencyDistribution waits_;
};

}  // namespace kvtier::sim
