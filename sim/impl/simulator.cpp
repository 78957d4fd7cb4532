#include "sim/simulator.hpp"

#include <stdexcept>
#include <string>

namespace kvtier::sim {
namespace {

// Marks the simulator as running for one scope; a nested run from inside an event would
// re-enter the event loop with the outer event's slot still held, so it is refused.
class RunningScope {
 public:
  explicit RunningScope(bool& running) : running_(running) {
    if (running_) {
      throw std::logic_error("sim::Simulator: run/run_until/step called from inside an event");
    }
    running_ = true;
  }
  RunningScope(const RunningScope&) = delete;
  RunningScope& operator=(const RunningScope&) = delete;
  ~RunningScope() { running_ = false; }

 private:
  bool& running_;
};

}  // namespace

void Simulator::run() {
  const RunningScope scope(running_);
  while (queue_.foreground_size() > 0) {
    run_next();
  }
}

void Simulator::run_until(Tick limit) {
  if (limit < now_) {
    throw std::logic_error("sim::Simulator::run_until: limit " +
                           std::to_string(limit.picoseconds()) + " ps is before now (" +
                           std::to_string(now_.picoseconds()) + " ps)");
  }
  const RunningScope scope(running_);
  while (!queue_.empty() && queue_.next_time() <= limit) {
    run_next();
  }
  now_ = limit;
}

bool Simulator::step() {
  const RunningScope scope(running_);
  if (queue_.empty()) {
    return false;
  }
  run_next();
  return true;
}

void Simulator::throw_in_past(Tick when) const {
  throw std::logic_error("sim::Simulator: event scheduled at " +
                         std::to_string(when.picoseconds()) + " ps, before now (" +
                         std::to_string(now_.picoseconds()) + " ps)");
}

}  // namespace kvtier::sim
