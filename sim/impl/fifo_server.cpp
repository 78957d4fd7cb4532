#include "sim/fifo_server.hpp"

#include <stdexcept>
#include <utility>

#include "sim/simulator.hpp"

namespace kvtier::sim {

FifoServer::FifoServer(Simulator& simulator) : simulator_(simulator), queued_(simulator, 0.0) {}

// The pending completion event refers to this server; it must not run after the server is gone.
FifoServer::~FifoServer() {
  simulator_.cancel(completion_);
}

void FifoServer::submit(Tick service_time, InlineCallback on_done) {
  if (service_time < Tick::zero()) {
    throw std::invalid_argument("sim::FifoServer: a job's service time must be >= 0");
  }
  Job job{service_time, simulator_.now(), std::move(on_done)};
  if (in_service_) {
    waiting_.push_back(std::move(job));
    queued_.set(static_cast<double>(waiting_.size()));
  } else {
    // Straight into service: the job never counts as queued, not even for zero time.
    begin(std::move(job));
  }
}

Tick FifoServer::busy_time() const {
  return in_service_ ? busy_time_completed_ + (simulator_.now() - current_started_)
                     : busy_time_completed_;
}

void FifoServer::begin(Job job) {
  waits_.record(simulator_.now() - job.submitted);
  in_service_ = true;
  current_started_ = simulator_.now();
  current_on_done_ = std::move(job.on_done);
  completion_ = simulator_.schedule_after(job.service_time, [this] { finish_current(); });
}

void FifoServer::finish_current() {
  busy_time_completed_ += simulator_.now() - current_started_;
  completed_.add();
  in_service_ = false;
  InlineCallback on_done = std::move(current_on_done_);
  if (!waiting_.empty()) {
    Job next = std::move(waiting_.front());
    waiting_.pop_front();
    queued_.set(static_cast<double>(waiting_.size()));
    begin(std::move(next));
  }
  if (on_done) {
    on_done();
  }
}

}  // namespace kvtier::sim
