#include "serving/tier_demand.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/errors.hpp"
#include "replay/demand_cache.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/synthetic_attention.hpp"
#include "sim/random.hpp"
#include "traces/synth.hpp"

namespace kvtier::serving {
namespace {

constexpr std::uint64_t kTraceAssignment = 0x7472616365;  // "trace"
// Synthetic traces stand in for a model's attention; more layers than this add replay time
// but no new behaviour, and the layer projection spreads them over the target's layers.
constexpr std::uint32_t kSyntheticLayers = 32;

// The last context a request's attention reads: its final decode step attends the prompt and
// every generated token but the last.
std::uint64_t last_context(const RequestSpec& request) {
  return request.prompt_tokens + std::max<std::uint64_t>(request.output_tokens, 1) - 1;
}

bool differential(const std::string& canonical) {
  const config::PolicySpec spec = replay::parse_policy_string(canonical);
  for (const auto& param : spec.param()) {
    if (param.name() == "prefetch" && param.value_case() == config::PolicyParam::kText) {
      return param.text() == "differential";
    }
  }
  return false;
}

}  // namespace

TierDemand::~TierDemand() = default;

TierDemand::TierDemand(const config::RunSpec& run, const config::PolicySpec& policy,
                       const Workload& workload, DemandMemo* memo) {
  DemandMemo local;
  DemandMemo& shared = memo != nullptr ? *memo : local;
  const std::string policy_key = policy.SerializeAsString();
  const config::TieringSpec& tiering = run.tiering();
  const std::uint32_t target_layers = run.model().num_hidden_layers();
  std::uint64_t longest = 1;
  std::uint64_t shortest_prompt = UINT64_MAX;
  for (const RequestSpec& request : workload.requests) {
    longest = std::max(longest, last_context(request));
    shortest_prompt = std::min(shortest_prompt, request.prompt_tokens);
  }
  shortest_prompt = std::max<std::uint64_t>(std::min(shortest_prompt, longest - 1), 1);

  auto add_synthetic = [&](std::uint64_t prompt) {
    config::ModelSpec shape = run.model();
    shape.set_num_hidden_layers(std::min(target_layers, kSyntheticLayers));
    const std::uint64_t steps = std::max<std::uint64_t>(longest - prompt, 1);
    const config::SyntheticAttention params =
        traces::synthetic_preset(tiering.synthetic_pattern(), run.seed());
    replay::SyntheticAttention source(shape, static_cast<std::uint32_t>(prompt),
                                      static_cast<std::uint32_t>(steps), params);
    // The rows depend on the parameters, the lengths and the head counts of the shape.
    const std::string key = "synthetic|" + params.SerializeAsString() + "|" +
                            std::to_string(prompt) + "|" + std::to_string(steps) + "|" +
                            std::to_string(shape.num_hidden_layers()) + "|" +
                            std::to_string(shape.num_attention_heads()) + "|" +
                            std::to_string(shape.num_key_value_heads()) + "|" + policy_key;
    const auto replayed = shared.get(
        key,
        [&] {
          const replay::ReplayShape replay_shape{source.layers(), source.prompt_tokens(),
                                                 source.steps()};
          std::string canonical;
          const auto instance = replay::builtin_policies().create(policy, replay_shape, &canonical);
          return MemoDemand{replay::replay(source, *instance), canonical, prompt, false};
        },
        false);
    add_demand(source.name(), replayed, target_layers);
  };

  if (tiering.traces_size() == 0) {
    synthetic_only_ = true;
    add_synthetic(shortest_prompt);
  }
  for (const std::string& path : tiering.traces()) {
    // Replayed once per (trace content, policy) when the run names a cache folder, and once
    // per process in any case.
    std::string key = "trace|" + path;
    key += "|" + tiering.demand_cache_directory();
    key += "|" + policy_key;
    const auto replayed = shared.get(
        key,
        [&] {
          replay::CachedReplay cached =
              replay::cached_replay(path, policy, tiering.demand_cache_directory());
          return MemoDemand{std::move(cached.demand), cached.provenance.policy,
                            cached.provenance.prompt_tokens, cached.hit()};
        },
        true);
    cache_hits_ += replayed->cache_hit ? 1 : 0;
    add_demand(path, replayed, target_layers);
  }

  // Assignment, then the extension for requests longer than their trace.
  sim::RandomStream random(run.seed(), kTraceAssignment);
  const auto trace_count = static_cast<std::uint64_t>(traces_.size());
  std::uint64_t decode_steps = 0;
  std::uint64_t tail_steps = 0;
  std::uint64_t tail_prompt = UINT64_MAX;
  for (std::size_t i = 0; i < workload.requests.size(); ++i) {
    const RequestSpec& request = workload.requests[i];
    const auto trace = static_cast<std::uint32_t>(random.uniform_below(trace_count));
    assignment_.push_back({trace, request.prompt_tokens});
    const ReplayedTrace& replayed = traces_[trace];
    const std::uint64_t covered = replayed.prompt_tokens + replayed.steps;
    const std::uint64_t context = last_context(request);
    decode_steps += request.output_tokens > 0 ? request.output_tokens - 1 : 0;
    if (context > covered) {
      if (!tiering.extend_synthetic()) {
        throw ConfigError("request " + std::to_string(i) + " attends up to " +
                          std::to_string(context) + " tokens but its trace " + replayed.source +
                          " covers " + std::to_string(covered) +
                          " (prompt + steps); use a longer trace or set "
                          "tiering.extend_synthetic (--extend synthetic)");
      }
      tail_steps += context - covered;
      tail_prompt = std::min(tail_prompt, replayed.prompt_tokens);
    }
  }
  if (tail_steps > 0) {
    tail_trace_ = static_cast<std::uint32_t>(traces_.size());
    add_synthetic(tail_prompt);
  }
  tail_fraction_ =
      decode_steps > 0 ? static_cast<double>(tail_steps) / static_cast<double>(decode_steps) : 0.0;

  double kept = 0.0;
  double weight = 0.0;
  min_kept_ = 1.0;
  for (std::size_t i = 0; i < workload.requests.size(); ++i) {
    const RequestSpec& request = workload.requests[i];
    peaks_.push_back(request_peaks(assignment_[i], request));
    const ReplayedTrace& replayed = traces_[assignment_[i].trace];
    const double steps = static_cast<double>(std::max<std::uint64_t>(request.output_tokens, 1));
    kept += replayed.summary.mean_kept_mass * steps;
    weight += steps;
    min_kept_ = std::min(min_kept_, replayed.summary.min_kept_mass);
  }
  mean_kept_ = weight > 0 ? kept / weight : 1.0;
}

void TierDemand::add_demand(std::string source, std::shared_ptr<const MemoDemand> replayed_demand,
                            std::uint32_t target_layers) {
  canonical_ = replayed_demand->canonical_policy;
  differential_ = differential(canonical_);
  const replay::ReplayDemand& demand = replayed_demand->demand;
  const std::uint64_t prompt_tokens = replayed_demand->prompt_tokens;
  const std::uint64_t steps = demand.steps();
  const std::uint32_t layers = demand.layers();
  ReplayedTrace replayed{std::move(source),
                         prompt_tokens,
                         steps,
                         replay::project_layers(layers, target_layers),
                         std::move(replayed_demand),
                         demand.summary(),
                         {},
                         {},
                         {},
                         {}};
  compressed_bits_ = demand.compressed_bits();
  double hbm = 0.0;
  double host = 0.0;
  double compressed = 0.0;
  double staged = 0.0;
  for (std::uint64_t step = 0; step < steps; ++step) {
    double step_hbm = 0.0;
    double step_host = 0.0;
    double step_compressed = 0.0;
    for (const std::uint32_t layer : replayed.layer_map) {
      const replay::StepLayerRecord& record = demand.at(step, layer);
      step_hbm += record.tokens[0];
      step_host += record.tokens[1];
      step_compressed += record.tokens[2];
      staged = std::max(staged, static_cast<double>(record.tokens[1]) + record.tokens[2]);
    }
    hbm = std::max(hbm, step_hbm);
    host = std::max(host, step_host);
    compressed = std::max(compressed, step_compressed);
    replayed.max_hbm.push_back(hbm);
    replayed.max_host.push_back(host);
    replayed.max_compressed.push_back(compressed);
    replayed.max_staged.push_back(staged);
  }
  traces_.push_back(std::move(replayed));
}

RequestPeaks TierDemand::request_peaks(const Assignment& assignment,
                                       const RequestSpec& request) const {
  const std::uint64_t context = last_context(request);
  RequestPeaks peaks;
  auto take = [&](const ReplayedTrace& trace, std::uint64_t step, double scale) {
    peaks.hbm_token_layers = std::max(peaks.hbm_token_layers, trace.max_hbm[step] * scale);
    peaks.host_token_layers = std::max(peaks.host_token_layers, trace.max_host[step] * scale);
    peaks.compressed_token_layers =
        std::max(peaks.compressed_token_layers, trace.max_compressed[step] * scale);
    peaks.staged_tokens = std::max(peaks.staged_tokens, trace.max_staged[step] * scale);
  };
  const ReplayedTrace& trace = traces_[assignment.trace];
  if (context <= trace.prompt_tokens) {
    take(trace, 0, static_cast<double>(context) / static_cast<double>(trace.prompt_tokens + 1));
  } else if (context <= trace.prompt_tokens + trace.steps) {
    take(trace, context - trace.prompt_tokens - 1, 1.0);
  } else {
    take(trace, trace.steps - 1, 1.0);
    const ReplayedTrace& tail = traces_.at(tail_trace_);
    take(tail, std::min(context - tail.prompt_tokens - 1, tail.steps - 1), 1.0);
  }
  // The prompt sits whole in HBM while it is prefilled, before the policy sees it.
  const double prompt =
      static_cast<double>(request.prompt_tokens) * static_cast<double>(trace.layer_map.size());
  peaks.hbm_token_layers = std::max(peaks.hbm_token_layers, prompt);
  return peaks;
}

LayerDemand TierDemand::at(std::uint32_t request, std::uint64_t context,
                           std::uint32_t layer) const {
  const Assignment& assignment = assignment_.at(request);
  const ReplayedTrace* trace = &traces_[assignment.trace];
  double scale = 1.0;
  bool moves = true;
  std::uint64_t step = 0;
  if (context <= trace->prompt_tokens) {
    // Before the trace's first decode step: its counts shrunk to this context; nothing moves.
    scale = static_cast<double>(context) / static_cast<double>(trace->prompt_tokens + 1);
    moves = false;
  } else if (context <= trace->prompt_tokens + trace->steps) {
    step = context - trace->prompt_tokens - 1;
  } else {
    trace = &traces_.at(tail_trace_);
    step = std::min(context - trace->prompt_tokens - 1, trace->steps - 1);
  }
  const replay::StepLayerRecord& record = trace->demand().at(step, trace->layer_map[layer]);
  LayerDemand demand;
  demand.hbm = record.tokens[0] * scale;
  demand.host = record.tokens[1] * scale;
  demand.compressed = record.tokens[2] * scale;
  demand.evicted = record.tokens[3] * scale;
  if (moves) {
    demand.newly_host = record.newly_host;
    demand.demoted = record.demoted;
    demand.promoted = record.promoted;
    demand.compressed_moves = record.compressed;
  }
  return demand;
}

}  // namespace kvtier::serving
