#pragma once
// Capacity planning (`kvtier plan`): for a policy, the largest load one engine serves while
// meeting latency SLOs, what binds it, and how many engines, GPUs and nodes a target needs.
//
// The run's workload says which load is searched:
// - closed_loop: the batch, by bisection over closed-loop runs of the run's request shape with
//   B requests in flight (num_requests = rounds × B, so that later rounds arrive staggered). A
//   batch is feasible when all B requests run at once (HBM and host memory admit them) and
//   every SLO holds. Feasibility is assumed monotone in B, which holds for the modelled engine
//   (more requests never shorten an iteration or free memory).
// - poisson or request_file: the arrival rate, by bisection over the run's own requests with
//   their arrival times scaled (Poisson's rate_per_s, a request file's time_scale), so every
//   probe serves the same requests, only closer together or further apart. A rate is feasible
//   when every SLO holds; one SLO must be a latency a queue shows in (ttft, queue_wait or
//   e2e_latency), since an engine past its capacity queues requests while tpot holds.
//   Feasibility is assumed monotone in the rate, as for the batch.
//
// With a cluster (run.cluster, rate plans only) the rate searched is the whole cluster's, its
// router included: per-engine figures are its 1/N share, and fleets come in whole clusters.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

namespace kvtier::serving {

struct Slo {
  std::string metric;  // a report metric in milliseconds: "tpot_p99_ms"
  double limit_ms = 0.0;
};

// "tpot_p99=50ms,ttft_p99=2s" (units ms, s or us; the metric may be any *_ms latency of the
// report, named without the _ms suffix). ConfigError for unknown metrics or bad values.
[[nodiscard]] std::vector<Slo> parse_slos(const std::string& text);

struct PlanOptions {
  std::vector<Slo> slos;
  std::uint32_t rounds = 3;  // batch plans: 1 .. kMaxRounds
  // Rate plans: the search stops when the smallest infeasible rate is within this share above
  // the largest feasible one (kMinRatePrecision .. kMaxRatePrecision).
  double rate_precision = 0.01;
  // Targets: the engines serve every target given (the larger count of engines).
  std::optional<double> target_output_tokens_per_s;
  std::optional<double> target_requests_per_s;
  [[nodiscard]] bool has_target() const {
    return target_output_tokens_per_s.has_value() || target_requests_per_s.has_value();
  }
};

// More rounds than this only lengthen every evaluation: the staggered arrivals settle in a few.
inline constexpr std::uint32_t kMaxRounds = 1000;
inline constexpr double kMinRatePrecision = 1e-6;
inline constexpr double kMaxRatePrecision = 1.0;

enum class PlanSearch {
  kBatch,  // closed_loop workloads
  kRate,   // poisson and request_file workloads
};

// One simulation of a search: the load it ran, whether it met every SLO, and the figures the
// SLOs name there.
struct PlanProbe {
  // Batch plans: the batch; rate plans: requests/s to one engine (its share of a cluster's).
  double load = 0.0;
  bool feasible = false;
  std::string binding;  // why the load is not served (empty when it is)
  // The SLOs' metrics in PlanOptions::slos' order, in ms; NaN where the run has none (the
  // policy's requests did not fit).
  std::vector<double> slo_values_ms;
  double output_tokens_per_s = 0.0;  // per engine (a cluster's share); NaN likewise
};

struct PlanResult {
  PlanSearch search = PlanSearch::kBatch;
  std::string policy;  // canonical
  // Batch plans: the largest batch (0: not even one request meets the SLOs). Rate plans: the
  // most requests in flight at once at the planned rate.
  std::uint32_t max_batch = 0;
  // Rate plans: the largest arrival rate found to meet the SLOs (0: not even the slowest rate
  // probed does, and `binding` says which). Batch plans: requests completed per second at
  // max_batch.
  double requests_per_s_per_engine = 0.0;
  // Rate plans: the smallest rate probed that missed an SLO (requests_per_s_per_engine ×
  // (1 + at most rate_precision)), and the slowest probed when none met them.
  double infeasible_requests_per_s = 0.0;
  // What stops the next load: HBM, DDR, an SLO (compute, PCIe, host recodes), the batch cap.
  std::string binding;
  std::vector<Metric> metrics;  // of the run at the planned load (empty when there is none)
  // What a reader must know to trust the answer (a rate plan over a workload too short to show
  // a slowly growing queue).
  std::vector<std::string> notes;
  double output_tokens_per_s_per_engine = 0.0;
  double output_tokens_per_s_per_gpu = 0.0;
  double output_tokens_per_s_per_node = 0.0;
  std::uint32_t evaluations = 0;  // simulations run
  std::vector<PlanProbe> probes;  // each simulation, in the order run
  // Engines the search ran together (run.cluster; 1 without), and for a cluster the largest
  // rate it serves as a whole (requests_per_s_per_engine × cluster_engines, searched as such).
  std::uint32_t cluster_engines = 1;
  double cluster_requests_per_s = 0.0;
  // With a target (engines: a multiple of cluster_engines).
  std::uint64_t engines = 0;
  std::uint64_t gpus = 0;
  std::uint64_t nodes = 0;
};

[[nodiscard]] bool serves_any(const PlanResult& result);

// How an engine splits over GPUs: a tensor-parallel group of `tensor_parallel` GPUs in each of
// `pipeline_stages` stages (`kvtier plan --layouts`). For a run with a cluster it may also set
// the cluster's engines: `engines` engines so split, every one prefilling and decoding
// (`4@2x1`: a cluster disaggregated or not becomes a unified one), or a disaggregated
// cluster's pools (`2@4x1+1@8x1`): `prefill_engines` engines split `prefill_tensor_parallel`
// x `prefill_pipeline_stages`, then `decode_engines` engines split as above. Without either
// (engines and prefill_engines 0) every engine of the run is split as above, but for what the
// run's cluster.disaggregation.prefill_parallelism sets.
struct Layout {
  std::uint32_t tensor_parallel = 1;
  std::uint32_t pipeline_stages = 1;
  std::uint32_t engines = 0;
  std::uint32_t prefill_engines = 0;
  std::uint32_t prefill_tensor_parallel = 1;
  std::uint32_t prefill_pipeline_stages = 1;
  std::uint32_t decode_engines = 0;
  // GPUs of an engine split as above (a decode engine of pools).
  [[nodiscard]] std::uint64_t gpus() const {
    return std::uint64_t{tensor_parallel} * pipeline_stages;
  }
  [[nodiscard]] bool pools() const { return prefill_engines > 0; }
  // Whether it says the cluster's engines (and so their GPUs), not only how each splits.
  [[nodiscard]] bool sets_engines() const { return engines > 0 || pools(); }
  [[nodiscard]] bool operator==(const Layout&) const = default;
};

// The most layouts one plan compares: each is a search of its own.
inline constexpr std::size_t kMaxLayouts = 64;

// "8x2,16x1" (TP x stages, each at least 1); for a run with a cluster, "4@2x1" (engines @ TP
// x stages); for a disaggregated run, "2@4x1+1@8x1" (prefill engines @ their TP x stages +
// decode engines @ theirs). Engines at least 1, at most cluster.engines' 4096 in all; at most
// kMaxLayouts layouts, none twice. Or "auto": candidate_layouts(run). ConfigError naming the
// item that is not one.
[[nodiscard]] std::vector<Layout> parse_layouts(const std::string& text,
                                                const config::RunSpec& run);
// For a run without a cluster, every layout of powers of two whose GPUs the run's hardware
// holds (hardware.num_nodes x gpus_per_node, num_nodes 1 when absent), by tensor-parallel
// degree and then stages. With a cluster, those GPUs are the cluster's: every such split with
// as many engines as the GPUs hold (one stage only for a disaggregated run), then for a
// disaggregated run every pair of pools of one stage each, power-of-two TP and at least one
// engine, that takes every one of the GPUs, by prefill TP, decode TP and prefill engines.
// ConfigError when there are more than kMaxLayouts, or none. Which of them the model and the
// hardware can take is for the config's checks to say.
[[nodiscard]] std::vector<Layout> candidate_layouts(const config::RunSpec& run);
// The run split as `layout` says (pipeline_parallel_degree left out for one stage; with
// engines, cluster.engines set and any disaggregation dropped; with pools, cluster.engines,
// the prefill engines and their prefill_parallelism's degrees set).
[[nodiscard]] config::RunSpec with_layout(const config::RunSpec& run, const Layout& layout);
// "TP 8 x PP 2", with engines "4 x TP 2 x PP 1", with pools
// "prefill 2 x TP 4 x PP 1 + decode 1 x TP 8 x PP 1".
[[nodiscard]] std::string describe_layout(const Layout& layout);
// "8x2", "4@2x1" or "2@4x1+1@8x1": as --layouts names it.
[[nodiscard]] std::string layout_key(const Layout& layout);

// The options' checks that do not depend on how the engine splits: targets, --rounds for a
// closed loop (and no cluster), --rate-precision and a queue-revealing SLO for an open loop.
// ConfigError naming the option. plan_capacity makes them first.
void check_plan_options(const config::RunSpec& run, const PlanOptions& options);

// Plans run.policy() (the run's `compare` is ignored), by the load its workload's kind says.
// ConfigError for options the search cannot use, a batch plan of a cluster, a rate plan without
// a queue-revealing SLO, a
// request file whose requests all arrive at one instant, and a workload too short to load one
// engine (every SLO met with all of its requests arriving at once).
[[nodiscard]] PlanResult plan_capacity(const config::RunSpec& run, const PlanOptions& options,
                                       DemandMemo* memo = nullptr);

}  // namespace kvtier::serving
