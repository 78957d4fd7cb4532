#pragma once
// Links with capacities (bytes/s) shared by concurrent transfers ("flows"), max-min fairly.
//
// A flow moves N bytes over a path of links. It first pays a per-transfer setup latency (DMA
// setup, driver overhead) during which it moves nothing and takes no bandwidth; then it
// transfers at the max-min fair rate of the active flows (sim/max_min_fair.hpp). Whenever a flow
// starts transferring, finishes or is cancelled, every rate is recomputed and the completion
// events of flows whose rate changed are rescheduled, so each flow's completion time is exact
// for the piecewise-constant rates it saw (rounded up to the picosecond; sim/tick.hpp).
//
// Duplex interference: couple(a, b, fa, fb) multiplies link a's capacity by fa while link b
// carries at least one transferring flow, and b's by fb while a does (PCIe read and write
// directions slow each other). Several couplings on one link multiply.
//
// Determinism: flows are kept in the order they started transferring and links in the order
// they were added; no hashing, so a run's results depend only on its inputs.

#include <cstdint>
#include <string>
#include <vector>

#include "sim/event_queue.hpp"
#include "sim/inline_callback.hpp"
#include "sim/max_min_fair.hpp"
#include "sim/tick.hpp"

namespace kvtier::sim {

class Simulator;

struct LinkId {
  std::uint32_t index = 0;
  friend bool operator==(LinkId, LinkId) = default;
};

// Refers to one flow; stays safe to use after the flow finished or was cancelled.
class FlowHandle {
 public:
  FlowHandle() noexcept = default;  // refers to no flow

 private:
  friend class FlowNetwork;
  FlowHandle(std::uint32_t index, std::uint32_t generation) noexcept
      : index_(index), generation_(generation) {}
  std::uint32_t index_ = UINT32_MAX;
  std::uint32_t generation_ = 0;
};

class FlowNetwork {
 public:
  explicit FlowNetwork(Simulator& simulator);
  FlowNetwork(const FlowNetwork&) = delete;
  FlowNetwork& operator=(const FlowNetwork&) = delete;
  ~FlowNetwork();  // cancels the events of flows still in progress; their callbacks never run

  LinkId add_link(std::string name, double capacity_bytes_per_second);
  // Factors in (0, 1]; a ≠ b. Takes effect at the next rate recomputation.
  void couple(LinkId a, LinkId b, double factor_a_when_b_busy, double factor_b_when_a_busy);

  // Starts moving `bytes` over `path` (distinct links, at least one) after `setup_latency`;
  // `on_complete` runs when the last byte has arrived. A zero-byte flow completes as soon as
  // its setup is over.
  FlowHandle start_flow(const std::vector<LinkId>& path, std::uint64_t bytes, Tick setup_latency,
                        InlineCallback on_complete);
  // Stops a flow in setup or in transfer; its callback never runs and the other flows speed up.
  // Returns false (and does nothing) if the flow already completed or was cancelled.
  bool cancel_flow(FlowHandle handle);

  [[nodiscard]] bool in_progress(FlowHandle handle) const noexcept;
  // Current rate in bytes/s; 0 during setup and once finished.
  [[nodiscard]] double rate(FlowHandle handle) const noexcept;
  [[nodiscard]] std::size_t flows_in_progress() const noexcept { return flows_in_progress_; }

  [[nodiscard]] std::size_t link_count() const noexcept { return links_.size(); }
  [[nodiscard]] const std::string& link_name(LinkId link) const { return checked(link).name; }
  [[nodiscard]] double capacity(LinkId link) const { return checked(link).capacity; }
  // Capacity after duplex coupling, as used for the current rates.
  [[nodiscard]] double effective_capacity(LinkId link) const;
  // Bytes that have crossed the link up to now, including the progress of flows in transfer.
  [[nodiscard]] double bytes_carried(LinkId link) const;
  // Time during which at least one flow was transferring over the link, up to now.
  [[nodiscard]] Tick busy_time(LinkId id) const;

 private:
  enum class FlowState : std::uint8_t { kFree, kSetup, kTransferring };

  struct Link {
    std::string name;
    double capacity;
    std::uint32_t transferring = 0;  // flows moving bytes over it now
    Tick busy_since;
    Tick busy_time_closed;       // busy periods that have ended
    double bytes_settled = 0.0;  // bytes of flows that completed or were cancelled
  };
  struct Coupling {
    std::uint32_t a, b;
    double factor_a_when_b_busy, factor_b_when_a_busy;
  };
  struct Flow {
    std::vector<std::uint32_t> path;
    std::uint64_t bytes = 0;
    double remaining = 0.0;  // bytes left as of progress_time_
    double rate = 0.0;
    Tick finish_time;
    EventHandle event;  // setup end, then completion
    InlineCallback on_complete;
    std::uint32_t generation = 0;
    std::uint32_t next_free = 0;
    FlowState state = FlowState::kFree;
  };

  const Link& checked(LinkId link) const;
  const Flow* find(FlowHandle handle) const noexcept;
  std::uint32_t acquire_flow();
  void release_flow(std::uint32_t index);

  void begin_transfer(std::uint32_t index);
  void complete_due_flows();
  void stop_transfer(std::uint32_t index, double bytes_moved);
  void advance_progress();
  void recompute_rates();
  double coupled_capacity(std::uint32_t link) const;

  Simulator& simulator_;
  std::vector<Link> links_;
  std::vector<Coupling> couplings_;
  std::vector<Flow> flows_;
  std::uint32_t free_flow_ = UINT32_MAX;
  std::size_t flows_in_progress_ = 0;
  std::vector<std::uint32_t> transferring_;  // in the order they started transferring
  Tick progress_time_;                       // when `remaining` was last brought up to date

  // Reused by recompute_rates() so it does not allocate.
  std::vector<double> capacity_scratch_;
  std::vector<std::span<const std::uint32_t>> path_scratch_;
  std::vector<double> rate_scratch_;
  MaxMinScratch max_min_scratch_;
};

}  // namespace kvtier::sim
