#include "serving/kv_handoff.hpp"

#include <algorithm>

#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/memory_plan.hpp"
#include "serving/tier_timing.hpp"

namespace kvtier::serving {
namespace {

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) {
  return (a + b - 1) / b;
}

// The most of `into` groups of KV heads that one of `from` groups meets, each side's groups
// splitting the heads into equal runs in order (group i of n: heads [i/n, (i+1)/n) of them).
// In units of 1 / (from · into) of the heads group i of `from` spans [i · into, (i + 1) · into)
// and group j of `into` [j · from, (j + 1) · from).
std::uint32_t most_groups_met(std::uint32_t from, std::uint32_t into) {
  std::uint32_t most = 1;
  for (std::uint32_t i = 0; i < from; ++i) {
    const std::uint64_t first = std::uint64_t{i} * into / from;
    const std::uint64_t end = (std::uint64_t{i + 1} * into + from - 1) / from;
    most = std::max(most, static_cast<std::uint32_t>(end - first));
  }
  return most;
}

// How one pool's engine holds a request's KV: its GPUs per stage that hold some of it, the
// distinct groups of KV heads they hold (each holder one group; the groups split the heads into
// equal runs in order), and each stage's layers from stage_first on.
struct Holding {
  std::uint32_t holders = 1;
  std::uint32_t groups = 1;
  std::vector<std::uint32_t> stage_first;
  std::vector<std::uint32_t> stage_layers;

  [[nodiscard]] std::uint32_t replicas() const { return holders / groups; }
  [[nodiscard]] std::uint32_t largest_stage() const {
    return *std::max_element(stage_layers.begin(), stage_layers.end());
  }
  // The stages of `other` whose layers meet stage `s`'s.
  [[nodiscard]] std::uint64_t overlapping(std::size_t s, const Holding& other) const {
    const std::uint32_t first = stage_first[s];
    const std::uint32_t end = first + stage_layers[s];
    std::uint64_t count = 0;
    for (std::size_t o = 0; o < other.stage_layers.size(); ++o) {
      const std::uint32_t other_end = other.stage_first[o] + other.stage_layers[o];
      count += std::max(first, other.stage_first[o]) < std::min(end, other_end) ? 1 : 0;
    }
    return count;
  }
};

Holding holding_of(const config::RunSpec& run) {
  Holding holding;
  const bool by_requests = attention_split(run) == hw::AttentionSplit::kRequests;
  holding.holders = by_requests ? 1 : run.tensor_parallel_degree();
  holding.groups = by_requests ? 1
                               : hw::kv_shards(run.model(), run.tensor_parallel_degree(),
                                               hw::AttentionSplit::kHeads);
  holding.stage_layers =
      hw::pipeline_stage_layers(run.model().num_hidden_layers(), pipeline_stages(run));
  std::uint32_t first = 0;
  for (const std::uint32_t layers : holding.stage_layers) {
    holding.stage_first.push_back(first);
    first += layers;
  }
  return holding;
}

}  // namespace

KvHandoff::KvHandoff(const config::RunSpec& prefill, const config::RunSpec& decode,
                     const config::LinkSpec& link)
    : sending_lanes_(requests_spread(prefill)),
      receiving_lanes_(requests_spread(decode)),
      model_layers_(prefill.model().num_hidden_layers()),
      link_bytes_per_s_(hw::asymptotic_gb_per_s(link, config::PEER) * 1e9),
      per_copy_(sim::from_microseconds(link.per_copy_overhead_us(), sim::Rounding::kUp)) {
  const Holding from = holding_of(prefill);
  const Holding to = holding_of(decode);
  // Shares are of what a decode GPU of the heaviest stage receives: its group's heads over that
  // stage's layers. Each a ratio of whole numbers, so that alike splits give exactly 1.
  const double received = static_cast<double>(from.groups) * to.largest_stage();
  // A prefill GPU sends each of its heads to every decode GPU holding it, shared with the
  // prefill GPUs holding the same heads: as many times as the decode side keeps copies of a
  // head for every copy the prefill side keeps (at least once).
  const std::uint32_t sends_per_head = std::max(1U, ceil_div(to.replicas(), from.replicas()));
  const std::uint32_t receivers_per_group = most_groups_met(from.groups, to.groups);
  // Layer by layer, each of a GPU's layers meets one stage of the other side.
  const std::uint64_t sends_per_layer = std::uint64_t{receivers_per_group} * sends_per_head;
  for (std::size_t s = 0; s < from.stage_layers.size(); ++s) {
    const double sent = static_cast<double>(to.groups) * sends_per_head * from.stage_layers[s];
    parts_.push_back({sent / received, sends_per_layer * from.overlapping(s, to),
                      from.stage_first[s], from.stage_layers[s], sends_per_layer});
  }
  const std::uint32_t senders_per_group = most_groups_met(to.groups, from.groups);
  for (std::size_t s = 0; s < to.stage_layers.size(); ++s) {
    const double taken = static_cast<double>(from.groups) * to.stage_layers[s];
    parts_.push_back({taken / received, std::uint64_t{senders_per_group} * to.overlapping(s, from),
                      to.stage_first[s], to.stage_layers[s], senders_per_group});
  }
}

sim::Tick KvHandoff::time(double received_bytes) const {
  sim::Tick longest = sim::Tick::zero();
  for (const GpuPart& part : parts_) {
    longest = std::max(
        longest, swap_time(received_bytes * part.share, part.copies, link_bytes_per_s_, per_copy_));
  }
  return longest;
}

sim::Tick KvHandoff::layer_computed(std::uint32_t layer, sim::Tick computing,
                                    sim::Tick computed) const {
  const auto layers = static_cast<std::int64_t>(model_layers_);
  return computing + ((computed - computing) * (layer + 1) + sim::Tick::ps(layers - 1)) / layers;
}

sim::Tick KvHandoff::layer_copy(double last_bytes, std::uint32_t layer) const {
  sim::Tick longest = sim::Tick::zero();
  for (const GpuPart& part : parts_) {
    if (layer >= part.first_layer && layer < part.first_layer + part.layers) {
      longest = std::max(longest, swap_time(last_bytes * part.share / part.layers,
                                            part.copies_per_layer, link_bytes_per_s_, per_copy_));
    }
  }
  return longest;
}

KvHandoff::Timing KvHandoff::layer_wise(double earlier_bytes, double last_bytes, sim::Tick start,
                                        sim::Tick computing, sim::Tick computed) const {
  const sim::Tick whole = time(earlier_bytes + last_bytes);
  const Timing after{std::max(start, computed) + whole, whole, false};
  if (start >= computed) {
    return after;
  }
  const sim::Tick earlier = earlier_bytes > 0.0 ? time(earlier_bytes) : sim::Tick::zero();
  sim::Tick sent = start + earlier;
  for (std::uint32_t layer = 0; layer < model_layers_; ++layer) {
    sent =
        std::max(sent, layer_computed(layer, computing, computed)) + layer_copy(last_bytes, layer);
  }
  return sent < after.end ? Timing{sent, earlier, true} : after;
}

}  // namespace kvtier::serving
