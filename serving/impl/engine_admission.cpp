// Admission: whole-request reservations, or on demand with preemption (by recompute or by
// swapping), and what a request's KV takes at the end of an iteration's planned work.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "serving/engine.hpp"

namespace kvtier::serving {

std::optional<std::uint32_t> ServingEngine::next_waiting(AdmissionPass& pass,
                                                         std::uint64_t budget) const {
  while (budget > 0 && pass.next < waiting_.size() && running_.size() < max_batch_ &&
         !(dispatch_ && dispatch_->all_held())) {
    const std::uint32_t id = waiting_[pass.next];
    if (!admission_held(requests_[id])) {
      return id;
    }
    ++pass.next;
  }
  return std::nullopt;
}

bool ServingEngine::hold_back(AdmissionPass& pass, const Request& head, bool hbm_short,
                              bool host_short) {
  pass.held_by_hbm = pass.held_by_hbm || hbm_short;
  pass.held_by_host = pass.held_by_host || host_short;
  if (!dispatch_) {
    return false;  // first come, first served: later requests wait behind the head
  }
  dispatch_->hold(head.gpu);  // and so on each GPU
  ++pass.next;
  return true;
}

void ServingEngine::take_from_queue(const AdmissionPass& pass) {
  Request& head = requests_[waiting_[pass.next]];
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(pass.next));
  if (!head.admitted_once) {
    head.admitted_once = true;
    head.admitted = simulator_.now();
    queue_wait_.record(head.admitted - head.arrival);
  }
}

void ServingEngine::end_pass(const AdmissionPass& pass) {
  totals_.admissions_held_by_hbm += pass.held_by_hbm ? 1 : 0;
  totals_.admissions_held_by_host += pass.held_by_host ? 1 : 0;
}

void ServingEngine::admit_reserving(std::uint64_t budget, hw::BatchShape& batch) {
  if (prefix_cache_) {
    kv_reserved_bytes_ = shared_reservations();
  }
  if (dispatch_) {
    dispatch_->start_admission();
  }
  AdmissionPass pass;
  for (auto next = next_waiting(pass, budget); next; next = next_waiting(pass, budget)) {
    const std::uint32_t id = *next;
    Request& head = requests_[id];
    // With prefix caching its whole life but the cached blocks it takes, some of which it takes
    // out of the free memory.
    const PrefixHits hits = prefix_hits(id);
    const double kv =
        hbm_reservation(id) - static_cast<double>(hits.shared()) * plan_.block_bytes();
    const double host = host_reservation(id);
    const bool hbm_short =
        dispatch_ ? dispatch_->exceeds(dispatch_->reserved(head.gpu) + kv, plan_.kv_capacity_bytes)
                  : kv_reserved_bytes_ + kv > plan_.kv_capacity_bytes;
    const bool host_short = host_reserved_bytes_ + host > plan_.host_kv_capacity_bytes;
    if (hbm_short || host_short) {
      if (hold_back(pass, head, hbm_short, host_short)) {
        continue;
      }
      break;
    }
    take_from_queue(pass);
    head.kv_reserved = kv;
    head.host_reserved = host;
    kv_reserved_bytes_ += kv;
    host_reserved_bytes_ += host;
    if (dispatch_) {
      dispatch_->reserve(head.gpu, kv);
    }
    take_prefix_hits(id, hits);
    admit(id, budget, batch);
  }
  end_pass(pass);
}

double ServingEngine::shared_reservations() const {
  double bytes = cached_blocks_in_use();
  for (const auto* held : {&running_, &handed_off_}) {
    for (const std::uint32_t id : *held) {
      bytes += hbm_reservation(id) - cached_blocks_held(requests_[id]);
    }
  }
  return bytes;
}

void ServingEngine::admit(std::uint32_t id, std::uint64_t& budget, hw::BatchShape& batch) {
  Request& request = requests_[id];
  running_.push_back(id);
  if (dispatch_) {
    dispatch_->started_running(request.gpu);
  }
  if (request.remote) {
    // Its blocks are its now; its KV comes from its prefill engine before it decodes.
    request.remote = false;
    request.receiving = true;
    hooks_.kv_wanted(id);
    return;
  }
  if (request.swapped) {
    // Its T0 copied back; its T1/T2 return to the tiers' host memory.
    swap_in_bytes_now_ += request.swapped_bytes;
    swap_in_copies_now_ += request.swap_copies;
    swap_used_bytes_ -= request.swapped_bytes + request.tier_host;
    request.swapped = false;
    request.swapped_bytes = 0.0;
    swap_used_.set(swap_used_bytes_);
    host_used_.set(host_kv_in_use());
  }
  if (prefilling(request)) {
    add_chunk(id, budget, batch);
    return;
  }
  // Swapped in while decoding: it decodes on at once.
  decoding_now_.push_back(id);
  ++batch.decode_tokens;
  add_decode_context(request, 0, batch);
  const std::uint64_t drafted = drafts(request);
  add_drafts(request, drafted, batch);
  budget -= std::min<std::uint64_t>(budget, 1 + drafted);
}

ServingEngine::Footprint ServingEngine::footprint(std::uint32_t id,
                                                  std::uint64_t chunk_tokens) const {
  const Request& request = requests_[id];
  Footprint bytes;
  if (prefilling(request)) {
    // A prompt sits whole in HBM while it is prefilled; the chunk that completes it is
    // followed by the policy's placement, which puts part of it in host memory. That host
    // share is counted from the first chunk on, so that host memory holds back an admission
    // rather than preempting a request once its prompt is placed.
    const std::uint64_t prefilled = request.prefilled + chunk_tokens;
    bytes.hbm = plan_.kv_bytes_for(prefilled);
    if (tiers_ != nullptr && request.generated + 1 < request.spec.output_tokens) {
      const std::uint64_t context = tiered_context(request, request.generated + 1);
      StageSums host(stage_of_tiered_layer_);
      for (std::uint32_t layer = 0; layer < stage_of_tiered_layer_.size(); ++layer) {
        const LayerDemand placed = tiers_->at(id, context, layer, true);
        host.add(layer, host_bytes(placed.host, placed.compressed_held));
      }
      bytes.host = host.busiest();
    }
    bytes.hbm -= cached_blocks_held(request);
    return bytes;
  }
  if (tiers_ == nullptr || request.whole_in_hbm) {
    // The step writes the KV of the newest token (and of the drafts it verifies), and keeps that
    // of the drafts accepted: the most of either. A decode engine's request received whole (or
    // on its way) is placed by its first step, which reads it all in HBM: its host share counts
    // from its admission on, as a prefill's does (none when that step is its last).
    const std::uint64_t written = request.generated + drafts(request);
    double most = 0.0;
    if (tiers_ != nullptr) {
      most = received_kv_bytes(id, written);
      for (std::uint64_t kept = request.generated; kept < written; ++kept) {
        most = std::max(most, received_kv_bytes(id, kept));
      }
    } else {
      most = plan_.most_kv_bytes_for(request.spec.prompt_tokens + request.generated,
                                     request.spec.prompt_tokens + written);
    }
    bytes.hbm = most - cached_blocks_held(request);
    const std::uint64_t tokens = tiers_ != nullptr ? step_tokens(id, request) : 1;
    if (tiers_ != nullptr && request.generated + tokens < request.spec.output_tokens) {
      StageSums host(stage_of_tiered_layer_);
      for (std::uint32_t layer = 0; layer < stage_of_tiered_layer_.size(); ++layer) {
        const LayerDemand demand = step_demand(id, request, layer, tokens, true);
        host.add(layer, host_bytes(demand.host_after, demand.compressed_after));
      }
      bytes.host = host.busiest();
    }
    return bytes;
  }
  // As the step leaves it (what kv_in_use() counts), with its share of the staging buffer:
  // its largest layer's T1 + T2 for each layer staged at once.
  const bool first = request.generated == request.first_decode;
  const std::uint64_t tokens = step_tokens(id, request);
  const auto drafted = static_cast<double>(drafts(request));
  double staged = 0.0;
  StageSums hbm(stage_of_tiered_layer_);
  StageSums host(stage_of_tiered_layer_);
  for (std::uint32_t layer = 0; layer < stage_of_tiered_layer_.size(); ++layer) {
    const LayerDemand demand = step_demand(id, request, layer, tokens, first);
    // Received into host memory, its first step loads the T0 of the placement before it, which
    // no earlier step counted; its policy may hold less there after the step (H2O evicts then).
    // A speculating step writes its drafts' KV beside the newest token's before the policy
    // steps, then holds each placement its tokens' policy steps leave.
    const double during = demand.hbm + 1.0 + drafted;
    const double held = request.whole_in_host || drafted > 0.0
                            ? std::max(during, demand.hbm_after_most)
                            : demand.hbm_after;
    hbm.add(layer, in_whole_blocks(held, plan_.block_tokens) * bytes_per_token_layer_);
    host.add(layer, host_bytes(demand.host_after, demand.compressed_after));
    staged = std::max(staged, demand.host + demand.compressed);
  }
  bytes.hbm = hbm.busiest() + staged * staged_layers_ * bytes_per_token_layer_ +
              plan_.most_untiered_kv_bytes_for(
                  request.spec.prompt_tokens + request.generated,
                  request.spec.prompt_tokens + request.generated + drafts(request));
  // Received into host memory and not yet placed: its prompt (or its kept tokens) is there.
  bytes.host =
      request.whole_in_host ? std::max(host.busiest(), received_host_bytes(id)) : host.busiest();
  return bytes;
}

ServingEngine::Footprint ServingEngine::planned_footprint(std::vector<double>* hbm_by_gpu) const {
  Footprint total;
  if (hbm_by_gpu != nullptr) {
    hbm_by_gpu->assign(dispatch_ ? dispatch_->gpus() : 0, 0.0);
  }
  for (const std::uint32_t id : running_) {
    const auto chunk = std::find_if(prefilling_now_.begin(), prefilling_now_.end(),
                                    [id](const PlannedChunk& c) { return c.request == id; });
    const Footprint bytes = footprint(id, chunk != prefilling_now_.end() ? chunk->tokens : 0);
    total.hbm += bytes.hbm;
    total.host += bytes.host;
    if (hbm_by_gpu != nullptr && dispatch_) {
      (*hbm_by_gpu)[requests_[id].gpu] += bytes.hbm;
    }
  }
  for (const std::uint32_t id : handed_off_) {
    const Request& request = requests_[id];
    const double held = plan_.kv_bytes_for(cached_tokens(request)) - cached_blocks_held(request);
    total.hbm += held;
    if (hbm_by_gpu != nullptr && dispatch_) {
      (*hbm_by_gpu)[request.gpu] += held;
    }
  }
  total.hbm += cached_blocks_in_use();
  return total;
}

std::uint64_t ServingEngine::swap_copies(double bytes) const {
  // Its HBM KV is whole blocks of one layer each: the blocks of a whole cache (or a prompt being
  // prefilled) in every layer, or each layer's T0 blocks with a tier policy. One copy each for
  // its keys and for its values.
  const double layer_block_bytes = plan_.block_bytes() / static_cast<double>(kv_layers_per_gpu_);
  return 2 * static_cast<std::uint64_t>(std::llround(bytes / layer_block_bytes));
}

void ServingEngine::preempt(std::uint32_t id) {
  Request& request = requests_[id];
  ++totals_.preemptions;
  const double bytes = hbm_kv_bytes(id);
  if (swapping_ && swap_used_bytes_ + bytes + request.tier_host <= plan_.swap_space_bytes) {
    // Its HBM KV is copied out before this iteration's forward pass, and with a tier policy its
    // T1/T2, already in host memory, pass to the swap space (no copy). It resumes where it
    // stopped, nothing of it staged.
    ++totals_.swapped_preemptions;
    request.swapped = true;
    request.swapped_bytes = bytes;
    request.swap_copies = swap_copies(bytes);
    swap_used_bytes_ += bytes + request.tier_host;
    swap_out_bytes_now_ += bytes;
    swap_out_copies_now_ += request.swap_copies;
    swap_used_.set(swap_used_bytes_);
    if (!prefilling(request)) {
      request.first_decode = request.generated;
    }
  } else {
    // Recomputed: its KV is dropped, and its next prefill covers the prompt and every token
    // generated so far, the newest included, whose prefill then produces the next token.
    totals_.preempted_kv_tokens += plan_.most_held_tokens(cached_tokens(request));
    if (!prefilling(request)) {
      request.prefill_target = request.spec.prompt_tokens + request.generated;
    }
    request.prefilled = 0;
    request.tier_hbm = 0.0;
    request.tier_host = 0.0;
    request.whole_in_hbm = false;  // its prefill places it
    request.whole_in_host = false;
    if (prefix_cache_) {
      release_cached_blocks(id);
    }
  }
  running_.erase(std::find(running_.begin(), running_.end(), id));
  if (dispatch_) {
    dispatch_->stopped_running(request.gpu);
  }
  waiting_.push_front(id);
  totals_.max_waiting = std::max<std::uint64_t>(totals_.max_waiting, waiting_.size());
  // Its KV is gone from now on.
  record_kv_used();
  full_kv_.set(full_kv_in_use());
  host_used_.set(host_kv_in_use());
}

std::optional<std::uint32_t> ServingEngine::preemption_victim(
    const Footprint& need, const std::vector<double>& hbm_by_gpu) const {
  // A decode engine's request whose KV is on the way is not preempted: it takes no more memory
  // until it decodes, and its transfer is under way. Nor is one received into host memory and
  // not yet placed: it holds no HBM, and a recompute would throw its prompt's copy away.
  const auto last_preemptible = [this](auto&& on_gpu) -> std::optional<std::uint32_t> {
    const auto last = std::find_if(running_.rbegin(), running_.rend(), [&](std::uint32_t id) {
      return on_gpu(requests_[id]) && !requests_[id].receiving && !requests_[id].whole_in_host;
    });
    return last == running_.rend() ? std::nullopt : std::optional<std::uint32_t>(*last);
  };
  const auto anywhere = [](const Request&) { return true; };
  if (dispatch_) {
    // Each GPU's KV is its own (a prefill engine's handed-off requests' too); host memory is the
    // node's.
    for (std::uint32_t gpu = 0; gpu < dispatch_->gpus(); ++gpu) {
      if (dispatch_->exceeds(hbm_by_gpu[gpu], plan_.kv_capacity_bytes) &&
          dispatch_->holding(gpu) > 1) {
        const auto victim =
            last_preemptible([gpu](const Request& request) { return request.gpu == gpu; });
        if (victim) {
          return victim;
        }
      }
    }
    return running_.size() > 1 && need.host > plan_.host_kv_capacity_bytes
               ? last_preemptible(anywhere)
               : std::nullopt;
  }
  // A prefill engine's requests handed off hold memory too: beside them, one request alone may
  // not fit, and waits for their release.
  if ((running_.size() > 1 || !handed_off_.empty()) &&
      (need.hbm > plan_.kv_capacity_bytes || need.host > plan_.host_kv_capacity_bytes)) {
    return last_preemptible(anywhere);
  }
  return std::nullopt;
}

void ServingEngine::admit_on_demand(std::uint64_t budget, hw::BatchShape& batch) {
  // As vLLM's scheduler: while the iteration's KV does not fit, the request admitted last is
  // preempted. A request alone always fits: its whole life does, and so does its longest
  // recompute (both checked at construction).
  // With dispatch, a GPU that preempts admits nothing this iteration, the others go on.
  if (dispatch_) {
    dispatch_->start_admission();
  }
  std::vector<double> need_by_gpu;
  Footprint need = planned_footprint(&need_by_gpu);
  bool preempted = false;
  for (auto victim = preemption_victim(need, need_by_gpu); victim;
       victim = preemption_victim(need, need_by_gpu)) {
    const std::uint32_t gpu = requests_[*victim].gpu;
    preempt(*victim);
    if (dispatch_) {
      dispatch_->hold(gpu);
    } else {
      preempted = true;
    }
    budget = plan_running(batch);
    need = planned_footprint(&need_by_gpu);
  }
  const double hbm_room = plan_.kv_capacity_bytes * (1.0 - *on_demand_watermark_);
  AdmissionPass pass;
  for (auto next = preempted ? std::nullopt : next_waiting(pass, budget); next;
       next = next_waiting(pass, budget)) {
    const std::uint32_t id = *next;
    Request& head = requests_[id];
    // With prefix caching its prefill starts after the cached blocks it takes; those it takes
    // out of the free memory count with its first chunk.
    const PrefixHits hits = prefix_hits(id);
    Footprint first_chunk;
    if (head.remote) {
      // Its prompt's KV arrives whole, less the cached blocks it shares.
      first_chunk = footprint(id, 0);
      first_chunk.hbm -= static_cast<double>(hits.shared()) * plan_.block_bytes();
    } else if (hits.blocks > 0) {
      const std::uint64_t start = hits.blocks * plan_.block_tokens;
      first_chunk.hbm = plan_.kv_bytes_for(start + std::min({budget, chunk_room(head),
                                                             head.prefill_target - start})) -
                        static_cast<double>(hits.shared()) * plan_.block_bytes();
    } else {
      first_chunk =
          footprint(id, std::min({budget, chunk_room(head), head.prefill_target - head.prefilled}));
    }
    // Alone (on its GPU), a request always fits (its whole life does); the watermark does not
    // hold it back.
    const bool alone =
        dispatch_ ? dispatch_->holding(head.gpu) == 0 : running_.empty() && handed_off_.empty();
    const bool hbm_short =
        !alone && (dispatch_ ? dispatch_->exceeds(need_by_gpu[head.gpu] + first_chunk.hbm, hbm_room)
                             : need.hbm + first_chunk.hbm > hbm_room);
    const bool host_short = need.host + first_chunk.host > plan_.host_kv_capacity_bytes;
    if (hbm_short || host_short) {
      if (hold_back(pass, head, hbm_short, host_short)) {
        continue;
      }
      break;
    }
    take_from_queue(pass);
    if (dispatch_) {
      need_by_gpu[head.gpu] += first_chunk.hbm;
    }
    need.hbm += first_chunk.hbm;
    need.host += first_chunk.host;
    take_prefix_hits(id, hits);
    admit(id, budget, batch);
  }
  end_pass(pass);
  // What this iteration holds at its end: the running requests' KV as planned.
  kv_reserved_bytes_ = need.hbm;
  host_reserved_bytes_ = need.host;
}

}  // namespace kvtier::serving
