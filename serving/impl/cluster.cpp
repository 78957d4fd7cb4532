#include "serving/cluster.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "configs/pools.hpp"
#include "serving/does_not_fit.hpp"
#include "serving/memory_plan.hpp"

namespace kvtier::serving {
namespace {

config::ClusterSpec single_engine() {
  config::ClusterSpec cluster;
  cluster.set_engines(1);
  cluster.set_routing(config::ROUND_ROBIN);
  return cluster;
}

// The loader's checks (configs/impl/consistency.cpp), which a run built in code is held to here.
void check_disaggregation(const config::ClusterSpec& cluster) {
  const config::DisaggregationSpec& split = cluster.disaggregation();
  if (split.prefill_engines() == 0 || split.prefill_engines() >= cluster.engines()) {
    throw ConfigError("a disaggregated cluster of " + std::to_string(cluster.engines()) +
                          " engine(s) needs 1 to " + std::to_string(cluster.engines() - 1) +
                          " prefill engines, not " + std::to_string(split.prefill_engines()),
                      "field cluster.disaggregation.prefill_engines");
  }
  if (split.decode_routing() != config::ROUND_ROBIN &&
      split.decode_routing() != config::LEAST_OUTSTANDING) {
    throw ConfigError("decode_routing must be ROUND_ROBIN or LEAST_OUTSTANDING",
                      "field cluster.disaggregation.decode_routing");
  }
  const config::LinkKind kind = split.kv_link().kind();
  if (kind != config::NVLINK && kind != config::NETWORK) {
    throw ConfigError("kv_link carries KV from GPU to GPU: NVLINK or NETWORK",
                      "field cluster.disaggregation.kv_link.kind");
  }
}

// Of an engine's lanes, the index of the one a transfer starting at `start` takes: of those free
// by then, the one free latest (the first on a tie), so that lanes free sooner stay free for
// others; a lane still carrying a transfer's layers (layered, with layer_wise_transfer) only
// when no other is free.
std::size_t lane_for(const std::vector<sim::Tick>& lanes, const std::vector<std::uint32_t>& layered,
                     sim::Tick start) {
  std::size_t chosen = lanes.size();
  const auto better = [&](std::size_t lane) {
    if (chosen == lanes.size()) {
      return true;
    }
    if ((layered[lane] == 0) != (layered[chosen] == 0)) {
      return layered[lane] == 0;
    }
    return lanes[lane] > lanes[chosen];
  };
  for (std::size_t lane = 0; lane < lanes.size(); ++lane) {
    if (lanes[lane] <= start && better(lane)) {
      chosen = lane;
    }
  }
  return chosen;
}

// With data-parallel dispatch, the lane of the GPU `engine` dispatched `request` to: one lane a
// GPU (KvHandoff's lanes with data-parallel attention).
std::optional<std::size_t> dispatched_lane(const ServingEngine& engine, std::uint32_t request,
                                           std::size_t lanes) {
  if (!engine.dispatches()) {
    return std::nullopt;
  }
  const std::size_t gpu = engine.dispatched_gpu(request);
  if (gpu >= lanes) {
    throw std::logic_error("request " + std::to_string(request) + " dispatched to GPU " +
                           std::to_string(gpu) + " of an engine with " + std::to_string(lanes) +
                           " transfer lanes");
  }
  return gpu;
}

// A prefill engine, built from the prefill pool's run; where that pool is split otherwise than
// the run, what refuses it says so.
std::unique_ptr<ServingEngine> build_prefill_engine(sim::Simulator& simulator,
                                                    const config::RunSpec& run,
                                                    const config::RunSpec& prefill_run,
                                                    const Workload& workload) {
  try {
    return std::make_unique<ServingEngine>(simulator, prefill_run, workload, nullptr,
                                           EngineRole::kPrefill);
  } catch (const DoesNotFit& error) {
    if (!config::pools_differ(run)) {
      throw;
    }
    throw DoesNotFit(error.memory(), describe_prefill_pool(prefill_run) + ": " + error.what());
  } catch (const ConfigError& error) {
    if (!config::pools_differ(run)) {
      throw;
    }
    throw prefill_pool_error(prefill_run, error);
  }
}

}  // namespace

Cluster::Cluster(sim::Simulator& simulator, const config::RunSpec& run, Workload workload,
                 const TierDemand* tiers)
    : simulator_(simulator),
      workload_(std::move(workload)),
      arrivals_(simulator, workload_, [this](std::uint32_t request) { route(request); }) {
  const config::ClusterSpec cluster = run.has_cluster() ? run.cluster() : single_engine();
  if (cluster.engines() == 0) {  // the loader requires at least one; a run built in code too
    throw ConfigError("a cluster needs at least one engine", "field cluster.engines");
  }
  if (cluster.has_disaggregation()) {
    check_disaggregation(cluster);
    prefill_engines_ = cluster.disaggregation().prefill_engines();
    layer_wise_ = cluster.disaggregation().layer_wise_transfer();
  }
  // The prefill engines are split as prefill_parallelism says (config/pools.hpp).
  const config::RunSpec prefill_run = config::prefill_pool_run(run);
  for (std::uint32_t e = 0; e < cluster.engines(); ++e) {
    const EngineRole role = prefill_engines_ == 0  ? EngineRole::kPrefillAndDecode
                            : e < prefill_engines_ ? EngineRole::kPrefill
                                                   : EngineRole::kDecode;
    if (role == EngineRole::kPrefill) {
      // A prefill engine holds a prompt's KV whole until it leaves: the decode engines tier it.
      engines_.push_back(build_prefill_engine(simulator, run, prefill_run, workload_));
    } else {
      engines_.push_back(std::make_unique<ServingEngine>(simulator, run, workload_, tiers, role));
    }
    views_.push_back(engines_.back().get());
  }
  const std::uint32_t block_tokens = engines_.front()->memory().block_tokens;
  router_ = make_router(cluster, workload_, block_tokens);
  routed_.assign(engines_.size(), 0);
  if (prefill_engines_ > 0) {
    config::ClusterSpec decode = cluster;
    decode.set_routing(cluster.disaggregation().decode_routing());
    decode.clear_kv_overlap_weight();
    decode_router_ = make_router(decode, workload_, block_tokens);
    handoff_ = std::make_unique<KvHandoff>(prefill_run, run, cluster.disaggregation().kv_link());
    transfers_.sending_lanes = handoff_->sending_lanes();
    transfers_.receiving_lanes = handoff_->receiving_lanes();
    sending_free_.assign(prefill_engines_,
                         std::vector<sim::Tick>(transfers_.sending_lanes, sim::Tick::zero()));
    receiving_free_.assign(engines_.size() - prefill_engines_,
                           std::vector<sim::Tick>(transfers_.receiving_lanes, sim::Tick::zero()));
    sending_layered_.assign(prefill_engines_,
                            std::vector<std::uint32_t>(transfers_.sending_lanes, 0));
    receiving_layered_.assign(engines_.size() - prefill_engines_,
                              std::vector<std::uint32_t>(transfers_.receiving_lanes, 0));
    handoffs_.resize(workload_.requests.size());
  }
}

void Cluster::start() {
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    EngineHooks hooks;
    hooks.completed = [this](std::uint32_t) { arrivals_.completed(); };
    if (engines_[e]->role() == EngineRole::kPrefill) {
      // Routed when its first token comes, or layer by layer when the iteration giving it starts.
      const auto route_from = [this, e](std::uint32_t request, sim::Tick arrival,
                                        sim::Tick first_token, std::uint64_t last_tokens) {
        Handoff handoff;
        handoff.prefill_engine = e;
        handoff.computing = simulator_.now();
        handoff.prefilled = first_token;
        handoff.last_tokens = last_tokens;
        route_decode(request, arrival, handoff);
      };
      hooks.prefilled = [this, route_from](std::uint32_t request, sim::Tick arrival) {
        if (!layer_wise_) {
          route_from(request, arrival, simulator_.now(), 0);
        }
      };
      if (layer_wise_) {
        hooks.prefill_ending = route_from;
      }
    } else if (engines_[e]->role() == EngineRole::kDecode) {
      hooks.kv_wanted = [this](std::uint32_t request) { transfer(request); };
    }
    engines_[e]->start_serving(std::move(hooks));
  }
  arrivals_.start();
}

void Cluster::route(std::uint32_t request) {
  const std::size_t pool = prefill_engines_ > 0 ? prefill_engines_ : views_.size();
  const std::size_t chosen = router_->route(request, std::span(views_).first(pool));
  ++routed_[chosen];
  engines_[chosen]->submit(request);
}

void Cluster::route_decode(std::uint32_t request, sim::Tick arrival, const Handoff& handoff) {
  const std::size_t chosen =
      prefill_engines_ +
      decode_router_->route(request, std::span(views_).subspan(prefill_engines_));
  ++routed_[chosen];
  handoffs_[request] = handoff;
  handoffs_[request].decode_engine = chosen;
  engines_[chosen]->submit_prefilled(request, arrival, handoff.prefilled);
}

void Cluster::transfer(std::uint32_t request) {
  Handoff& handoff = handoffs_[request];
  // Each decode GPU's share of the prompt's KV (or of what its policy keeps, send_kept_only), in
  // whole blocks, less the blocks the decode engine found in its own prefix cache (prefix
  // caching takes no tier policy, so never with send_kept_only); KvHandoff times the copies
  // that bring it.
  const ServingEngine& decode = *engines_[handoff.decode_engine];
  const MemoryPlan& memory = decode.memory();
  const double cached =
      static_cast<double>(decode.held_cached_blocks(request)) * memory.block_bytes();
  handoff.bytes = decode.received_kv_bytes(request) - cached;
  handoff.wanted = simulator_.now();
  transfers_.cached_bytes += cached;
  if (handoff.bytes <= 0.0) {
    // Every block was cached there: nothing crosses the link (layer by layer, once the prefill
    // has ended: its end was scheduled first).
    simulator_.schedule_at(std::max(handoff.wanted, handoff.prefilled),
                           [this, request] { hand_over(request); });
    return;
  }
  send(request);
}

void Cluster::send(std::uint32_t request) {
  Handoff& handoff = handoffs_[request];
  const MemoryPlan& memory = engines_[handoff.decode_engine]->memory();
  // With data-parallel attention the prompt's KV is whole on one GPU of a side, which sends or
  // receives it over its own link: the transfer starts when a sending and a receiving lane are
  // both free (lane_for); dispatched, the lane of the GPU its engine dispatched it to.
  const std::size_t decode = handoff.decode_engine - prefill_engines_;
  std::vector<sim::Tick>& senders = sending_free_[handoff.prefill_engine];
  std::vector<sim::Tick>& receivers = receiving_free_[decode];
  const std::optional<std::size_t> sending_gpu =
      dispatched_lane(*engines_[handoff.prefill_engine], request, senders.size());
  const std::optional<std::size_t> receiving_gpu =
      dispatched_lane(*engines_[handoff.decode_engine], request, receivers.size());
  const sim::Tick now = simulator_.now();
  const sim::Tick start = std::max(
      {now, sending_gpu ? senders[*sending_gpu] : *std::min_element(senders.begin(), senders.end()),
       receiving_gpu ? receivers[*receiving_gpu]
                     : *std::min_element(receivers.begin(), receivers.end())});
  // Layer by layer, the last chunk's tokens are taken as all sent at full precision: with
  // send_kept_only the most of what is kept that can wait for that iteration. With hybrid
  // attention the windowed layers hold at most the window of them.
  const double last =
      std::min(handoff.bytes, memory.written_places(static_cast<double>(handoff.last_tokens)) *
                                  memory.kv_bytes_per_token);
  const double spread = memory.requests_spread;
  const KvHandoff::Timing timing = handoff_->layer_wise(
      (handoff.bytes - last) * spread, last * spread, start, handoff.computing, handoff.prefilled);
  if (!timing.layer_wise && start < handoff.prefilled) {
    // Whole after the prefill: its lanes are taken then, free for others until then.
    simulator_.schedule_at(handoff.prefilled, [this, request] { send(request); });
    return;
  }
  const std::size_t sender =
      sending_gpu.value_or(lane_for(senders, sending_layered_[handoff.prefill_engine], start));
  const std::size_t receiver =
      receiving_gpu.value_or(lane_for(receivers, receiving_layered_[decode], start));
  ++transfers_.count;
  transfers_.bytes += handoff.bytes;
  transfers_.busy += timing.earlier;
  if (!timing.layer_wise) {
    senders[sender] = timing.end;
    receivers[receiver] = timing.end;
    transferred(request, timing.end);
    return;
  }
  // The earlier bytes go at once; each layer then takes its turn on the lanes as it comes, so
  // that other transfers use them between its layers.
  ++transfers_.layer_wise;
  senders[sender] = start + timing.earlier;
  receivers[receiver] = start + timing.earlier;
  ++sending_layered_[handoff.prefill_engine][sender];
  ++receiving_layered_[decode][receiver];
  handoff.sending_lane = sender;
  handoff.receiving_lane = receiver;
  handoff.next_layer = 0;
  handoff.last_bytes = last * spread;
  simulator_.schedule_at(
      std::max(now, handoff_->layer_computed(0, handoff.computing, handoff.prefilled)),
      [this, request] { send_layer(request); });
}

void Cluster::send_layer(std::uint32_t request) {
  Handoff& handoff = handoffs_[request];
  sim::Tick& sender = sending_free_[handoff.prefill_engine][handoff.sending_lane];
  sim::Tick& receiver =
      receiving_free_[handoff.decode_engine - prefill_engines_][handoff.receiving_lane];
  const sim::Tick now = simulator_.now();
  const sim::Tick copy = handoff_->layer_copy(handoff.last_bytes, handoff.next_layer);
  const sim::Tick end = std::max({now, sender, receiver}) + copy;
  sender = end;
  receiver = end;
  transfers_.busy += copy;
  if (++handoff.next_layer < handoff_->model_layers()) {
    simulator_.schedule_at(
        std::max(now, handoff_->layer_computed(handoff.next_layer, handoff.computing,
                                               handoff.prefilled)),
        [this, request] { send_layer(request); });
  } else {
    --sending_layered_[handoff.prefill_engine][handoff.sending_lane];
    --receiving_layered_[handoff.decode_engine - prefill_engines_][handoff.receiving_lane];
    transferred(request, end);
  }
}

void Cluster::transferred(std::uint32_t request, sim::Tick end) {
  transfers_.transfer.record(end - handoffs_[request].wanted);
  simulator_.schedule_at(end, [this, request] { hand_over(request); });
}

void Cluster::hand_over(std::uint32_t request) {
  const Handoff& done = handoffs_[request];
  transfers_.handoff.record(simulator_.now() - done.prefilled);
  engines_[done.prefill_engine]->release(request);
  engines_[done.decode_engine]->kv_received(request);
}

}  // namespace kvtier::serving
