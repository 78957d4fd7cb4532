#pragma once
// Engines that serve one workload together behind a router, on one simulator (run.cluster;
// without it, one engine). The workload's arrivals (serving/arrivals.hpp) go to the router as
// they come; each request is routed once, when it arrives, and served to its end by that
// engine. A closed loop keeps its concurrency in flight across the whole cluster.
//
// Disaggregated (cluster.disaggregation): the first prefill_engines engines prefill, the others
// decode, each pool split over its GPUs as its run says (configs/pools.hpp). An arrival is
// routed to a prefill engine; when its prefill gives the first token, the decode router picks
// its decode engine, which admits it when it has room; then its prompt's KV crosses kv_link
// (serving/kv_handoff.hpp), and the prefill engine frees it. An engine's GPUs send one transfer
// at a time and receive one at a time, first come first served.
// With a tier policy the decode engines tier the KV they receive (serving/engine.hpp).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/arrivals.hpp"
#include "serving/engine.hpp"
#include "serving/kv_handoff.hpp"
#include "serving/router.hpp"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "sim/stats.hpp"

namespace kvtier::serving {

// What a disaggregated cluster's KV transfers did.
struct KvTransfers {
  // Prompts whose KV crossed the link (a prompt found all cached crosses none); with the pools
  // split differently each is several copies (KvHandoff).
  std::uint64_t count = 0;
  // Per decode GPU: with data-parallel attention the mean GPU's; with pipeline stages or pools
  // split differently a GPU of the heaviest stage's.
  double bytes = 0.0;
  // Per GPU: prompt KV the decode engines found in their prefix caches and did not pull.
  double cached_bytes = 0.0;
  sim::Tick busy;  // Σ over transfers of the time one took on the link
  // Transfers one prefill engine sends, and one decode engine receives, at once
  // (KvHandoff::sending_lanes, receiving_lanes).
  std::uint32_t sending_lanes = 1;
  std::uint32_t receiving_lanes = 1;
  // Per request handed off: from its first token to its KV in its decode engine's HBM (waiting
  // for admission there, for the link, and the copy), and of that the copy with its wait for
  // the link.
  sim::LatencyDistribution handoff;
  sim::LatencyDistribution transfer;
};

class Cluster {
 public:
  // Builds run.cluster().engines engines (one without run.cluster), each with the whole
  // workload's requests known and served those routed to it. `tiers` (not owned; null for the
  // full cache) must outlive the cluster; disaggregated, the decode engines take it and the
  // prefill engines hold the full cache. Throws what ServingEngine's constructor throws, and a
  // ConfigError for a disaggregation the loader would refuse.
  Cluster(sim::Simulator& simulator, const config::RunSpec& run, Workload workload,
          const TierDemand* tiers);
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Schedules the arrivals; run the simulator afterwards.
  void start();

  [[nodiscard]] const Workload& workload() const noexcept { return workload_; }
  [[nodiscard]] std::size_t size() const noexcept { return engines_.size(); }
  [[nodiscard]] const ServingEngine& engine(std::size_t index) const { return *engines_[index]; }
  // The engine whose figures a report gives for what the engines share (memory plan, cost
  // model, tier demand, a request's reservations): the first decode engine of a disaggregated
  // cluster, which serves requests to their last token and holds the policy; the first engine
  // otherwise.
  [[nodiscard]] const ServingEngine& representative() const { return *engines_[prefill_engines_]; }
  // The requests routed to each engine (to a decode engine: those it decoded).
  [[nodiscard]] const std::vector<std::uint64_t>& routed() const noexcept { return routed_; }
  // Disaggregated: the engines that prefill (the first ones), and the KV transfers. Without
  // disaggregation: 0 and none.
  [[nodiscard]] std::size_t prefill_engines() const noexcept { return prefill_engines_; }
  [[nodiscard]] const KvTransfers& kv_transfers() const noexcept { return transfers_; }

 private:
  struct Handoff {
    std::size_t prefill_engine = 0;
    std::size_t decode_engine = 0;
    sim::Tick prefilled;
  };

  void route(std::uint32_t request);
  void route_decode(std::size_t prefill_engine, std::uint32_t request, sim::Tick arrival);
  void transfer(std::uint32_t request);
  // The KV is in: the prefill engine lets its copy go, the decode engine may decode.
  void hand_over(std::uint32_t request);

  sim::Simulator& simulator_;
  Workload workload_;
  std::vector<std::unique_ptr<ServingEngine>> engines_;
  std::vector<const ServingEngine*> views_;
  std::unique_ptr<Router> router_;
  Arrivals arrivals_;
  std::vector<std::uint64_t> routed_;
  // Disaggregation (prefill_engines_ 0 without it): the decode engines' router, how long a
  // prompt's KV takes to cross, when each prefill engine's lanes are next free to send and each
  // decode engine's (decode engine e at e - prefill_engines_) to receive, and each handed-off
  // request's engines and first token.
  std::size_t prefill_engines_ = 0;
  std::unique_ptr<Router> decode_router_;
  std::unique_ptr<KvHandoff> handoff_;
  std::vector<std::vector<sim::Tick>> sending_free_;
  std::vector<std::vector<sim::Tick>> receiving_free_;
  std::vector<Handoff> handoffs_;
  KvTransfers transfers_;
};

}  // namespace kvtier::serving
