#include "sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "sim/simulator.hpp"

namespace kvtier::sim {
namespace {

bool is_factor(double factor) {
  return factor > 0.0 && factor <= 1.0;
}

}  // namespace

FlowNetwork::FlowNetwork(Simulator& simulator)
    : simulator_(simulator), progress_time_(simulator.now()) {}

FlowNetwork::~FlowNetwork() {
  for (const Flow& flow : flows_) {
    if (flow.state != FlowState::kFree) {
      simulator_.cancel(flow.event);
    }
  }
}

LinkId FlowNetwork::add_link(std::string name, double capacity_bytes_per_second) {
  if (!(capacity_bytes_per_second > 0.0) || std::isinf(capacity_bytes_per_second)) {
    throw std::invalid_argument("sim::FlowNetwork: link '" + name +
                                "' needs a finite capacity > 0 bytes/s");
  }
  links_.push_back(Link{std::move(name), capacity_bytes_per_second, 0, {}, {}, 0.0});
  return LinkId{static_cast<std::uint32_t>(links_.size() - 1)};
}

void FlowNetwork::couple(LinkId a, LinkId b, double factor_a_when_b_busy,
                         double factor_b_when_a_busy) {
  checked(a);
  checked(b);
  if (a == b) {
    throw std::invalid_argument("sim::FlowNetwork: a link cannot be coupled to itself");
  }
  if (!is_factor(factor_a_when_b_busy) || !is_factor(factor_b_when_a_busy)) {
    throw std::invalid_argument("sim::FlowNetwork: coupling factors must be in (0, 1]");
  }
  advance_progress();
  couplings_.push_back(Coupling{a.index, b.index, factor_a_when_b_busy, factor_b_when_a_busy});
  recompute_rates();
}

FlowHandle FlowNetwork::start_flow(const std::vector<LinkId>& path, std::uint64_t bytes,
                                   Tick setup_latency, InlineCallback on_complete) {
  if (path.empty()) {
    throw std::invalid_argument("sim::FlowNetwork: a flow needs at least one link");
  }
  for (std::size_t i = 0; i < path.size(); ++i) {
    checked(path[i]);
    if (std::find(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(i), path[i]) !=
        path.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw std::invalid_argument("sim::FlowNetwork: a flow's path crosses link '" +
                                  links_[path[i].index].name + "' twice");
    }
  }
  if (setup_latency < Tick::zero()) {
    throw std::invalid_argument("sim::FlowNetwork: setup latency must be >= 0");
  }
  const Tick setup_end = simulator_.now() + setup_latency;  // throws before any state changes
  const std::uint32_t index = acquire_flow();
  Flow& flow = flows_[index];
  flow.path.clear();
  for (const LinkId link : path) {
    flow.path.push_back(link.index);
  }
  flow.bytes = bytes;
  flow.remaining = static_cast<double>(bytes);
  flow.rate = 0.0;
  flow.on_complete = std::move(on_complete);
  flow.state = FlowState::kSetup;
  ++flows_in_progress_;
  const FlowHandle handle(index, flow.generation);
  if (setup_latency == Tick::zero()) {
    begin_transfer(index);
  } else {
    flow.event = simulator_.schedule_at(setup_end, [this, index] { begin_transfer(index); });
  }
  return handle;
}

bool FlowNetwork::cancel_flow(FlowHandle handle) {
  if (find(handle) == nullptr) {
    return false;
  }
  const std::uint32_t index = handle.index_;
  Flow& flow = flows_[index];
  simulator_.cancel(flow.event);
  if (flow.state == FlowState::kTransferring) {
    advance_progress();
    std::erase(transferring_, index);
    stop_transfer(index, static_cast<double>(flow.bytes) - flow.remaining);
    release_flow(index);
    recompute_rates();
  } else {
    release_flow(index);
  }
  return true;
}

bool FlowNetwork::in_progress(FlowHandle handle) const noexcept {
  return find(handle) != nullptr;
}

double FlowNetwork::rate(FlowHandle handle) const noexcept {
  const Flow* flow = find(handle);
  return flow != nullptr && flow->state == FlowState::kTransferring ? flow->rate : 0.0;
}

double FlowNetwork::effective_capacity(LinkId link) const {
  checked(link);
  return coupled_capacity(link.index);
}

double FlowNetwork::bytes_carried(LinkId link) const {
  double bytes = checked(link).bytes_settled;
  const double elapsed_ps = static_cast<double>((simulator_.now() - progress_time_).picoseconds());
  for (const std::uint32_t index : transferring_) {
    const Flow& flow = flows_[index];
    if (std::find(flow.path.begin(), flow.path.end(), link.index) != flow.path.end()) {
      const double remaining = std::max(0.0, flow.remaining - flow.rate * elapsed_ps / 1e12);
      bytes += static_cast<double>(flow.bytes) - remaining;
    }
  }
  return bytes;
}

Tick FlowNetwork::busy_time(LinkId id) const {
  const Link& link = checked(id);
  return link.transferring > 0 ? link.busy_time_closed + (simulator_.now() - link.busy_since)
                               : link.busy_time_closed;
}

const FlowNetwork::Link& FlowNetwork::checked(LinkId link) const {
  if (link.index >= links_.size()) {
    throw std::invalid_argument("sim::FlowNetwork: no link #" + std::to_string(link.index));
  }
  return links_[link.index];
}

const FlowNetwork::Flow* FlowNetwork::find(FlowHandle handle) const noexcept {
  if (handle.index_ >= flows_.size()) {
    return nullptr;
  }
  const Flow& flow = flows_[handle.index_];
  return flow.state != FlowState::kFree && flow.generation == handle.generation_ ? &flow : nullptr;
}

std::uint32_t FlowNetwork::acquire_flow() {
  if (free_flow_ == UINT32_MAX) {
    flows_.emplace_back();
    return static_cast<std::uint32_t>(flows_.size() - 1);
  }
  const std::uint32_t index = free_flow_;
  free_flow_ = flows_[index].next_free;
  return index;
}

void FlowNetwork::release_flow(std::uint32_t index) {
  Flow& flow = flows_[index];
  flow.state = FlowState::kFree;
  ++flow.generation;  // outstanding handles stop referring to it
  flow.on_complete.reset();
  flow.event = EventHandle();
  flow.next_free = free_flow_;
  free_flow_ = index;
  --flows_in_progress_;
}

}  // namespace kvtier::sim
