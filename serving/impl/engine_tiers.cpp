// The serving engine under a tier policy: its settings (the tiered layers and their bytes), each
// iteration's copies between HBM and the host's tiers, the placement of prompts and received KV
// (what a decode engine receives and holds of it), and the host's recodes.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "serving/engine.hpp"

namespace kvtier::serving {

void ServingEngine::start_tiering(const config::RunSpec& run) {
  copy_rates_ = measure_copy_rates(run);
  lookahead_ = run.tiering().prefetch_lookahead_layers();
  const std::uint32_t layers = run.model().num_hidden_layers();
  tiered_layers_ = tiered_layers(run);
  stage_of_tiered_layer_ = tiered_layer_stages(run);
  tiered_layers_per_gpu_ = most_tiered_layers_of_a_stage(stage_of_tiered_layer_);
  // The most tiered layers of one stage among lookahead + 1 in a row.
  staged_layers_ = 0;
  for (std::size_t i = 0; i < tiered_layers_.size(); ++i) {
    std::uint32_t in_span = 0;
    for (std::size_t j = i;
         j < tiered_layers_.size() && tiered_layers_[j] <= tiered_layers_[i] + lookahead_ &&
         stage_of_tiered_layer_[j] == stage_of_tiered_layer_[i];
         ++j) {
      ++in_span;
    }
    staged_layers_ = std::max(staged_layers_, in_span);
  }
  const std::uint32_t shards =
      hw::kv_shards(run.model(), run.tensor_parallel_degree(), attention_split(run));
  bytes_per_token_layer_ = hw::kv_bytes_per_token_per_layer_per_gpu(
      run.model(), run.tensor_parallel_degree(), attention_split(run));
  // One token in one layer on this GPU (its share of the KV vectors) in the policy's T2
  // format: codes and the scale of each vector.
  const hw::KvVectors vectors = hw::kv_vectors_per_token_per_layer(run.model());
  compressed_bytes_per_token_layer_ = tiers_->compressed_format().vectors_bytes(
      static_cast<double>(vectors.count) / shards, static_cast<double>(vectors.width));
  // Dispatched, each GPU copies its own requests' KV: whole latents (this GPU's share times the
  // GPUs sharing it, as the mean GPU holds 1/TP of each request's).
  const bool dispatched = run.engine().data_parallel_dispatch() != config::ROUTING_UNSPECIFIED;
  copies_by_part_.assign(dispatched ? run.tensor_parallel_degree() : pipeline_stages(run),
                         std::vector<LayerCopies>(layers));
  copy_scale_ = dispatched ? static_cast<double>(shards) : 1.0;
  const bool decode = role_ == EngineRole::kDecode && run.cluster().has_disaggregation();
  receives_into_host_ = decode && run.cluster().disaggregation().receive_into_host_memory();
  receives_kept_only_ = decode && run.cluster().disaggregation().send_kept_only();
  if (run.tiering().has_host_recode()) {
    // configs/impl/consistency.cpp requires the host's rates with it.
    const config::KvRecodeRates& rates = run.hardware().node().host().kv_recode();
    // Every GPU of the group on this host (a group across nodes has a host in each): its
    // share of the KV heads, or its copy of a latent or of its KV head.
    const double gpus_here =
        std::min(run.tensor_parallel_degree(), run.hardware().node().gpus_per_node());
    const double values = static_cast<double>(vectors.values()) * gpus_here / shards;
    recode_timing_ = run.tiering().host_recode().timing();
    recode_ns_to_compressed_ = values * rates.to_compressed_ns_per_value();
    recode_ns_to_full_ = values * rates.to_full_ns_per_value();
    recode_values_per_token_layer_ = values;
  }
}

sim::Tick ServingEngine::time_host_recodes(sim::Tick duration) {
  if (!recode_timing_) {
    return {};
  }
  const sim::Tick recodes = sim::from_nanoseconds(
      recode_makespan_ns(
          recoded_to_compressed_ + recoded_to_full_,
          recoded_to_compressed_ * recode_ns_to_compressed_ + recoded_to_full_ * recode_ns_to_full_,
          recode_values_per_token_layer_, run_.tiering().host_recode()),
      sim::Rounding::kUp);
  totals_.host_recode_busy += recodes;
  sim::Tick wait;
  if (*recode_timing_ == config::STEP_PATH) {
    wait = recodes;
  } else {
    // The recodes of the iteration before the previous one must be done before this one starts;
    // this iteration's recodes start when it ends, after those of the previous one.
    const sim::Tick now = simulator_.now();
    wait = std::max(recodes_done_previous_ - now, sim::Tick::zero());
    const sim::Tick ends = now + wait + duration + iteration_overhead_;
    recodes_done_previous_ = recodes_done_latest_;
    recodes_done_latest_ = std::max(ends, recodes_done_latest_) + recodes;
  }
  totals_.host_recode_stall += wait;
  return wait;
}

void ServingEngine::plan_tier_traffic(hw::BatchShape& batch) {
  for (std::vector<LayerCopies>& copies : copies_by_part_) {
    std::fill(copies.begin(), copies.end(), LayerCopies{});
  }
  const auto layers = static_cast<std::uint32_t>(copies_by_part_.front().size());
  const auto tiered = static_cast<std::uint32_t>(tiered_layers_.size());
  const auto parts = static_cast<std::uint32_t>(copies_by_part_.size());
  const bool differential = tiers_->differential_prefetch();
  // A token-layer in HBM and host memory, as the mean GPU holds it; as a part's GPU copies it.
  const double full = bytes_per_token_layer_;
  const double copied_full = full * copy_scale_;
  const double copied_compressed = compressed_bytes_per_token_layer_ * copy_scale_;
  // By part (micro-batch, or dispatched GPU), then layer: T1 + T2 tokens staged, and T2 tokens
  // dequantised in HBM. The tokens attention reads, by dispatched GPU (else one sum, in the
  // order of the requests).
  std::vector<std::vector<double>> staged(parts, std::vector<double>(layers, 0.0));
  std::vector<std::vector<double>> dequantised(parts, std::vector<double>(layers, 0.0));
  std::vector<double> resident(dispatch_ ? parts : 1, 0.0);
  recoded_to_compressed_ = 0.0;
  recoded_to_full_ = 0.0;
  // With pipeline stages the decodes are dealt out to the micro-batches in order, as many to
  // each as the cost model deals it (hw::micro_batch_decodes); dispatched, each is its GPU's.
  const std::uint64_t decodes = decoding_now_.size();
  std::uint32_t micro_batch = 0;
  std::uint64_t left_in_part = hw::micro_batch_decodes(decodes, parts, 0);
  for (const std::uint32_t id : decoding_now_) {
    while (left_in_part == 0 && micro_batch + 1 < parts) {
      left_in_part = hw::micro_batch_decodes(decodes, parts, ++micro_batch);
    }
    --left_in_part;
    Request& request = requests_[id];
    const std::uint32_t part = dispatch_ ? request.gpu : micro_batch;
    std::vector<LayerCopies>& micro = copies_by_part_[part];
    double& reads = resident[dispatch_ ? part : 0];
    request.tier_hbm = 0.0;
    request.tier_host = 0.0;
    const bool first = request.generated == request.first_decode;
    if (request.whole_in_hbm || request.whole_in_host) {
      // Dispatched, its GPU's copies of it (copy_scale_, as below).
      place_received(request, id, micro, staged[part], reads);
      continue;
    }
    const std::uint64_t tokens = step_tokens(id, request);
    StageSums hbm(stage_of_tiered_layer_);
    StageSums host(stage_of_tiered_layer_);
    for (std::uint32_t t = 0; t < tiered; ++t) {
      const LayerDemand demand = step_demand(id, request, t, tokens, first);
      const std::uint32_t layer = tiered_layers_[t];
      LayerCopies& copies = micro[layer];
      // As the live cache steps (kernels/live.hpp): attention stages the placement in force
      // before the step's policy step — its T1 tokens (all of them, or with differential
      // prefetch those without a staged copy) and its T2 tokens' compressed bytes. Then the
      // step's moves: promotions into HBM (a staged copy is not kept for them: the live cache
      // copies a promoted token in again, kernels/tier_book.hpp), T1 ones at full precision, T2
      // ones as their compressed bytes; offloads out of HBM. T1 <-> T2 recodes happen inside
      // host memory: no bus, but the host's threads (time_host_recodes). A step that gives
      // several tokens (speculative decoding) stages once and makes the moves of each
      // (step_demand).
      copies.staged_full += (differential ? demand.unstaged_host : demand.host) * copied_full;
      copies.staged_compressed += demand.compressed * copied_compressed;
      copies.promoted_full += (demand.promoted - demand.promoted_from_compressed) * copied_full;
      copies.promoted_compressed += demand.promoted_from_compressed * copied_compressed;
      copies.offloaded_full += demand.demoted * copied_full;
      copies.offloaded_compressed += demand.compressed_from_hbm * copied_compressed;
      recoded_to_compressed_ += demand.recoded_to_compressed;
      recoded_to_full_ += demand.recoded_to_full;
      staged[part][layer] += demand.host + demand.compressed;
      dequantised[part][layer] += demand.compressed + demand.promoted_from_compressed;
      // The tokens attention reads and the step's own.
      reads += demand.hbm + demand.host + demand.compressed + 1.0;
      hbm.add(t, in_whole_blocks(demand.hbm_after, plan_.block_tokens) * full);
      host.add(t, host_bytes(demand.host_after, demand.compressed_after));
    }
    request.tier_hbm = hbm.busiest() + untiered_kv_after_step(request, tokens);
    request.tier_host = host.busiest();
  }
  // A prefill that completes a prompt is followed by the policy's placement of it (the start),
  // as the request's first decode step reads it: what that placement holds off HBM is
  // offloaded, T1 tokens at full precision and T2 ones as their compressed bytes (evicted ones
  // are dropped), by the micro-batch the chunk is in (dispatched, by its GPU). A request that
  // decodes nothing is not placed.
  for (const PlannedChunk& chunk : prefilling_now_) {
    Request& request = requests_[chunk.request];
    if (request.prefilled + chunk.tokens < request.prefill_target ||
        request.generated + 1 >= request.spec.output_tokens) {
      continue;
    }
    const std::uint64_t context = tiered_context(request, request.generated + 1);
    std::vector<LayerCopies>& micro = copies_by_part_[dispatch_ ? request.gpu : chunk.micro_batch];
    StageSums hbm(stage_of_tiered_layer_);
    StageSums host(stage_of_tiered_layer_);
    for (std::uint32_t t = 0; t < tiered; ++t) {
      const LayerDemand placed = tiers_->at(chunk.request, context, t, true);
      LayerCopies& copies = micro[tiered_layers_[t]];
      copies.offloaded_full += placed.host * copied_full;
      copies.offloaded_compressed += placed.compressed_held * copied_compressed;
      hbm.add(t, in_whole_blocks(placed.hbm, plan_.block_tokens) * full);
      host.add(t, host_bytes(placed.host, placed.compressed_held));
    }
    request.tier_hbm = hbm.busiest() + plan_.untiered_kv_bytes_for(request.prefill_target);
    request.tier_host = host.busiest();
  }
  // Attention reads every token it attends in the tiered layers (not the T2 of a policy that
  // leaves T2 out), at full precision once staged: with hybrid attention the global layers'
  // context, the windowed layers reading their window in HBM as add_decode_context counted it.
  // Dispatched, each GPU reads its own requests' (data-parallel attention is modelled for
  // latent attention only, which has no windowed layers).
  const double all_resident = std::accumulate(resident.begin(), resident.end(), 0.0);
  const auto context = static_cast<std::uint64_t>(std::llround(all_resident / tiered));
  if (hw::has_hybrid_attention(run_.model())) {
    batch.decode_global_context_tokens = context;
  } else {
    batch.decode_context_tokens = context;
  }
  for (std::size_t gpu = 0; gpu < batch.decodes_by_gpu.size(); ++gpu) {
    batch.decodes_by_gpu[gpu].decode_context_tokens =
        static_cast<std::uint64_t>(std::llround(resident[gpu] / tiered));
  }
  // The model of copy engines: they only copy, so T2 tokens are dequantised in HBM afterwards
  // (the live cache dequantises with kernels even in its copy-engine mode, so no live run
  // checks this). SM kernels dequantise as they copy.
  const hw::GpuModel& gpu = cost_model_.gpu();
  double staging_tokens = 0.0;
  staging_by_gpu_.assign(dispatch_ ? parts : 0, 0.0);
  for (std::uint32_t m = 0; m < parts; ++m) {
    for (std::uint32_t layer = 0; layer < layers && copy_rates_.method != config::SM_KERNELS;
         ++layer) {
      if (dequantised[m][layer] > 0.0) {
        copies_by_part_[m][layer].extra_compute =
            gpu.op_time(hw::OpKind::kElementwise,
                        hw::OpCost{0.0, dequantised[m][layer] * (copied_compressed + copied_full)},
                        run_.model().activation_dtype());
      }
    }
    // A stage computes its micro-batches in turn: the buffer holds one's staging at a time.
    // Dispatched GPUs each have their own buffer (the mean GPU's share of them all).
    const double most = *std::max_element(staged[m].begin(), staged[m].end());
    staging_tokens = dispatch_ ? staging_tokens + most : std::max(staging_tokens, most);
    if (dispatch_) {
      staging_by_gpu_[m] = most * staged_layers_ * full;
    }
  }
  tier_staging_bytes_ = staging_tokens * staged_layers_ * full;
}

double ServingEngine::untiered_kv_after_step(const Request& request, std::uint64_t tokens) const {
  return plan_.untiered_kv_bytes_for(request.spec.prompt_tokens + request.generated + tokens - 1);
}

LayerDemand ServingEngine::step_demand(std::uint32_t id, const Request& request,
                                       std::uint32_t layer, std::uint64_t tokens,
                                       bool first) const {
  return tiers_->step(id, tiered_context(request, request.generated), tokens,
                      request.last_step_tokens, layer, first);
}

void ServingEngine::place_received(Request& request, std::uint32_t id,
                                   std::vector<LayerCopies>& copies, std::vector<double>& staged,
                                   double& resident) {
  // Its KV came whole over the kv_link. A request whose first step here is its last is not
  // placed.
  //
  // Into HBM: its first step reads there every token the policy keeps (nothing staged or
  // promoted), then offloads what the policy's placement after the step holds off HBM, T1 tokens
  // at full precision and T2 ones as their compressed bytes (evicted ones are dropped), as the
  // placement of a prompt prefilled here is offloaded.
  //
  // Into host memory, at full precision: its first step loads from there every token the policy
  // keeps before the layer computes, T0 ones into its blocks and T1 and T2 ones staged. After
  // the step its promotions are copied in and nothing out, since the host holds every token
  // already; the host's threads recode its T2 tokens.
  //
  // Either way the untiered KV (a drafter's, hybrid attention's windowed layers') came into HBM
  // and stays there.
  const bool in_host = request.whole_in_host;
  const std::uint64_t tokens = step_tokens(id, request);
  const bool last = request.generated + tokens >= request.spec.output_tokens;
  // Memory as the mean GPU holds it; copies as its GPU makes them (whole latents, dispatched).
  const double full = bytes_per_token_layer_;
  const double copied_full = full * copy_scale_;
  const double copied_compressed = compressed_bytes_per_token_layer_ * copy_scale_;
  StageSums loaded(stage_of_tiered_layer_);  // in host memory: the T0 its first step loads
  StageSums hbm(stage_of_tiered_layer_);
  StageSums host(stage_of_tiered_layer_);
  for (std::uint32_t t = 0; t < tiered_layers_.size(); ++t) {
    const LayerDemand demand = step_demand(id, request, t, tokens, true);
    const std::uint32_t layer = tiered_layers_[t];
    resident += demand.hbm + demand.host + demand.compressed + 1.0;
    if (in_host) {
      copies[layer].staged_full += (demand.hbm + demand.host + demand.compressed) * copied_full;
      staged[layer] += demand.host + demand.compressed;
      loaded.add(t, in_whole_blocks(demand.hbm + 1.0 + static_cast<double>(drafts(request)),
                                    plan_.block_tokens) *
                        full);
    }
    if (last) {
      continue;
    }
    if (in_host) {
      copies[layer].promoted_full += demand.promoted * copied_full;
      recoded_to_compressed_ += demand.compressed_after;
    } else {
      copies[layer].offloaded_full += demand.host_after * copied_full;
      copies[layer].offloaded_compressed += demand.compressed_after * copied_compressed;
    }
    hbm.add(t, in_whole_blocks(demand.hbm_after, plan_.block_tokens) * full);
    host.add(t, host_bytes(demand.host_after, demand.compressed_after));
  }
  // The untiered KV (received in HBM) grows by the tokens the step writes.
  const double untiered = untiered_kv_after_step(request, tokens);
  if (last) {
    // It leaves after this step, its prompt where it came and what it loaded in HBM.
    request.tier_hbm =
        in_host ? loaded.busiest() + untiered : received_kv_bytes(id, request.generated);
    request.tier_host = in_host ? received_host_bytes(id) : 0.0;
  } else {
    request.tier_hbm = hbm.busiest() + untiered;
    request.tier_host = host.busiest();
  }
  request.whole_in_hbm = false;
  request.whole_in_host = false;
  // Nothing of its T1 is staged: its next step copies all of it in, even with differential
  // prefetch.
  request.first_decode = request.generated + tokens;
}

double ServingEngine::received_kv_bytes(std::uint32_t request, std::uint64_t extra) const {
  const std::uint64_t tokens = requests_[request].spec.prompt_tokens + extra;
  // The untiered KV comes whole.
  return receives_kept_only_ ? kept_token_layers(request, extra, true) * bytes_per_token_layer_ +
                                   plan_.untiered_kv_bytes_for(tokens)
                             : plan_.kv_bytes_for(tokens);
}

double ServingEngine::received_host_bytes(std::uint32_t id) const {
  const double tokens =
      receives_kept_only_
          ? kept_token_layers(id, 0, false)
          : static_cast<double>(requests_[id].spec.prompt_tokens) * tiered_layers_per_gpu_;
  return host_bytes(tokens, 0.0);
}

double ServingEngine::kept_token_layers(std::uint32_t id, std::uint64_t extra,
                                        bool in_blocks) const {
  const std::uint64_t context = requests_[id].spec.prompt_tokens + 1;
  StageSums kept(stage_of_tiered_layer_);
  for (std::uint32_t layer = 0; layer < stage_of_tiered_layer_.size(); ++layer) {
    // The placement before the first step: what it holds in any tier, read or not.
    const LayerDemand start = tiers_->at(id, context, layer, true);
    const double tokens =
        start.hbm + start.host + start.compressed_held + static_cast<double>(extra);
    kept.add(layer, in_blocks ? in_whole_blocks(tokens, plan_.block_tokens) : tokens);
  }
  return kept.busiest();
}

sim::Tick ServingEngine::time_stage_copies(const hw::IterationCost& compute,
                                           std::span<const std::span<const LayerCopies>> gpus,
                                           CopyTimes& times) const {
  // Dispatched, each GPU's own compute of a layer (a GPU attending less than the slowest, less).
  const PipelineTiming timing =
      time_pipeline(compute.layer, gpus, lookahead_, copy_rates_, compute.layer_lighter_by_gpu);
  const sim::Tick computed = timing.layers_end + compute.head;
  const sim::Tick duration = std::max(computed, timing.end) + timing.trailing;
  times.prefetch_stall += timing.stall;
  times.copy_wait += timing.stall + (duration - computed);
  times.h2d_busy += timing.h2d_busy;
  times.d2h_busy += timing.d2h_busy;
  return duration;
}

sim::Tick ServingEngine::time_tier_copies(const hw::BatchShape& batch, hw::IterationCost& cost) {
  CopyTimes times;
  const auto stages = static_cast<std::int64_t>(pipeline_stages(run_));
  sim::Tick duration;
  if (stages == 1) {
    cost = cost_model_.cost(batch);
    // The drafter's passes come before the verifying pass and its copies, which do not start
    // during them.
    const sim::Tick drafting = speculative_ ? draft_passes(cost) : sim::Tick::zero();
    // One part, or dispatched each GPU's copies.
    const std::vector<std::span<const LayerCopies>> gpus(copies_by_part_.begin(),
                                                         copies_by_part_.end());
    duration = time_stage_copies(cost, gpus, times) + drafting;
  } else {
    // Each stage copies its own layers' KV over its own GPUs' links, one micro-batch after
    // another, as it computes them.
    cost = cost_model_.cost(batch, [&](const hw::StageWork& work) {
      const std::span<const LayerCopies> copies(copies_by_part_[work.micro_batch]);
      const std::span<const LayerCopies> stage[] = {copies.subspan(work.first_layer, work.layers)};
      return time_stage_copies(*work.compute, stage, times);
    });
    duration = cost.total;
  }
  // Per GPU: every GPU is in one stage, so the mean stage's share. Dispatched GPUs all wait as
  // the layers do, each busy copying its own (the mean of the parts).
  const auto parts = static_cast<std::int64_t>(copies_by_part_.size());
  totals_.prefetch_stall += times.prefetch_stall / stages;
  totals_.copy_wait += times.copy_wait / stages;
  totals_.h2d_busy += times.h2d_busy / parts;
  totals_.d2h_busy += times.d2h_busy / parts;
  const double share = 1.0 / static_cast<double>(parts);
  for (const std::vector<LayerCopies>& micro : copies_by_part_) {
    for (const LayerCopies& copies : micro) {
      totals_.h2d_bytes += copies.h2d_bytes() * share;
      totals_.d2h_bytes += copies.d2h_bytes() * share;
    }
  }
  // The recodes are counted as the mean GPU holds its token-layers, over every stage's.
  totals_.host_recode_bytes += (recoded_to_compressed_ * bytes_per_token_layer_ +
                                recoded_to_full_ * compressed_bytes_per_token_layer_) *
                               (1.0 / static_cast<double>(stages));
  return duration;
}

}  // namespace kvtier::serving
