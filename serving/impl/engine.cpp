#include "serving/engine.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "hwmodels/model_shape.hpp"

namespace kvtier::serving {
namespace {

// Below the time-series sampler (kLastPriority), above everything else.
constexpr sim::Priority kStartPriority = sim::kLastPriority - 1;
// Samples a time series may hold: an interval far below the run's length would otherwise sample
// without end (a 1 ps interval over seconds of serving).
constexpr std::size_t kMaxSeriesSamples = 1'000'000;

hw::GroupLinks group_links(const config::RunSpec& run) {
  const auto& hardware = run.hardware();
  const auto& node = hardware.node();
  return {node.has_gpu_link() ? &node.gpu_link() : nullptr,
          hardware.has_network() ? &hardware.network() : nullptr, node.gpus_per_node()};
}

}  // namespace

ServingEngine::ServingEngine(sim::Simulator& simulator, const config::RunSpec& run,
                             Workload workload, const TierDemand* tiers, EngineRole role)
    : simulator_(simulator),
      run_(run),
      workload_(std::move(workload)),
      plan_(plan_memory(run)),
      cost_model_(run.model(), run.hardware().node().gpu(), group_links(run), parallelism(run),
                  run.workload().prefill_chunk_tokens()),
      // With pipeline stages each micro-batch has the budget (vLLM V1 schedules each batch in
      // flight as any other), a request's chunk at most one of them.
      prefill_budget_(std::uint64_t{run.workload().prefill_chunk_tokens()} * pipeline_stages(run)),
      chunk_cap_(attention_split(run) == hw::AttentionSplit::kRequests
                     ? std::max<std::uint64_t>(prefill_budget_ / run.tensor_parallel_degree(), 1)
                     : run.workload().prefill_chunk_tokens()),
      max_batch_(run.workload().max_batch_size()),
      iteration_overhead_(
          sim::from_microseconds(run.engine().iteration_overhead_us(), sim::Rounding::kUp)),
      on_demand_watermark_(
          run.workload().has_on_demand_admission()
              ? std::optional<double>(run.workload().on_demand_admission().watermark())
              : std::nullopt),
      tiers_(tiers),
      layers_per_gpu_(layers_per_gpu(run)),
      kv_layers_per_gpu_(layers_per_gpu_ + drafter_layers(run)),
      role_(role),
      kv_used_(simulator),
      kv_reserved_(simulator),
      running_gauge_(simulator),
      full_kv_(simulator),
      host_used_(simulator),
      host_reserved_(simulator),
      swap_used_(simulator) {
  if (tiers_ != nullptr && pipeline_stages(run) > 1 && run.tiering().has_host_recode()) {
    // Checked with the config (configs/impl/parallelism_checks.cpp); a run built in code is held to
    // it here.
    throw ConfigError(
        "host recodes (tiering.host_recode) are not modelled with pipeline parallelism",
        "field tiering.host_recode");
  }
  if (role_ == EngineRole::kPrefill && tiers_ != nullptr) {
    throw std::logic_error(
        "a prefill engine holds its requests' KV whole until it hands them off: it takes no "
        "tier policy (the cluster gives the decode engines the policy)");
  }
  if (run.engine().has_speculative() && role_ != EngineRole::kPrefill) {
    start_speculating(run);
  }
  if (run.workload().on_demand_admission().has_swap()) {
    // Checked with the config (configs/impl/parallelism_checks.cpp); a run built in code is held to
    // it here, since a swap copy is a block.
    if (plan_.block_tokens == 0) {
      throw ConfigError("preemption by swapping copies whole KV blocks: set memory.kv_block_tokens",
                        "field memory.kv_block_tokens");
    }
    swapping_ = true;
    swap_rates_ = measure_swap_rates(run);
  }
  if (run.memory().prefix_caching()) {
    // Checked with the config (configs/impl/consistency.cpp) but for the policy, which only the
    // simulation knows; a run built in code is held to all of it here.
    const auto refuse = [](const std::string& why) {
      throw ConfigError("prefix caching (memory.prefix_caching) " + why,
                        "field memory.prefix_caching");
    };
    if (plan_.block_tokens == 0) {
      refuse("caches whole KV blocks: set memory.kv_block_tokens");
    }
    if (tiers_ != nullptr) {
      refuse("is modelled with the full cache only, not with policy '" + run.policy().name() +
             "' (simulate policy full alone: --policy full)");
    }
    if (swapping_) {
      refuse("is not modelled with preemption by swapping (workload.on_demand_admission.swap)");
    }
    if (plan_.window_tokens > 0) {
      refuse("is not modelled with a sliding window (model.sliding_window)");
    }
    prefix_cache_.emplace();
    capacity_blocks_ =
        static_cast<std::uint64_t>(std::llround(plan_.kv_capacity_bytes / plan_.block_bytes()));
    if (plan_.prefix_host_bytes > 0.0) {
      prefix_host_.emplace(
          static_cast<std::uint64_t>(std::llround(plan_.prefix_host_bytes / plan_.block_bytes())));
      prefix_copy_rates_ = measure_swap_rates(run);
    }
    if (run.memory().has_prefix_cache_host_chunk_tokens()) {
      const std::uint32_t chunk = run.memory().prefix_cache_host_chunk_tokens();
      if (!prefix_host_) {
        throw ConfigError(
            "chunks of the prefix cache's host tier need memory.prefix_cache_host_gib",
            "field memory.prefix_cache_host_chunk_tokens");
      }
      if (chunk % plan_.block_tokens != 0) {
        throw ConfigError("prefix_cache_host_chunk_tokens " + std::to_string(chunk) +
                              " is not a whole number of kv_block_tokens " +
                              std::to_string(plan_.block_tokens) + " blocks",
                          "field memory.prefix_cache_host_chunk_tokens");
      }
      prefix_chunk_blocks_ = chunk / plan_.block_tokens;
    }
  } else if (run.memory().has_prefix_cache_host_gib()) {
    throw ConfigError("the prefix cache's host tier needs memory.prefix_caching: true",
                      "field memory.prefix_cache_host_gib");
  }
  if (tiers_ != nullptr) {
    start_tiering(run);
  }
  // After swapping and prefix caching are set up: it refuses both.
  if (run.engine().data_parallel_dispatch() != config::ROUTING_UNSPECIFIED) {
    start_dispatching(run);
  }
  const auto max_positions = run.model().max_position_embeddings();
  for (size_t i = 0; i < workload_.requests.size(); ++i) {
    const RequestSpec& spec = workload_.requests[i];
    const std::uint64_t tokens = spec.prompt_tokens + spec.output_tokens;
    if (tokens > max_positions) {
      throw ConfigError(describe_request(workload_, i) + " has " + std::to_string(tokens) +
                        " tokens, more than " + run.model().name() + "'s " +
                        std::to_string(max_positions) + " positions");
    }
    requests_.push_back(Request{spec, {}, {}, {}, 0, 0, 0.0, 0.0});
    requests_.back().prefill_target = spec.prompt_tokens;
    const auto id = static_cast<std::uint32_t>(i);
    // With data-parallel attention a request's KV is all on the GPU that attends it.
    const double own_gpu = hbm_reservation(id) * plan_.requests_spread;
    if (own_gpu > plan_.kv_capacity_bytes) {
      throw DoesNotFit(DoesNotFit::Memory::kHbm,
                       describe_request(workload_, i) + " (" + std::to_string(tokens) +
                           " tokens) needs " + format_fixed(own_gpu / (1 << 30), 2) +
                           " GiB of KV per GPU, but only " +
                           format_fixed(plan_.kv_capacity_bytes / (1 << 30), 2) +
                           " GiB are left after " + plan_.breakdown());
    }
    // A preempted request's recompute holds every token it prefills whole in HBM, however a
    // tier policy would place them: the longest (prompt + output − 1) must fit alone.
    const double recompute = plan_.peak_kv_bytes_for(tokens - 1) * plan_.requests_spread;
    if (on_demand_watermark_ && tiers_ != nullptr && recompute > plan_.kv_capacity_bytes) {
      throw DoesNotFit(DoesNotFit::Memory::kHbm,
                       describe_request(workload_, i) + " (" + std::to_string(tokens) +
                           " tokens) needs " + format_fixed(recompute / (1 << 30), 2) +
                           " GiB of KV per GPU when a preemption recomputes it whole in HBM "
                           "(workload.on_demand_admission), but only " +
                           format_fixed(plan_.kv_capacity_bytes / (1 << 30), 2) +
                           " GiB are left after " + plan_.breakdown());
    }
    const double own_host = host_reservation(id) * plan_.requests_spread;
    if (own_host > plan_.host_kv_capacity_bytes) {
      throw DoesNotFit(
          DoesNotFit::Memory::kHost,
          describe_request(workload_, i) + " needs " + format_fixed(own_host / (1 << 30), 2) +
              " GiB of host memory for its " +
              (!receives_into_host_  ? "T1/T2 KV"
               : receives_kept_only_ ? "prompt's kept tokens received there (or its T1/T2 KV)"
                                     : "prompt received there (or its T1/T2 KV)") +
              ", but each GPU's share of the node's DDR leaves " +
              format_fixed(plan_.host_kv_capacity_bytes / (1 << 30), 2) + " GiB" +
              (plan_.swap_space_bytes > 0.0
                   ? " beside " + format_fixed(plan_.swap_space_bytes / (1 << 30), 2) +
                         " GiB of swap space (workload.on_demand_admission.swap)"
                   : std::string()));
    }
  }
  if (run.has_outputs() && run.outputs().has_timeseries_interval_us()) {
    const double interval_us = run.outputs().timeseries_interval_us();
    const sim::Tick interval = sim::from_microseconds(interval_us, sim::Rounding::kUp);
    kv_series_ = std::make_unique<sim::TimeSeries>(simulator_, interval, [this, interval_us] {
      if (kv_series_->values().size() == kMaxSeriesSamples) {
        throw ConfigError("outputs.timeseries_interval_us " + format_double(interval_us) +
                              " takes more than " + std::to_string(kMaxSeriesSamples) +
                              " samples of this run: choose a longer interval",
                          "field outputs.timeseries_interval_us");
      }
      return kv_in_use();
    });
    running_series_ = std::make_unique<sim::TimeSeries>(
        simulator_, interval, [this] { return static_cast<double>(running_.size()); });
    waiting_series_ = std::make_unique<sim::TimeSeries>(
        simulator_, interval, [this] { return static_cast<double>(waiting_.size()); });
    host_series_ = std::make_unique<sim::TimeSeries>(simulator_, interval,
                                                     [this] { return host_kv_in_use(); });
  }
}

void ServingEngine::start() {
  if (role_ != EngineRole::kPrefillAndDecode) {
    throw std::logic_error("a prefill or decode engine serves in a cluster only");
  }
  own_arrivals_.emplace(simulator_, workload_,
                        [this](std::uint32_t id) { arrive(id, simulator_.now()); });
  EngineHooks hooks;
  hooks.completed = [this](std::uint32_t) { own_arrivals_->completed(); };
  start_serving(std::move(hooks));
  own_arrivals_->start();
}

void ServingEngine::start_serving(EngineHooks hooks) {
  if (kv_series_) {
    kv_series_->start();
    running_series_->start();
    waiting_series_->start();
    host_series_->start();
  }
  hooks_ = std::move(hooks);
}

void ServingEngine::submit(std::uint32_t request) {
  if (request >= requests_.size() || requests_[request].arrived || role_ == EngineRole::kDecode) {
    throw std::logic_error("request " + std::to_string(request) +
                           " submitted to a serving engine twice, out of its workload or to a "
                           "decode engine");
  }
  arrive(request, simulator_.now());
}

void ServingEngine::submit_prefilled(std::uint32_t request, sim::Tick arrival,
                                     sim::Tick first_token) {
  if (request >= requests_.size() || requests_[request].arrived || role_ != EngineRole::kDecode) {
    throw std::logic_error("request " + std::to_string(request) +
                           " submitted prefilled twice, out of its workload or to an engine "
                           "that is not a decode engine");
  }
  Request& prefilled = requests_[request];
  prefilled.prefilled = prefilled.prefill_target;
  prefilled.generated = 1;
  prefilled.first_decode = 1;
  prefilled.first_token = first_token;
  prefilled.admitted_once = true;  // its queue wait was its prefill engine's
  prefilled.remote = true;
  prefilled.whole_in_hbm = !receives_into_host_;
  prefilled.whole_in_host = receives_into_host_;
  if (receives_into_host_) {
    // Held from its admission: the tiered layers' KV of the prompt in host memory, the untiered
    // (a drafter's, hybrid attention's windowed layers') in HBM.
    prefilled.tier_host = received_host_bytes(request);
    prefilled.tier_hbm = plan_.untiered_kv_bytes_for(prefilled.spec.prompt_tokens);
  }
  arrive(request, arrival);
}

void ServingEngine::release(std::uint32_t request) {
  const auto held = std::find(handed_off_.begin(), handed_off_.end(), request);
  if (held == handed_off_.end()) {
    throw std::logic_error("request " + std::to_string(request) +
                           " released by an engine that does not hold it");
  }
  handed_off_.erase(held);
  kv_reserved_bytes_ -= requests_[request].kv_reserved;
  if (dispatch_) {
    const Request& left = requests_[request];
    dispatch_->released(left.gpu);
    dispatch_->release(left.gpu, left.kv_reserved);
    dispatch_->completed(left.gpu);
  }
  if (prefix_cache_) {
    release_cached_blocks(request);
  }
  record_kv_used();
  full_kv_.set(full_kv_in_use());
  wake();  // what waited for its memory may be admitted
}

void ServingEngine::kv_received(std::uint32_t request) {
  Request& received = requests_[request];
  if (!received.receiving) {
    throw std::logic_error("KV of request " + std::to_string(request) +
                           " received by an engine that did not want it");
  }
  received.receiving = false;
  wake();
}

std::uint64_t ServingEngine::active_blocks() const {
  if (plan_.block_tokens == 0) {
    return 0;
  }
  std::uint64_t blocks = 0;
  const auto add = [&](std::uint32_t id) {
    const Request& request = requests_[id];
    const std::uint64_t tokens = request.spec.prompt_tokens + request.generated;
    blocks += (tokens + plan_.block_tokens - 1) / plan_.block_tokens;
  };
  std::for_each(running_.begin(), running_.end(), add);
  std::for_each(waiting_.begin(), waiting_.end(), add);
  return blocks;
}

void ServingEngine::arrive(std::uint32_t request, sim::Tick arrival) {
  requests_[request].arrival = arrival;
  requests_[request].arrived = true;
  if (dispatch_) {
    requests_[request].gpu = dispatch_->dispatch();
  }
  waiting_.push_back(request);
  totals_.max_waiting = std::max<std::uint64_t>(totals_.max_waiting, waiting_.size());
  wake();
}

void ServingEngine::wake() {
  if (!iteration_in_flight_ && !start_pending_) {
    // Start after every other event of this picosecond, so that simultaneous arrivals are
    // batched together rather than the first one running alone.
    start_pending_ = true;
    simulator_.schedule_at(
        simulator_.now(),
        [this] {
          start_pending_ = false;
          if (!iteration_in_flight_) {
            try_start_iteration();
          }
        },
        kStartPriority);
  }
}

double ServingEngine::hbm_reservation(std::uint32_t request) const {
  const RequestSpec& spec = requests_[request].spec;
  if (tiers_ == nullptr) {
    // Its KV at its last decode step: the prompt and every generated token but the last, whose
    // KV is never written (as a tiered request's last context, tier_demand.cpp). A prefill
    // engine's request ends with its prompt's, held until it leaves.
    const std::uint64_t output = role_ == EngineRole::kPrefill ? 1 : spec.output_tokens;
    return plan_.peak_kv_bytes_for(spec.prompt_tokens + output - 1);
  }
  const RequestPeaks& peaks = tiers_->peaks(request);
  // A decode engine that receives only the kept tokens, or receives into host memory, never
  // holds the prompt whole in HBM.
  const double placed = receives_into_host_ || receives_kept_only_ ? peaks.placed_hbm_token_layers
                                                                   : peaks.hbm_token_layers;
  // A speculating step writes its newest token's and its drafts' KV before the policy steps:
  // that many tokens a layer over a placement's T0, in whole blocks in a paged cache.
  const std::uint64_t drafted = speculative_ ? speculative_->draft_tokens() : 0;
  const double writes =
      drafted > 0 ? in_whole_blocks(static_cast<double>(1 + drafted), plan_.block_tokens) *
                        static_cast<double>(tiered_layers_per_gpu_)
                  : 0.0;
  // A drafter's KV of the whole context, and hybrid attention's windowed layers' window, stay in
  // HBM.
  const double tiered =
      (placed + writes + peaks.staged_tokens * staged_layers_) * bytes_per_token_layer_ +
      plan_.peak_untiered_kv_bytes_for(spec.prompt_tokens + spec.output_tokens - 1);
  // A decode engine's request comes into HBM (whole, or what its policy keeps), where its first
  // step writes one token more (and its drafts) before the placement offloads what it holds off
  // HBM; received into host memory, its first step loads what the policy reads into HBM from
  // there, within the policy's peaks.
  return role_ == EngineRole::kDecode && !receives_into_host_
             ? std::max(tiered, received_kv_bytes(request, 1 + drafted))
             : tiered;
}

double ServingEngine::host_reservation(std::uint32_t request) const {
  if (tiers_ == nullptr) {
    return 0.0;
  }
  const RequestPeaks& peaks = tiers_->peaks(request);
  const double tiered = host_bytes(peaks.host_token_layers, peaks.compressed_token_layers);
  // Received into host memory, its prompt (or what its policy keeps of it) is there until its
  // first step has placed it.
  return receives_into_host_ ? std::max(tiered, received_host_bytes(request)) : tiered;
}

double ServingEngine::kv_in_use() const {
  if (tiers_ == nullptr) {
    return full_kv_in_use();
  }
  // Placed requests as their tiers place them, over the running set of now (finished requests
  // gone, prompts placed this iteration in); prompts being prefilled whole in HBM.
  double bytes = tier_staging_bytes_;
  for (const std::uint32_t id : running_) {
    bytes += hbm_kv_bytes(id);
  }
  return bytes;
}

void ServingEngine::record_kv_used() {
  kv_used_.set(kv_in_use());
  if (!dispatch_) {
    return;
  }
  // Each GPU's requests as kv_in_use() counts them, its own staging buffer; on the GPU, a
  // request's latents are whole (the mean GPU holds 1/TP of them).
  std::vector<double> by_gpu = staging_by_gpu_;
  by_gpu.resize(dispatch_->gpus(), 0.0);
  // A prefill engine's handed-off requests hold their prompts' KV on their GPUs until released.
  for (const auto* held : {&running_, &handed_off_}) {
    for (const std::uint32_t id : *held) {
      by_gpu[requests_[id].gpu] += hbm_kv_bytes(id);
    }
  }
  const double busiest = *std::max_element(by_gpu.begin(), by_gpu.end());
  busiest_gpu_kv_peak_ =
      std::max(busiest_gpu_kv_peak_, busiest * static_cast<double>(dispatch_->gpus()));
}

double ServingEngine::hbm_kv_bytes(std::uint32_t id) const {
  const Request& request = requests_[id];
  if (tiers_ != nullptr && request.whole_in_hbm) {
    // Received, not yet placed.
    return received_kv_bytes(id, cached_tokens(request) - request.spec.prompt_tokens);
  }
  if (prefilling(request) || tiers_ == nullptr) {
    return plan_.kv_bytes_for(cached_tokens(request));
  }
  return request.tier_hbm;
}

double ServingEngine::host_kv_in_use() const {
  double bytes = 0.0;
  for (const std::uint32_t id : running_) {
    bytes += requests_[id].tier_host;
  }
  return bytes;
}

double ServingEngine::full_kv_in_use() const {
  double bytes = 0.0;
  for (const auto* held : {&running_, &handed_off_}) {
    for (const std::uint32_t id : *held) {
      const Request& request = requests_[id];
      // The tokens the tiered count holds after the same step; cached blocks held once however
      // many requests hold them.
      bytes += plan_.kv_bytes_for(cached_tokens(request)) - cached_blocks_held(request);
    }
  }
  return bytes + cached_blocks_in_use();
}

std::uint64_t ServingEngine::plan_running(hw::BatchShape& batch) {
  decoding_now_.clear();
  prefilling_now_.clear();
  batch = hw::BatchShape{};
  prepare_gpu_decodes(batch);
  if (dispatch_) {
    dispatch_->plan_iteration();
  }
  std::uint64_t budget = prefill_budget_;
  for (const std::uint32_t id : running_) {
    const Request& request = requests_[id];
    if (!prefilling(request) && !request.receiving) {
      decoding_now_.push_back(id);
      add_decode_context(request, 0, batch);
      add_drafts(request, drafts(request), batch);
    }
  }
  batch.decode_tokens = decoding_now_.size();
  // Verified drafts take the token budget as the newest tokens do (vLLM's scheduler).
  budget -= std::min<std::uint64_t>(budget, batch.decode_tokens + batch.decode_draft_tokens);
  if (cost_model_.stages() > 1) {
    // Each micro-batch's budget holds its share of the decodes (dealt as the cost model deals
    // them) and the chunks that fill it, one micro-batch after another.
    const std::uint32_t stages = cost_model_.stages();
    const std::uint64_t per_micro_batch = run_.workload().prefill_chunk_tokens();
    micro_room_.assign(stages, 0);
    for (std::uint32_t m = 0; m < stages; ++m) {
      const std::uint64_t decodes = hw::micro_batch_decodes(batch.decode_tokens, stages, m);
      micro_room_[m] = per_micro_batch > decodes ? per_micro_batch - decodes : 0;
    }
  }
  for (const std::uint32_t id : running_) {
    // A request whose KV is still crossing the kv_link has its prompt already.
    if (budget > 0 && prefilling(requests_[id]) && !requests_[id].receiving) {
      add_chunk(id, budget, batch);
    }
  }
  return budget;
}

void ServingEngine::add_chunk(std::uint32_t id, std::uint64_t& budget, hw::BatchShape& batch) {
  const Request& request = requests_[id];
  std::uint64_t tokens =
      std::min({budget, chunk_room(request), request.prefill_target - request.prefilled});
  if (dispatch_) {
    if (tokens == 0) {
      return;  // its GPU's prefill budget is spent
    }
    dispatch_->take_prefill(request.gpu, tokens);
  }
  std::uint32_t micro_batch = 0;
  if (!micro_room_.empty()) {
    // Within the first micro-batch with room (a request is in one micro-batch of a round).
    const auto room = std::find_if(micro_room_.begin(), micro_room_.end(),
                                   [](std::uint64_t left) { return left > 0; });
    tokens = room == micro_room_.end() ? 0 : std::min(tokens, *room);
    if (tokens == 0) {
      return;
    }
    *room -= tokens;
    micro_batch = static_cast<std::uint32_t>(room - micro_room_.begin());
  }
  budget -= tokens;
  prefilling_now_.push_back(PlannedChunk{id, tokens, micro_batch});
  batch.prefill.push_back(hw::PrefillChunk{tokens, request.prefilled,
                                           micro_room_.empty() ? hw::kAnyMicroBatch : micro_batch,
                                           dispatch_ ? request.gpu : hw::kAnyGpu});
  if (request.prefilled + tokens == request.prefill_target) {
    ++batch.logits_tokens;
  }
}

void ServingEngine::try_start_iteration() {
  hw::BatchShape batch;
  const std::uint64_t budget = plan_running(batch);
  if (on_demand_watermark_) {
    admit_on_demand(budget, batch);
  } else {
    admit_reserving(budget, batch);
  }
  batch.logits_tokens += batch.decode_tokens + batch.decode_draft_tokens;
  if (prefix_cache_) {
    evict_prefix_cache();
  }
  kv_reserved_.set(kv_reserved_bytes_);
  host_reserved_.set(host_reserved_bytes_);
  running_gauge_.set(static_cast<double>(running_.size()));
  totals_.max_running = std::max<std::uint64_t>(totals_.max_running, running_.size());
  if (decoding_now_.empty() && prefilling_now_.empty()) {
    iteration_in_flight_ = false;
    // A decode engine may have admitted requests whose KV is on its way: their blocks (or, in
    // host memory, their prompts) are taken now, though no iteration runs to count them.
    record_kv_used();
    full_kv_.set(full_kv_in_use());
    host_used_.set(host_kv_in_use());
    if (prefix_host_) {
      (void)time_prefix_copies(sim::Tick::zero());
    }
    return;
  }
  hw::IterationCost cost;
  sim::Tick duration;
  if (tiers_ != nullptr) {
    plan_tier_traffic(batch);
    duration = time_tier_copies(batch, cost);
  } else {
    cost = cost_model_.cost(batch);
    if (speculative_) {
      cost.total += draft_passes(cost);
    }
    duration = cost.total;
  }
  duration += time_swaps();
  if (prefix_host_) {
    duration = time_prefix_copies(duration);
  }
  const sim::Tick host_wait = time_host_recodes(duration);
  sim::Tick overhead = iteration_overhead_;
  if (cost_model_.stages() > 1) {
    // The engine schedules each micro-batch in turn on the host: a round lasts at least all of
    // their overheads, the GPUs' work beside them.
    const sim::Tick scheduling = iteration_overhead_ * std::int64_t{cost.micro_batches};
    overhead = std::max(overhead, scheduling - duration);
  }
  iteration_in_flight_ = true;
  iteration_started_ = simulator_.now();
  totals_.flops += cost.flops;
  totals_.hbm_bytes += cost.hbm_bytes;
  totals_.interconnect_bytes += cost.interconnect_bytes;
  totals_.network_bytes += cost.network_bytes;
  totals_.busy += duration;
  const sim::Tick end = simulator_.now() + duration + overhead + host_wait;
  simulator_.schedule_at(end, [this] { finish_iteration(); });
  if (hooks_.prefill_ending) {
    // After its end is scheduled, so that what the hook schedules for that time runs after it.
    for (const PlannedChunk& chunk : prefilling_now_) {
      const Request& request = requests_[chunk.request];
      if (request.prefilled + chunk.tokens == request.prefill_target &&
          request.generated + 1 < request.spec.output_tokens) {
        hooks_.prefill_ending(chunk.request, request.arrival, end, chunk.tokens);
      }
    }
  }
}

sim::Tick ServingEngine::time_swaps() {
  const sim::Tick out = swap_time(swap_out_bytes_now_, swap_out_copies_now_,
                                  swap_rates_.d2h_bytes_per_s, swap_rates_.d2h_setup);
  const sim::Tick in = swap_time(swap_in_bytes_now_, swap_in_copies_now_,
                                 swap_rates_.h2d_bytes_per_s, swap_rates_.h2d_setup);
  totals_.swap_out_bytes += swap_out_bytes_now_;
  totals_.swap_in_bytes += swap_in_bytes_now_;
  totals_.swap_busy += out + in;
  totals_.d2h_bytes += swap_out_bytes_now_;
  totals_.h2d_bytes += swap_in_bytes_now_;
  totals_.d2h_busy += out;
  totals_.h2d_busy += in;
  totals_.copy_wait += out + in;
  swap_out_bytes_now_ = swap_in_bytes_now_ = 0.0;
  swap_out_copies_now_ = swap_in_copies_now_ = 0;
  return out + in;
}

void ServingEngine::finish_iteration() {
  const sim::Tick now = simulator_.now();
  iteration_time_.record(now - iteration_started_);
  ++totals_.iterations;
  std::vector<std::uint32_t> finished;
  for (const std::uint32_t id : decoding_now_) {
    Request& request = requests_[id];
    const std::uint64_t tokens = step_tokens(id, request);
    request.last_step_tokens = tokens;
    if (speculative_) {
      ++totals_.speculative_steps;
      totals_.speculative_tokens += tokens;
    }
    request.generated += tokens;
    if (request.generated == request.spec.output_tokens) {
      finished.push_back(id);
    }
  }
  std::vector<std::uint32_t> handed;
  for (const PlannedChunk& chunk : prefilling_now_) {
    Request& request = requests_[chunk.request];
    request.prefilled += chunk.tokens;
    if (request.prefilled == request.prefill_target) {
      // The prefill's last position gives the next token: the first, or after a preemption the
      // one the next decode step would have given.
      if (request.generated == 0) {
        request.first_token = now;
        ttft_.record(now - request.arrival);
      }
      ++request.generated;
      request.first_decode = request.generated;
      if (request.generated == request.spec.output_tokens) {
        finished.push_back(chunk.request);
      } else if (role_ == EngineRole::kPrefill) {
        handed.push_back(chunk.request);
      }
    }
  }
  if (prefix_cache_) {
    for (const std::uint32_t id : decoding_now_) {
      cache_filled_blocks(id);
    }
    for (const PlannedChunk& chunk : prefilling_now_) {
      cache_filled_blocks(chunk.request);
    }
  }
  std::sort(finished.begin(), finished.end());
  for (const std::uint32_t id : finished) {
    complete(id);
  }
  std::sort(handed.begin(), handed.end());
  for (const std::uint32_t id : handed) {
    hand_off(id);
  }
  record_kv_used();
  full_kv_.set(full_kv_in_use());
  host_used_.set(host_kv_in_use());
  try_start_iteration();
}

void ServingEngine::complete(std::uint32_t id) {
  Request& request = requests_[id];
  const sim::Tick now = simulator_.now();
  if (request.spec.output_tokens > 1) {
    tpot_.record((now - request.first_token) /
                 static_cast<std::int64_t>(request.spec.output_tokens - 1));
  }
  e2e_.record(now - request.arrival);
  kv_reserved_bytes_ -= request.kv_reserved;
  host_reserved_bytes_ -= request.host_reserved;
  if (dispatch_) {
    dispatch_->stopped_running(request.gpu);
    dispatch_->release(request.gpu, request.kv_reserved);
    dispatch_->completed(request.gpu);
  }
  if (prefix_cache_) {
    release_cached_blocks(id);
  }
  running_.erase(std::find(running_.begin(), running_.end(), id));
  ++totals_.requests_completed;
  // A decode engine computed neither the prompt nor the first token (its prefill engine did),
  // unless it recomputed them after a preemption.
  const bool prefilled_elsewhere = role_ == EngineRole::kDecode;
  totals_.prompt_tokens += prefilled_elsewhere ? 0 : request.spec.prompt_tokens;
  totals_.output_tokens += request.spec.output_tokens - (prefilled_elsewhere ? 1 : 0);
  totals_.last_completion = now;
  hooks_.completed(id);
}

void ServingEngine::hand_off(std::uint32_t id) {
  const Request& request = requests_[id];
  running_.erase(std::find(running_.begin(), running_.end(), id));
  handed_off_.push_back(id);
  if (dispatch_) {
    dispatch_->handed_off(request.gpu);
  }
  ++totals_.requests_handed_off;
  totals_.prompt_tokens += request.spec.prompt_tokens;
  ++totals_.output_tokens;
  totals_.last_completion = simulator_.now();
  hooks_.prefilled(id, request.arrival);
}

}  // namespace kvtier::serving
