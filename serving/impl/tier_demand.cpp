#include "serving/tier_demand.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/errors.hpp"
#include "hwmodels/model_shape.hpp"
#include "replay/demand_cache.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/synthetic_attention.hpp"
#include "serving/memory_plan.hpp"
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
                       const Workload& workload, DemandMemo* memo)
    : stage_of_layer_(tiered_layer_stages(run)),
      largest_stage_layers_(most_tiered_layers_of_a_stage(stage_of_layer_)),
      block_tokens_(kv_block_tokens(run)) {
  const bool hybrid = hw::has_hybrid_attention(run.model());
  // Past a sliding window a serving engine drops the oldest KV rather than tiering it, and the
  // window caps what attention reads, so a trace step's placement no longer describes the cache.
  // With hybrid attention the policy places the global layers' tokens only, which attend the
  // whole context.
  if (run.model().has_sliding_window() && !hybrid) {
    for (std::size_t i = 0; i < workload.requests.size(); ++i) {
      const std::uint64_t context = last_context(workload.requests[i]);
      if (context > run.model().sliding_window()) {
        throw ConfigError(describe_request(workload, i) + " attends up to " +
                          std::to_string(context) + " tokens, past model.sliding_window (" +
                          std::to_string(run.model().sliding_window()) +
                          "): tier policies are modelled within a sliding window only; use the "
                          "full cache (policy full) or requests that fit the window");
      }
    }
  }
  DemandMemo local;
  DemandMemo& shared = memo != nullptr ? *memo : local;
  const std::string policy_key = policy.SerializeAsString();
  const config::TieringSpec& tiering = run.tiering();
  const auto target_layers = static_cast<std::uint32_t>(stage_of_layer_.size());
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
    if (hybrid) {
      // It stands in for the global layers' attention.
      shape.clear_sliding_window();
      shape.clear_sliding_window_pattern();
    }
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
        throw ConfigError(describe_request(workload, i) + " attends up to " +
                          std::to_string(context) + " tokens but its trace " + replayed.source +
                          " covers " + std::to_string(covered) +
                          " (prompt + steps); use a longer trace or set "
                          "tiering.extend_synthetic (--extend synthetic)");
      }
      // The decode steps whose context passes the trace: all of them when the prompt alone does.
      tail_steps += std::min(context - covered, request.output_tokens - 1);
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
  compressed_format_ = demand.compressed_format();
  attends_compressed_ = demand.attends_compressed();
  double hbm = 0.0;
  double host = 0.0;
  double compressed = 0.0;
  double staged = 0.0;
  // Placement k: the start's for k = 0, step k − 1's after it.
  for (std::uint64_t k = 0; k <= steps; ++k) {
    StageSums step_hbm(stage_of_layer_);
    StageSums step_host(stage_of_layer_);
    StageSums step_compressed(stage_of_layer_);
    for (std::uint32_t target = 0; target < replayed.layer_map.size(); ++target) {
      const std::uint32_t layer = replayed.layer_map[target];
      const replay::StepLayerRecord& record =
          k == 0 ? demand.start(layer) : demand.at(k - 1, layer);
      step_hbm.add(target, in_whole_blocks(record.tokens[0], block_tokens_));
      step_host.add(target, record.tokens[1]);
      step_compressed.add(target, record.tokens[2]);
      staged = std::max(staged, static_cast<double>(record.tokens[1]) +
                                    (attends_compressed_ ? record.tokens[2] : 0U));
    }
    hbm = std::max(hbm, step_hbm.busiest());
    host = std::max(host, step_host.busiest());
    compressed = std::max(compressed, step_compressed.busiest());
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
  // Up to step `step`: the placements held (the start's, and each step's after its moves) and
  // those staged (the start's, and each earlier step's).
  auto take = [&](const ReplayedTrace& trace, std::uint64_t step, double scale) {
    peaks.hbm_token_layers = std::max(peaks.hbm_token_layers, trace.max_hbm[step + 1] * scale);
    peaks.host_token_layers = std::max(peaks.host_token_layers, trace.max_host[step + 1] * scale);
    peaks.compressed_token_layers =
        std::max(peaks.compressed_token_layers, trace.max_compressed[step + 1] * scale);
    peaks.staged_tokens = std::max(peaks.staged_tokens, trace.max_staged[step] * scale);
  };
  const ReplayedTrace& trace = traces_[assignment.trace];
  if (context <= trace.prompt_tokens) {
    // The start placement's shares over at most `context` tokens (at() scales them likewise).
    const double scale = static_cast<double>(context) / static_cast<double>(trace.prompt_tokens);
    // T0 grows with the context: its most is what at() holds after the last step, each layer's
    // share over the context's earlier tokens and the step's own, in whole blocks of its own.
    const double earlier =
        static_cast<double>(context - 1) / static_cast<double>(trace.prompt_tokens);
    StageSums hbm(stage_of_layer_);
    for (std::uint32_t target = 0; target < trace.layer_map.size(); ++target) {
      hbm.add(target, in_whole_blocks(
                          trace.demand().start(trace.layer_map[target]).tokens[0] * earlier + 1.0,
                          block_tokens_));
    }
    peaks.hbm_token_layers = hbm.busiest();
    peaks.host_token_layers = trace.max_host[0] * scale;
    peaks.compressed_token_layers = trace.max_compressed[0] * scale;
    peaks.staged_tokens = trace.max_staged[0] * scale;
  } else if (context <= trace.prompt_tokens + trace.steps) {
    take(trace, context - trace.prompt_tokens - 1, 1.0);
  } else {
    take(trace, trace.steps - 1, 1.0);
    const ReplayedTrace& tail = traces_.at(tail_trace_);
    take(tail, std::min(context - tail.prompt_tokens - 1, tail.steps - 1), 1.0);
  }
  peaks.placed_hbm_token_layers = peaks.hbm_token_layers;
  // The prompt sits whole in HBM while it is prefilled, before the policy sees it.
  const double prompt = in_whole_blocks(static_cast<double>(request.prompt_tokens), block_tokens_) *
                        static_cast<double>(largest_stage_layers_);
  peaks.hbm_token_layers = std::max(peaks.hbm_token_layers, prompt);
  return peaks;
}

LayerDemand TierDemand::at(std::uint32_t request, std::uint64_t context, std::uint32_t layer,
                           bool first) const {
  const Assignment& assignment = assignment_.at(request);
  const ReplayedTrace* trace = &traces_[assignment.trace];
  LayerDemand demand;
  if (context <= trace->prompt_tokens) {
    // Before the trace's first step (a prompt shorter than the trace's): the start placement's
    // shares over the context − 1 earlier tokens. Nothing moves, so the step's own token stays
    // in HBM.
    const replay::StepLayerRecord& start = trace->demand().start(trace->layer_map[layer]);
    const double scale =
        static_cast<double>(context - 1) / static_cast<double>(trace->prompt_tokens);
    demand.hbm = start.tokens[0] * scale;
    demand.host = start.tokens[1] * scale;
    demand.compressed_held = start.tokens[2] * scale;
    demand.compressed = attends_compressed_ ? demand.compressed_held : 0.0;
    demand.evicted = start.tokens[3] * scale;
    demand.unstaged_host = first ? demand.host : 0.0;
    demand.hbm_after = demand.hbm + 1.0;
    demand.hbm_after_most = demand.hbm_after;
    demand.host_after = demand.host;
    demand.compressed_after = demand.compressed_held;
    return demand;
  }
  std::uint64_t step = 0;
  if (context <= trace->prompt_tokens + trace->steps) {
    step = context - trace->prompt_tokens - 1;
  } else {
    trace = &traces_.at(tail_trace_);
    step = std::min(context - trace->prompt_tokens - 1, trace->steps - 1);
  }
  const replay::ReplayDemand& replayed = trace->demand();
  const std::uint32_t source = trace->layer_map[layer];
  const replay::StepLayerRecord& start = replayed.start(source);
  // Attention reads the placement before the step's policy step; the step's record holds the
  // placement after it and the step's moves (step 0's also the start's, made at the prefill).
  const replay::StepLayerRecord& before = step == 0 ? start : replayed.at(step - 1, source);
  const replay::StepLayerRecord& after = replayed.at(step, source);
  demand.hbm = before.tokens[0];
  demand.host = before.tokens[1];
  demand.compressed_held = before.tokens[2];
  demand.compressed = attends_compressed_ ? demand.compressed_held : 0.0;
  demand.evicted = before.tokens[3];
  if (first) {
    demand.unstaged_host = demand.host;  // nothing staged yet
  } else if (step == 0) {
    demand.unstaged_host = start.newly_host;
  } else {
    // Entered T1 at the previous step's moves (step 0's record counts the start's too).
    demand.unstaged_host = before.newly_host - (step == 1 ? start.newly_host : 0U);
  }
  demand.hbm_after = after.tokens[0];
  demand.hbm_after_most = demand.hbm_after;
  demand.host_after = after.tokens[1];
  demand.compressed_after = after.tokens[2];
  const bool with_start = step == 0;
  const auto own = [&](std::uint32_t replay::StepLayerRecord::*moves) {
    return static_cast<double>(after.*moves - (with_start ? start.*moves : 0U));
  };
  demand.demoted = own(&replay::StepLayerRecord::demoted);
  demand.promoted = own(&replay::StepLayerRecord::promoted);
  demand.promoted_from_compressed = own(&replay::StepLayerRecord::promoted_from_compressed);
  demand.compressed_from_hbm = own(&replay::StepLayerRecord::compressed_from_hbm);
  // Of the tokens entering T2, those not from HBM came from T1; of those entering T1, those not
  // demoted from HBM came from T2 (replay/placement.hpp counts each move by its target).
  demand.recoded_to_compressed =
      own(&replay::StepLayerRecord::compressed) - demand.compressed_from_hbm;
  demand.recoded_to_full = own(&replay::StepLayerRecord::newly_host) - demand.demoted;
  return demand;
}

namespace {

// `step` followed by `next`, the policy's step for the token after it (TierDemand::step).
void then_step(LayerDemand& step, const LayerDemand& next) {
  step.hbm_after = next.hbm_after;
  step.host_after = next.host_after;
  step.compressed_after = next.compressed_after;
  step.demoted += next.demoted;
  step.promoted += next.promoted;
  step.promoted_from_compressed += next.promoted_from_compressed;
  step.compressed_from_hbm += next.compressed_from_hbm;
  step.recoded_to_compressed += next.recoded_to_compressed;
  step.recoded_to_full += next.recoded_to_full;
}

}  // namespace

LayerDemand TierDemand::step(std::uint32_t request, std::uint64_t context, std::uint64_t tokens,
                             std::uint64_t previous_tokens, std::uint32_t layer, bool first) const {
  LayerDemand step = at(request, context, layer, first);
  step.hbm_after_most = step.hbm_after + static_cast<double>(tokens - 1);
  for (std::uint64_t next = 1; next < tokens; ++next) {
    const LayerDemand later = at(request, context + next, layer, false);
    then_step(step, later);
    step.hbm_after_most =
        std::max(step.hbm_after_most, later.hbm_after + static_cast<double>(tokens - 1 - next));
  }
  if (!first && previous_tokens > 1) {
    for (std::uint64_t back = 1; back < previous_tokens; ++back) {
      step.unstaged_host += at(request, context - back, layer, false).unstaged_host;
    }
    step.unstaged_host = std::min(step.unstaged_host, step.host);
  }
  return step;
}

}  // namespace kvtier::serving
