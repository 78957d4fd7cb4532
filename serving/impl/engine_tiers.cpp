// The serving engine under a tier policy: each iteration's copies between HBM and the host's
// tiers, the placement of prompts and received KV, and the host's recodes.

#include <algorithm>
#include <cmath>
#include <vector>

#include "serving/engine.hpp"

namespace kvtier::serving {

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
  std::fill(layer_copies_.begin(), layer_copies_.end(), LayerCopies{});
  const auto layers = static_cast<std::uint32_t>(layer_copies_.size());
  const bool differential = tiers_->differential_prefetch();
  const double full = bytes_per_token_layer_;
  const double compressed = compressed_bytes_per_token_layer_;
  std::vector<double> staged(layers, 0.0);
  std::vector<double> dequantised(layers, 0.0);
  double resident = 0.0;
  recoded_to_compressed_ = 0.0;
  recoded_to_full_ = 0.0;
  for (const std::uint32_t id : decoding_now_) {
    Request& request = requests_[id];
    request.tier_hbm = 0.0;
    request.tier_host = 0.0;
    const std::uint64_t context = attended(request);
    const bool first = request.generated == request.first_decode;
    if (request.whole_in_hbm) {
      place_received(request, id, context, resident);
      continue;
    }
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      const LayerDemand demand = tiers_->at(id, context, layer, first);
      LayerCopies& copies = layer_copies_[layer];
      // As the live cache steps (kernels/live.hpp): attention stages the placement in force
      // before the step's policy step — its T1 tokens (all of them, or with differential
      // prefetch those without a staged copy) and its T2 tokens' compressed bytes. Then the
      // step's moves: promotions into HBM (a staged copy is not kept for them: the live cache
      // copies a promoted token in again, kernels/tier_book.hpp), T1 ones at full precision, T2
      // ones as their compressed bytes; offloads out of HBM. T1 <-> T2 recodes happen inside
      // host memory: no bus, but the host's threads (time_host_recodes).
      copies.staged_full += (differential ? demand.unstaged_host : demand.host) * full;
      copies.staged_compressed += demand.compressed * compressed;
      copies.promoted_full += (demand.promoted - demand.promoted_from_compressed) * full;
      copies.promoted_compressed += demand.promoted_from_compressed * compressed;
      copies.offloaded_full += demand.demoted * full;
      copies.offloaded_compressed += demand.compressed_from_hbm * compressed;
      recoded_to_compressed_ += demand.recoded_to_compressed;
      recoded_to_full_ += demand.recoded_to_full;
      staged[layer] += demand.host + demand.compressed;
      dequantised[layer] += demand.compressed + demand.promoted_from_compressed;
      // The held tokens and the step's own.
      resident += demand.hbm + demand.host + demand.compressed + 1.0;
      request.tier_hbm += in_whole_blocks(demand.hbm_after, plan_.block_tokens) * full;
      request.tier_host += host_bytes(demand.host_after, demand.compressed_after);
    }
  }
  // A prefill that completes a prompt is followed by the policy's placement of it (the start),
  // as the request's first decode step reads it: what that placement holds off HBM is
  // offloaded, T1 tokens at full precision and T2 ones as their compressed bytes (evicted ones
  // are dropped). A request that decodes nothing is not placed.
  for (const PlannedChunk& chunk : prefilling_now_) {
    Request& request = requests_[chunk.request];
    if (request.prefilled + chunk.tokens < request.prefill_target ||
        request.generated + 1 >= request.spec.output_tokens) {
      continue;
    }
    const std::uint64_t context = attended(request, request.generated + 1);
    request.tier_hbm = 0.0;
    request.tier_host = 0.0;
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      const LayerDemand placed = tiers_->at(chunk.request, context, layer, true);
      layer_copies_[layer].offloaded_full += placed.host * full;
      layer_copies_[layer].offloaded_compressed += placed.compressed * compressed;
      request.tier_hbm += in_whole_blocks(placed.hbm, plan_.block_tokens) * full;
      request.tier_host += host_bytes(placed.host, placed.compressed);
    }
  }
  // Attention reads every token still held, at full precision once staged.
  batch.decode_context_tokens = static_cast<std::uint64_t>(std::llround(resident / layers));
  // The model of copy engines: they only copy, so T2 tokens are dequantised in HBM afterwards
  // (the live cache dequantises with kernels even in its copy-engine mode, so no live run
  // checks this). SM kernels dequantise as they copy.
  const hw::GpuModel& gpu = cost_model_.gpu();
  for (std::uint32_t layer = 0; layer < layers && copy_rates_.method != config::SM_KERNELS;
       ++layer) {
    if (dequantised[layer] > 0.0) {
      layer_copies_[layer].extra_compute = gpu.op_time(
          hw::OpKind::kElementwise, hw::OpCost{0.0, dequantised[layer] * (compressed + full)},
          run_.model().activation_dtype());
    }
  }
  const double staging = *std::max_element(staged.begin(), staged.end()) * staged_layers_ * full;
  tier_staging_bytes_ = staging;
}

void ServingEngine::place_received(Request& request, std::uint32_t id, std::uint64_t context,
                                   double& resident) {
  // Its KV came whole over the kv_link into HBM: its first step reads there every token the
  // policy keeps (nothing staged or promoted), then offloads what the policy's placement after
  // the step holds off HBM, T1 tokens at full precision and T2 ones as their compressed bytes
  // (evicted ones are dropped), as the placement of a prompt prefilled here is offloaded. A
  // request whose first step here is its last is not placed.
  const bool last = request.generated + 1 >= request.spec.output_tokens;
  for (std::uint32_t layer = 0; layer < layer_copies_.size(); ++layer) {
    const LayerDemand demand = tiers_->at(id, context, layer, true);
    resident += demand.hbm + demand.host + demand.compressed + 1.0;
    if (last) {
      continue;
    }
    layer_copies_[layer].offloaded_full += demand.host_after * bytes_per_token_layer_;
    layer_copies_[layer].offloaded_compressed +=
        demand.compressed_after * compressed_bytes_per_token_layer_;
    request.tier_hbm +=
        in_whole_blocks(demand.hbm_after, plan_.block_tokens) * bytes_per_token_layer_;
    request.tier_host += host_bytes(demand.host_after, demand.compressed_after);
  }
  if (last) {
    request.tier_hbm = plan_.kv_bytes_for(request.spec.prompt_tokens + request.generated);
  }
  request.whole_in_hbm = false;
  // Nothing of its T1 is staged: its next step copies all of it in, even with differential
  // prefetch.
  request.first_decode = request.generated + 1;
}

}  // namespace kvtier::serving
