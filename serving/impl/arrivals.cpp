#include "serving/arrivals.hpp"

#include <algorithm>
#include <utility>

namespace kvtier::serving {

Arrivals::Arrivals(sim::Simulator& simulator, const Workload& workload,
                   std::function<void(std::uint32_t)> deliver)
    : simulator_(simulator), workload_(workload), deliver_(std::move(deliver)) {}

void Arrivals::start() {
  const auto count = static_cast<std::uint32_t>(workload_.requests.size());
  if (workload_.closed_loop_concurrency) {
    const std::uint32_t initial = std::min(*workload_.closed_loop_concurrency, count);
    for (std::uint32_t i = 0; i < initial; ++i) {
      simulator_.schedule_at(sim::Tick::zero(), [this] { deliver_(next_++); });
    }
  } else {
    schedule_next_open_loop_arrival();
  }
}

void Arrivals::completed() {
  if (workload_.closed_loop_concurrency && next_ < workload_.requests.size()) {
    deliver_(next_++);
  }
}

void Arrivals::schedule_next_open_loop_arrival() {
  if (next_ >= workload_.requests.size()) {
    return;
  }
  const sim::Tick when = std::max(simulator_.now(), *workload_.requests[next_].arrival);
  simulator_.schedule_at(when, [this] {
    deliver_(next_++);
    schedule_next_open_loop_arrival();
  });
}

}  // namespace kvtier::serving
