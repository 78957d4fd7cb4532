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
// at a time and receive one at a time, first come first served. Layer by layer
// (layer_wise_transfer), the decode engine is picked when the prefill's last iteration starts,
// its transfer may overlap that iteration, and the GPUs carry one copy at a time: a whole
// transfer or one layer's copies.
// With a tier policy the decode engines tier the KV they receive (serving/engine.hpp). With
// data-parallel dispatch each engine dispatches the requests it is given to its GPUs, and a
// transfer takes the links of the two GPUs holding the request on either side.

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
  // Σ over transfers of the time their copies took on the link (layer by layer, not the gaps
  // between layers).
  sim::Tick busy;
  // Transfers one prefill engine sends, and one decode engine receives, at once
  // (KvHandoff::sending_lanes, receiving_lanes).
  std::uint32_t sending_lanes = 1;
  std::uint32_t receiving_lanes = 1;
  // Transfers sent layer by layer while their prefill still ran (layer_wise_transfer).
  std::uint64_t layer_wise = 0;
  // Per request handed off: from its first token to its KV in its decode engine's HBM (waiting
  // for admission there, for the link, and the copy), and from its decode engine's admission to
  // the same (the copy with its wait for the link, and layer by layer for the prefill).
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
  // A request handed off: its prefill engine's iteration that completes its prefill runs from
  // `computing` to `prefilled` (its first token), its last chunk writing `last_tokens` tokens'
  // KV (0: sent after the prefill, whole). Its transfer: its bytes for a decode GPU, when its
  // decode engine wanted them, and layer by layer the lanes it takes turns on, the next layer to
  // send and the last chunk's bytes (as KvHandoff::layer_copy takes them, all layers').
  struct Handoff {
    std::size_t prefill_engine = 0;
    std::size_t decode_engine = 0;
    sim::Tick computing;
    sim::Tick prefilled;
    std::uint64_t last_tokens = 0;
    double bytes = 0.0;
    sim::Tick wanted;
    std::size_t sending_lane = 0;
    std::size_t receiving_lane = 0;
    std::uint32_t next_layer = 0;
    double last_bytes = 0.0;
  };

  void route(std::uint32_t request);
  // Picks the decode engine of a request whose prefill ends at `handoff.prefilled`, now or (layer
  // by layer) when the iteration ending it starts.
  void route_decode(std::uint32_t request, sim::Tick arrival, const Handoff& handoff);
  void transfer(std::uint32_t request);
  // Times the copies of what transfer() found to send, on the lanes free first (dispatched, its
  // GPUs' lanes).
  void send(std::uint32_t request);
  // Layer by layer: the next layer's copies, once its prefill has computed it, after what its
  // lanes carry by then.
  void send_layer(std::uint32_t request);
  void transferred(std::uint32_t request, sim::Tick end);
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
  bool layer_wise_ = false;  // cluster.disaggregation.layer_wise_transfer
  std::unique_ptr<Router> decode_router_;
  std::unique_ptr<KvHandoff> handoff_;
  std::vector<std::vector<sim::Tick>> sending_free_;
  std::vector<std::vector<sim::Tick>> receiving_free_;
  // Per lane, the transfers still sending their layers over it (layer_wise_transfer).
  std::vector<std::vector<std::uint32_t>> sending_layered_;
  std::vector<std::vector<std::uint32_t>> receiving_layered_;
  std::vector<Handoff> handoffs_;
  KvTransfers transfers_;
};

}  // namespace kvtier::serving
