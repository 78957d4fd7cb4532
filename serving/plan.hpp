#pragma once
// Capacity planning (`kvtier plan`): for a policy, the largest batch one engine can hold while
// meeting latency SLOs, what binds it, and how many engines, GPUs and nodes a target
// throughput needs.
//
// The batch is searched by bisection over closed-loop runs of the run's request shape with B
// requests in flight (num_requests = rounds × B, so that later rounds arrive staggered). A
// batch is feasible when all B requests run at once (HBM and host memory admit them) and every
// SLO holds. Feasibility is assumed monotone in B, which holds for the modelled engine (more
// requests never shorten an iteration or free memory).

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
  std::uint32_t rounds = 3;  // 1 .. kMaxRounds
  std::optional<double> target_output_tokens_per_s;
};

// More rounds than this only lengthen every evaluation: the staggered arrivals settle in a few.
inline constexpr std::uint32_t kMaxRounds = 1000;

struct PlanResult {
  std::string policy;           // canonical
  std::uint32_t max_batch = 0;  // 0: not even one request meets the SLOs
  std::string binding;          // what stops the next batch size: HBM, DDR, an SLO, or the cap
  std::vector<Metric> metrics;  // of the run at max_batch (empty when it is 0)
  double output_tokens_per_s_per_engine = 0.0;
  double output_tokens_per_s_per_gpu = 0.0;
  double output_tokens_per_s_per_node = 0.0;
  std::uint32_t evaluations = 0;  // simulations run
  // With a target throughput.
  std::uint64_t engines = 0;
  std::uint64_t gpus = 0;
  std::uint64_t nodes = 0;
};

// Plans run.policy() (the run's `compare` is ignored). ConfigError when the run's workload is
// not a closed loop.
[[nodiscard]] PlanResult plan_capacity(const config::RunSpec& run, const PlanOptions& options,
                                       DemandMemo* memo = nullptr);

}  // namespace kvtier::serving
