// FlowNetwork's time evolution: flows entering and leaving transfer, progress between rate
// changes, and the max-min recomputation that reschedules completions.

#include <algorithm>
#include <utility>
#include <vector>

#include "sim/flow_network.hpp"
#include "sim/simulator.hpp"

namespace kvtier::sim {

void FlowNetwork::begin_transfer(std::uint32_t index) {
  advance_progress();
  Flow& flow = flows_[index];
  flow.state = FlowState::kTransferring;
  flow.event = EventHandle();
  transferring_.push_back(index);
  for (const std::uint32_t link : flow.path) {
    if (links_[link].transferring++ == 0) {
      links_[link].busy_since = simulator_.now();
    }
  }
  recompute_rates();
}

// Runs at a completion time. Every flow due by now finishes together — flows that tie are
// settled in one step and see one recomputation — and the callbacks run last, in the order
// the flows started transferring, when the network already reflects their departure (so a
// callback may start the next transfer).
void FlowNetwork::complete_due_flows() {
  advance_progress();
  const Tick now = simulator_.now();
  std::vector<InlineCallback> callbacks;
  std::vector<std::uint32_t> still_transferring;
  still_transferring.reserve(transferring_.size());
  for (const std::uint32_t index : transferring_) {
    Flow& flow = flows_[index];
    if (flow.finish_time > now) {
      still_transferring.push_back(index);
      continue;
    }
    simulator_.cancel(flow.event);  // a tied flow's own completion event, if not this one
    stop_transfer(index, static_cast<double>(flow.bytes));
    callbacks.push_back(std::move(flow.on_complete));
    release_flow(index);
  }
  transferring_ = std::move(still_transferring);
  recompute_rates();
  for (InlineCallback& callback : callbacks) {
    if (callback) {
      callback();
    }
  }
}

void FlowNetwork::stop_transfer(std::uint32_t index, double bytes_moved) {
  const Tick now = simulator_.now();
  for (const std::uint32_t id : flows_[index].path) {
    Link& link = links_[id];
    link.bytes_settled += bytes_moved;
    if (--link.transferring == 0) {
      link.busy_time_closed += now - link.busy_since;
    }
  }
}

// Brings every transferring flow's `remaining` up to now at the rates in force since the last
// update (rates are constant between updates by construction).
void FlowNetwork::advance_progress() {
  const Tick now = simulator_.now();
  if (now == progress_time_) {
    return;
  }
  const auto elapsed_ps = static_cast<double>((now - progress_time_).picoseconds());
  for (const std::uint32_t index : transferring_) {
    Flow& flow = flows_[index];
    // Divide by 10^12 rather than multiply by 10^-12: the division is exact whenever the true
    // result is representable, which keeps round-number scenarios exact.
    flow.remaining = std::max(0.0, flow.remaining - flow.rate * elapsed_ps / 1e12);
  }
  progress_time_ = now;
}

double FlowNetwork::coupled_capacity(std::uint32_t link) const {
  double capacity = links_[link].capacity;
  for (const Coupling& coupling : couplings_) {
    if (coupling.a == link && links_[coupling.b].transferring > 0) {
      capacity *= coupling.factor_a_when_b_busy;
    }
    if (coupling.b == link && links_[coupling.a].transferring > 0) {
      capacity *= coupling.factor_b_when_a_busy;
    }
  }
  return capacity;
}

// Progress must be up to date (advance_progress) before rates change.
void FlowNetwork::recompute_rates() {
  const std::size_t count = transferring_.size();
  if (count == 0) {
    return;
  }
  capacity_scratch_.resize(links_.size());
  for (std::uint32_t link = 0; link < links_.size(); ++link) {
    capacity_scratch_[link] = coupled_capacity(link);
  }
  path_scratch_.clear();
  for (const std::uint32_t index : transferring_) {
    path_scratch_.emplace_back(flows_[index].path);
  }
  rate_scratch_.assign(count, 0.0);
  max_min_fair_rates(capacity_scratch_, path_scratch_, rate_scratch_, max_min_scratch_);

  const Tick now = simulator_.now();
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint32_t index = transferring_[k];
    Flow& flow = flows_[index];
    // An unchanged rate keeps its completion event: the time computed when the rate was set is
    // still right, and recomputing it from the updated remainder could only add rounding.
    if (rate_scratch_[k] == flow.rate && simulator_.is_pending(flow.event)) {
      continue;
    }
    flow.rate = rate_scratch_[k];
    simulator_.cancel(flow.event);
    flow.finish_time = now + transfer_duration(flow.remaining, flow.rate);
    flow.event = simulator_.schedule_at(flow.finish_time, [this] { complete_due_flows(); });
  }
}

}  // namespace kvtier::sim
