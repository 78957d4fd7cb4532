#include "serving/impl/figures.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/text_output.hpp"
#include "hwmodels/link_math.hpp"

namespace kvtier::serving {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Every field is summed but the three maxima; a field added to ServingTotals must be merged
// here too, which this reminds of.
static_assert(sizeof(ServingTotals) == 43 * sizeof(std::uint64_t),
              "merge the new ServingTotals field in add()");

void add(ServingTotals& sum, const ServingTotals& engine) {
  sum.requests_completed += engine.requests_completed;
  sum.requests_handed_off += engine.requests_handed_off;
  sum.prompt_tokens += engine.prompt_tokens;
  sum.output_tokens += engine.output_tokens;
  sum.iterations += engine.iterations;
  sum.max_running = std::max(sum.max_running, engine.max_running);
  sum.max_waiting = std::max(sum.max_waiting, engine.max_waiting);
  sum.admissions_held_by_hbm += engine.admissions_held_by_hbm;
  sum.admissions_held_by_host += engine.admissions_held_by_host;
  sum.preemptions += engine.preemptions;
  sum.swapped_preemptions += engine.swapped_preemptions;
  sum.preempted_kv_tokens += engine.preempted_kv_tokens;
  sum.swap_out_bytes += engine.swap_out_bytes;
  sum.swap_in_bytes += engine.swap_in_bytes;
  sum.swap_busy += engine.swap_busy;
  sum.busy += engine.busy;
  sum.last_completion = std::max(sum.last_completion, engine.last_completion);
  sum.flops += engine.flops;
  sum.hbm_bytes += engine.hbm_bytes;
  sum.interconnect_bytes += engine.interconnect_bytes;
  sum.network_bytes += engine.network_bytes;
  sum.h2d_bytes += engine.h2d_bytes;
  sum.d2h_bytes += engine.d2h_bytes;
  sum.h2d_busy += engine.h2d_busy;
  sum.d2h_busy += engine.d2h_busy;
  sum.prefetch_stall += engine.prefetch_stall;
  sum.copy_wait += engine.copy_wait;
  sum.host_recode_bytes += engine.host_recode_bytes;
  sum.host_recode_busy += engine.host_recode_busy;
  sum.host_recode_stall += engine.host_recode_stall;
  sum.prefix_queried_tokens += engine.prefix_queried_tokens;
  sum.prefix_hit_tokens += engine.prefix_hit_tokens;
  sum.prefix_evicted_blocks += engine.prefix_evicted_blocks;
  sum.prefix_host_hit_tokens += engine.prefix_host_hit_tokens;
  sum.prefix_store_bytes += engine.prefix_store_bytes;
  sum.prefix_load_bytes += engine.prefix_load_bytes;
  sum.prefix_store_busy += engine.prefix_store_busy;
  sum.prefix_load_busy += engine.prefix_load_busy;
  sum.prefix_copies += engine.prefix_copies;
  sum.prefix_gather_busy += engine.prefix_gather_busy;
  sum.speculative_steps += engine.speculative_steps;
  sum.speculative_tokens += engine.speculative_tokens;
  sum.draft_busy += engine.draft_busy;
}

double ms(sim::Tick time) {
  return sim::to_seconds(time) * 1e3;
}

void add_distribution(std::vector<Metric>& metrics, const std::string& name,
                      const sim::LatencyDistribution& distribution) {
  if (distribution.count() == 0) {
    return;
  }
  metrics.push_back({name + "_p50_ms", ms(distribution.percentile(50)), 3});
  metrics.push_back({name + "_p90_ms", ms(distribution.percentile(90)), 3});
  metrics.push_back({name + "_p99_ms", ms(distribution.percentile(99)), 3});
  metrics.push_back({name + "_mean_ms", distribution.mean_ps() * 1e-9, 3});
}

void add_tier_metrics(std::vector<Metric>& m, const Figures& f, const ServingEngine& engine,
                      double seconds) {
  const ServingTotals& totals = f.totals;
  const double per_gpu = f.engines * seconds;
  m.push_back({"hbm_kv_full_cache_peak_gib", f.full_kv_peak / kGiB, 3});
  m.push_back({"hbm_saved_peak_gib", (f.full_kv_peak - f.kv_used_peak) / kGiB, 3});
  m.push_back({"hbm_saved_mean_gib", (f.full_kv_mean - f.kv_used_mean) / kGiB, 3});
  m.push_back({"host_kv_capacity_gib", engine.memory().host_kv_capacity_bytes / kGiB, 2});
  m.push_back({"host_kv_used_peak_gib", f.host_used_peak / kGiB, 3});
  m.push_back({"host_kv_reserved_peak_gib", f.host_reserved_peak / kGiB, 3});
  m.push_back({"pcie_h2d_gb", totals.h2d_bytes / 1e9, 3});
  m.push_back({"pcie_d2h_gb", totals.d2h_bytes / 1e9, 3});
  m.push_back({"pcie_h2d_gb_per_s", totals.h2d_bytes / 1e9 / seconds / f.engines, 3});
  m.push_back({"pcie_h2d_utilisation", sim::to_seconds(totals.h2d_busy) / per_gpu, 4});
  m.push_back({"pcie_d2h_utilisation", sim::to_seconds(totals.d2h_busy) / per_gpu, 4});
  m.push_back({"prefetch_stall_s", sim::to_seconds(totals.prefetch_stall), 4});
  m.push_back(
      {"prefetch_stall_fraction",
       sim::to_seconds(totals.prefetch_stall) / std::max(sim::to_seconds(totals.busy), 1e-12), 4});
  m.push_back({"copy_wait_s", sim::to_seconds(totals.copy_wait), 4});
  m.push_back({"copy_wait_fraction",
               sim::to_seconds(totals.copy_wait) / std::max(sim::to_seconds(totals.busy), 1e-12),
               4});
  m.push_back({"host_recode_gb", totals.host_recode_bytes / 1e9, 3});
  // Recodes a run does not time have no time (null, "-"); none take none.
  const double untimed =
      recodes_untimed(f, engine) ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  m.push_back({"host_recode_s", untimed + sim::to_seconds(totals.host_recode_busy), 4});
  m.push_back({"host_recode_stall_s", untimed + sim::to_seconds(totals.host_recode_stall), 4});
  const TierDemand* tiers = engine.tiers();
  const double kept = tiers != nullptr ? tiers->mean_kept_mass() : 1.0;
  m.push_back({"attention_mass_kept_mean", kept, 4});
  m.push_back({"attention_mass_kept_min", tiers != nullptr ? tiers->min_kept_mass() : 1.0, 4});
  m.push_back({"attention_mass_lost_mean", 1.0 - kept, 4});
}

// The most requests of the workload's mean shape that fit at once by HBM (their KV: T0 and
// staging with a tier policy) and by host memory (their T1/T2; 0 when they use none).
struct BatchLimits {
  double hbm = 0.0;
  double host = 0.0;
};

BatchLimits largest_batch(const ServingEngine& engine) {
  const MemoryPlan& plan = engine.memory();
  const auto count = static_cast<std::uint32_t>(engine.workload().requests.size());
  BatchLimits limits;
  if (count == 0) {
    return limits;
  }
  double hbm = 0.0;
  double host = 0.0;
  for (std::uint32_t id = 0; id < count; ++id) {
    hbm += engine.hbm_reservation(id);
    host += engine.host_reservation(id);
  }
  hbm /= count;
  host /= count;
  limits.hbm = hbm > 0 ? std::floor(plan.kv_capacity_bytes / hbm) : 0.0;
  limits.host = host > 0 ? std::floor(plan.host_kv_capacity_bytes / host) : 0.0;
  return limits;
}

}  // namespace

Figures figures_of(const ServingEngine& engine) {
  Figures f;
  f.totals = engine.totals();
  f.ttft = engine.ttft();
  f.tpot = engine.tpot();
  f.e2e = engine.e2e();
  f.queue_wait = engine.queue_wait();
  f.iteration = engine.iteration_time();
  f.kv_used_peak = engine.kv_used().max();
  f.kv_used_mean = engine.kv_used().time_average();
  f.busiest_gpu_kv_peak = engine.busiest_gpu_kv_peak();
  f.kv_reserved_peak = engine.kv_reserved().max();
  f.full_kv_peak = engine.full_kv().max();
  f.full_kv_mean = engine.full_kv().time_average();
  f.host_used_peak = engine.host_kv_used().max();
  f.host_reserved_peak = engine.host_kv_reserved().max();
  f.swap_used_peak = engine.swap_used().max();
  f.running_mean = engine.running().time_average();
  const MemoryPlan& plan = engine.memory();
  f.hbm_peak = plan.weights_bytes + plan.drafter_weights_bytes + plan.workspace_bytes +
               plan.reserve_bytes + f.kv_reserved_peak;
  return f;
}

Figures figures_of(const Cluster& cluster) {
  if (cluster.size() == 1) {
    return figures_of(cluster.engine(0));
  }
  Figures merged;
  merged.engines = static_cast<double>(cluster.size());
  for (std::size_t e = 0; e < cluster.size(); ++e) {
    const Figures f = figures_of(cluster.engine(e));
    add(merged.totals, f.totals);
    merged.ttft.merge(f.ttft);
    merged.tpot.merge(f.tpot);
    merged.e2e.merge(f.e2e);
    merged.queue_wait.merge(f.queue_wait);
    merged.iteration.merge(f.iteration);
    merged.kv_used_peak = std::max(merged.kv_used_peak, f.kv_used_peak);
    if (f.busiest_gpu_kv_peak) {
      merged.busiest_gpu_kv_peak =
          std::max(merged.busiest_gpu_kv_peak.value_or(0.0), *f.busiest_gpu_kv_peak);
    }
    merged.kv_reserved_peak = std::max(merged.kv_reserved_peak, f.kv_reserved_peak);
    merged.full_kv_peak = std::max(merged.full_kv_peak, f.full_kv_peak);
    merged.host_used_peak = std::max(merged.host_used_peak, f.host_used_peak);
    merged.host_reserved_peak = std::max(merged.host_reserved_peak, f.host_reserved_peak);
    merged.swap_used_peak = std::max(merged.swap_used_peak, f.swap_used_peak);
    merged.hbm_peak = std::max(merged.hbm_peak, f.hbm_peak);
    merged.kv_used_mean += f.kv_used_mean / merged.engines;
    merged.full_kv_mean += f.full_kv_mean / merged.engines;
    merged.running_mean += f.running_mean / merged.engines;
  }
  return merged;
}

bool recodes_untimed(const Figures& figures, const ServingEngine& engine) {
  return figures.totals.host_recode_bytes > 0.0 && !engine.host_recode_costed();
}

std::vector<Metric> engine_metrics(const Figures& f, const ServingEngine& engine,
                                   const config::RunSpec& run) {
  const ServingTotals& totals = f.totals;
  const MemoryPlan& plan = engine.memory();
  const double prefix_hit_rate = totals.prefix_queried_tokens > 0
                                     ? static_cast<double>(totals.prefix_hit_tokens) /
                                           static_cast<double>(totals.prefix_queried_tokens)
                                     : 0.0;
  const double seconds = std::max(sim::to_seconds(totals.last_completion), 1e-12);
  const double per_gpu = f.engines * seconds;
  const auto& node = run.hardware().node();
  // Merged over a cluster whose pools are split differently: its largest engine's GPUs say
  // whether GPU links and the network carry collectives, and a node holds engines on average.
  const bool merged = f.engines > 1.0;
  const double gpus = merged ? largest_gpus_per_engine(run) : gpus_per_engine(run);
  std::vector<Metric> m;

  m.push_back({"requests_completed", static_cast<double>(totals.requests_completed), 0});
  m.push_back({"prompt_tokens", static_cast<double>(totals.prompt_tokens), 0});
  m.push_back({"output_tokens", static_cast<double>(totals.output_tokens), 0});
  m.push_back({"iterations", static_cast<double>(totals.iterations), 0});
  m.push_back({"duration_s", seconds, 3});
  m.push_back(
      {"throughput_output_tokens_per_s", static_cast<double>(totals.output_tokens) / seconds, 1});
  m.push_back({"throughput_total_tokens_per_s",
               static_cast<double>(totals.prompt_tokens + totals.output_tokens) / seconds, 1});
  m.push_back(
      {"throughput_requests_per_s", static_cast<double>(totals.requests_completed) / seconds, 3});
  add_distribution(m, "ttft", f.ttft);
  add_distribution(m, "tpot", f.tpot);
  add_distribution(m, "e2e_latency", f.e2e);
  add_distribution(m, "queue_wait", f.queue_wait);
  add_distribution(m, "iteration", f.iteration);

  m.push_back({"hbm_capacity_gib", plan.capacity_bytes / kGiB, 2});
  m.push_back({"hbm_weights_gib", plan.weights_bytes / kGiB, 2});
  m.push_back({"hbm_workspace_gib", plan.workspace_bytes / kGiB, 2});
  m.push_back({"hbm_reserve_gib", plan.reserve_bytes / kGiB, 2});
  m.push_back({"hbm_kv_capacity_gib", plan.kv_capacity_bytes / kGiB, 2});
  m.push_back({"hbm_kv_used_peak_gib", f.kv_used_peak / kGiB, 3});
  m.push_back({"hbm_kv_used_mean_gib", f.kv_used_mean / kGiB, 3});
  if (f.busiest_gpu_kv_peak) {
    // Dispatched, the figures above are the mean GPU's; this one is the GPU that held most.
    m.push_back({"hbm_kv_used_peak_busiest_gpu_gib", *f.busiest_gpu_kv_peak / kGiB, 3});
  }
  m.push_back({"hbm_kv_reserved_peak_gib", f.kv_reserved_peak / kGiB, 3});
  m.push_back({"hbm_peak_gib", f.hbm_peak / kGiB, 3});
  m.push_back({"kv_bytes_per_token_per_gpu", plan.kv_bytes_per_token, 1});
  const BatchLimits limits = largest_batch(engine);
  m.push_back({"largest_batch_that_fits",
               limits.host > 0 ? std::min(limits.hbm, limits.host) : limits.hbm, 0});
  m.push_back({"largest_batch_hbm_limit", limits.hbm, 0});
  m.push_back({"largest_batch_host_limit", limits.host, 0});
  add_tier_metrics(m, f, engine, seconds);
  m.push_back({"max_running_requests", static_cast<double>(totals.max_running), 0});
  m.push_back({"mean_running_requests", f.running_mean, 2});
  m.push_back({"max_waiting_requests", static_cast<double>(totals.max_waiting), 0});
  m.push_back({"admissions_held_by_hbm", static_cast<double>(totals.admissions_held_by_hbm), 0});
  m.push_back({"admissions_held_by_host", static_cast<double>(totals.admissions_held_by_host), 0});
  m.push_back({"preemptions", static_cast<double>(totals.preemptions), 0});
  m.push_back({"preempted_kv_tokens", static_cast<double>(totals.preempted_kv_tokens), 0});
  m.push_back({"swapped_preemptions", static_cast<double>(totals.swapped_preemptions), 0});
  m.push_back({"swap_space_gib", plan.swap_space_bytes / kGiB, 2});
  m.push_back({"swap_space_used_peak_gib", f.swap_used_peak / kGiB, 3});
  m.push_back({"swap_out_gb", totals.swap_out_bytes / 1e9, 3});
  m.push_back({"swap_in_gb", totals.swap_in_bytes / 1e9, 3});
  m.push_back({"swap_s", sim::to_seconds(totals.swap_busy), 4});
  m.push_back({"prefix_cache_hit_tokens", static_cast<double>(totals.prefix_hit_tokens), 0});
  m.push_back({"prefix_cache_hit_rate", prefix_hit_rate, 4});
  m.push_back(
      {"prefix_cache_evicted_blocks", static_cast<double>(totals.prefix_evicted_blocks), 0});
  m.push_back({"prefix_cache_host_gib", plan.prefix_host_bytes / kGiB, 2});
  m.push_back(
      {"prefix_cache_host_hit_tokens", static_cast<double>(totals.prefix_host_hit_tokens), 0});
  m.push_back({"prefix_cache_store_gb", totals.prefix_store_bytes / 1e9, 3});
  m.push_back({"prefix_cache_load_gb", totals.prefix_load_bytes / 1e9, 3});
  m.push_back({"prefix_cache_store_s", sim::to_seconds(totals.prefix_store_busy), 4});
  m.push_back({"prefix_cache_load_s", sim::to_seconds(totals.prefix_load_busy), 4});
  m.push_back({"prefix_cache_copies", static_cast<double>(totals.prefix_copies), 0});
  m.push_back({"prefix_cache_gather_s", sim::to_seconds(totals.prefix_gather_busy), 4});
  if (run.engine().has_speculative()) {
    // Only with it, as the disaggregation's figures only with disaggregation.
    m.push_back({"speculative_tokens_per_step", speculative_tokens_per_step(totals), 4});
    m.push_back({"speculative_draft_busy_fraction", draft_busy_fraction(totals), 4});
    m.push_back({"speculative_drafter_weights_gib", plan.drafter_weights_bytes / kGiB, 3});
  }
  const bool spans_nodes = gpus > node.gpus_per_node();
  const double per_node = merged ? mean_engines_per_node(run) : engines_per_node(run);
  m.push_back(
      {"engines_per_node", per_node, spans_nodes || std::floor(per_node) != per_node ? 3 : 0});

  const hw::GpuModel& gpu = engine.cost_model().gpu();
  m.push_back({"gpu_busy_fraction", sim::to_seconds(totals.busy) / per_gpu, 4});
  m.push_back({"compute_utilisation",
               totals.flops / (gpu.peak_flops(run.model().activation_dtype()) * per_gpu), 4});
  m.push_back({"hbm_bandwidth_utilisation",
               totals.hbm_bytes / (gpu.memory_bytes_per_second() * per_gpu), 4});
  if (gpus > 1 && node.has_gpu_link()) {
    const double link = hw::asymptotic_gb_per_s(node.gpu_link(), config::PEER) * 1e9;
    m.push_back({"nvlink_utilisation", totals.interconnect_bytes / (link * per_gpu), 4});
  }
  if (spans_nodes && run.hardware().has_network()) {
    const double adapter = hw::asymptotic_gb_per_s(run.hardware().network(), config::PEER) * 1e9;
    m.push_back({"network_utilisation", totals.network_bytes / (adapter * per_gpu), 4});
  }
  return m;
}

double speculative_tokens_per_step(const ServingTotals& totals) {
  return totals.speculative_steps > 0 ? static_cast<double>(totals.speculative_tokens) /
                                            static_cast<double>(totals.speculative_steps)
                                      : 0.0;
}

double draft_busy_fraction(const ServingTotals& totals) {
  return totals.busy > sim::Tick::zero()
             ? sim::to_seconds(totals.draft_busy) / sim::to_seconds(totals.busy)
             : 0.0;
}

std::string speculative_note(const config::SpeculativeDecoding& speculative,
                             const ServingTotals& totals) {
  // The mean of the drafts accepted in a row and one more: Σ over j ≤ k of the chance that the
  // first j drafts are all accepted.
  double expected = 1.0;
  double all_accepted = 1.0;
  for (std::uint32_t draft = 0; draft < speculative.draft_tokens(); ++draft) {
    all_accepted *= draft_acceptance(speculative, draft);
    expected += all_accepted;
  }
  std::string rates;
  if (speculative.acceptance_by_position_size() > 0) {
    for (std::uint32_t draft = 0; draft < speculative.draft_tokens(); ++draft) {
      rates += (rates.empty() ? "" : ", ") + format_fixed(draft_acceptance(speculative, draft), 3);
    }
    rates = "with probabilities " + rates + " by position";
  } else {
    rates = "with probability " + format_fixed(speculative.acceptance_rate(), 3) +
            (speculative.has_acceptance_decay()
                 ? " (each later one times " + format_fixed(speculative.acceptance_decay(), 3) + ")"
                 : std::string());
  }
  return "speculative decoding (engine.speculative): " +
         std::to_string(speculative.draft_tokens()) + " draft tokens a step, each of " +
         std::to_string(speculative.draft_layers()) +
         " layer(s) of the model's shape and its LM head, accepted " + rates +
         " in a row: " + format_fixed(speculative_tokens_per_step(totals), 3) + " tokens a step (" +
         format_fixed(expected, 3) + " expected; fewer drafts near a request's end), the drafter " +
         format_fixed(100.0 * draft_busy_fraction(totals), 1) + "% of the GPU time";
}

}  // namespace kvtier::serving
