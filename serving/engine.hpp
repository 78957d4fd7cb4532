#pragma once
// A continuously batched serving engine (one tensor-parallel group) on the discrete-event
// simulator, with the whole KV cache in HBM: the baseline every tier policy is compared with.
//
// Each iteration batches one token for every decoding request plus prompt chunks, up to the
// prefill token budget (chunked prefill: decodes first, then unfinished prompts, then new
// requests in arrival order). A request is admitted when the batch has room and its whole KV
// (prompt + output, window-capped) fits next to the weights, workspace and reserve; admission
// is first come, first served, without preemption. With workload.on_demand_admission (vLLM's
// scheduler) a request is admitted when its first chunk's KV fits now, leaving the watermark
// free; an iteration whose KV would not fit preempts the request admitted last, whose KV is
// dropped and recomputed by a prefill of its prompt and generated tokens when it is admitted
// again, or with swapping (on_demand_admission.swap) copied to the host's swap space and back
// when it is admitted again, where it resumes (recomputed when the swap space has no room for
// it). No request is admitted in an iteration that preempts. The iteration's duration comes
// from the per-layer cost model (hwmodels/iteration_cost.hpp) plus the engine's host overhead
// per iteration; the first output token is produced by the iteration that processes the last
// prompt chunk.
//
// With a tier policy (a TierDemand), each decoding request's tokens follow the policy's replay,
// step by step as the live cache runs it: the prefill that completes a prompt offloads what the
// policy's start placement holds off HBM; each decode step's attention reads the tokens not
// evicted of the placement in force before its policy step, the T1/T2 tokens of every layer are
// prefetched, and the step's moves (promotions, offloads) follow, timed as tier_timing.hpp
// describes; admission reserves the request's peak T0 KV plus its staging share in HBM and its
// peak T1 + T2 in host memory. The policy places the tiered layers' tokens (tiered_layers: with
// hybrid attention the global layers; the windowed layers keep their window in HBM, as a
// drafter keeps its KV). The step's T1 <-> T2 recodes take the host's threads
// (tiering.host_recode): after the iteration, before the next one (STEP_PATH), or beside the
// next iteration, the one after it waiting for them (OVERLAPPED).
//
// With memory.prefix_caching (the full cache only), full KV blocks are cached by content
// (prefix_cache.hpp): a request starting a prefill takes the cached blocks its context starts
// with and prefills from there; the blocks that fill are cached as it goes; blocks no running
// request holds stay in the KV memory left free, evicted least recently released first as
// running requests need it. A block held by several requests counts once in what they use and
// reserve.
//
// In a disaggregated cluster (cluster.disaggregation) an engine only prefills or only decodes. A
// prefill engine's request leaves its batch when its prefill gives the first token, its KV held
// (and reserved) until release(); a decode engine's request comes prefilled (submit_prefilled),
// is admitted as a decoding one whose blocks wait for its KV (kv_received) before its first
// decode step, and is served to its end there (a preemption recomputes it on that engine).
// With a tier policy (decode engines only) its KV lands whole in HBM; its first decode step
// reads it there and then offloads what the policy's placement after the step holds off HBM.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/pipeline_cost.hpp"
#include "serving/arrivals.hpp"
#include "serving/data_parallel_dispatch.hpp"
#include "serving/does_not_fit.hpp"
#include "serving/memory_plan.hpp"
#include "serving/prefix_cache.hpp"
#include "serving/tier_demand.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "sim/stats.hpp"
#include "sim/time_series.hpp"

namespace kvtier::serving {

// Speculative decoding: the chance that a step's `draft`-th draft (from 0) is accepted given
// those before it were (engine.speculative's acceptance_by_position, or acceptance_rate with
// its decay).
[[nodiscard]] double draft_acceptance(const config::SpeculativeDecoding& speculative,
                                      std::uint32_t draft);

struct ServingTotals {
  std::uint64_t requests_completed = 0;
  // A prefill engine's requests handed to a decode engine after their first token; the prompt
  // and output tokens count each token where it was computed (a prompt and the first token
  // where it was prefilled, the others where they were decoded).
  std::uint64_t requests_handed_off = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t output_tokens = 0;
  std::uint64_t iterations = 0;
  std::uint64_t max_running = 0;
  std::uint64_t max_waiting = 0;
  // Iterations in which the next waiting request was held back because its KV did not fit in
  // HBM, or its host share in host memory (both count when both are short): what tells memory
  // limits apart from scheduling ones (prefill budget, max_batch_size).
  std::uint64_t admissions_held_by_hbm = 0;
  std::uint64_t admissions_held_by_host = 0;
  // On-demand admission: requests preempted; of them those swapped out (the others are
  // recomputed), and the KV tokens the recomputed ones dropped (which their prefills compute
  // again).
  std::uint64_t preemptions = 0;
  std::uint64_t swapped_preemptions = 0;
  std::uint64_t preempted_kv_tokens = 0;
  // Swapping (per GPU): bytes copied out to the swap space and back in, and the time iterations
  // spent on those copies (before their forward passes).
  double swap_out_bytes = 0.0;
  double swap_in_bytes = 0.0;
  sim::Tick swap_busy;
  sim::Tick busy;  // Σ GPU time of iterations (host overhead excluded)
  sim::Tick last_completion;
  double flops = 0.0;               // per GPU
  double hbm_bytes = 0.0;           // per GPU
  double interconnect_bytes = 0.0;  // per GPU, sent within its node
  double network_bytes = 0.0;       // per GPU, sent to other nodes (a group spanning nodes)
  // Per GPU: bytes copied host -> GPU and GPU -> host (a tier policy's prefetches and offloads,
  // and swaps), busy time of each copy engine, time layers waited for their prefetch, and all
  // the time iterations spent on copies beyond their compute: that stall, offloads that outlast
  // the layers (copy engines) or follow them (SM kernels), and swaps.
  double h2d_bytes = 0.0;
  double d2h_bytes = 0.0;
  sim::Tick h2d_busy;
  sim::Tick d2h_busy;
  sim::Tick prefetch_stall;
  sim::Tick copy_wait;
  // The host's T1 <-> T2 recodes: bytes read (per GPU: T1 -> T2 tokens at full precision,
  // T2 -> T1 ones as their compressed bytes), and, when tiering.host_recode costs them, the
  // engine's recode threads' busy time and the time iterations waited for them.
  double host_recode_bytes = 0.0;
  sim::Tick host_recode_busy;
  sim::Tick host_recode_stall;
  // Prefix caching: the tokens of the prefills started (each one's whole target, what it looked
  // up), those of them served from cached blocks, and the cached blocks evicted.
  std::uint64_t prefix_queried_tokens = 0;
  std::uint64_t prefix_hit_tokens = 0;
  std::uint64_t prefix_evicted_blocks = 0;
  // Its host tier (memory.prefix_cache_host_gib): the hit tokens loaded from there, the bytes
  // stored there and loaded back (per GPU; also in h2d_bytes / d2h_bytes), and the time the
  // copies took (busy, also in h2d_busy / d2h_busy) and held iterations up (in copy_wait).
  std::uint64_t prefix_host_hit_tokens = 0;
  double prefix_store_bytes = 0.0;
  double prefix_load_bytes = 0.0;
  sim::Tick prefix_store_busy;
  sim::Tick prefix_load_busy;
  // The copy calls those bytes took, and with chunks the time the GPU spent gathering and
  // scattering them (in copy_wait).
  std::uint64_t prefix_copies = 0;
  sim::Tick prefix_gather_busy;
  // Speculative decoding (engine.speculative): the decode steps of requests, the tokens they
  // gave, and the GPU time the drafter's passes took (in busy).
  std::uint64_t speculative_steps = 0;
  std::uint64_t speculative_tokens = 0;
  sim::Tick draft_busy;
};

// What an engine serves of its requests: every step (alone, or in a cluster without
// disaggregation), or in a disaggregated cluster their prefills or their decodes.
enum class EngineRole { kPrefillAndDecode, kPrefill, kDecode };

// What an engine tells a cluster serving through it.
struct EngineHooks {
  // A request it served to its last token.
  std::function<void(std::uint32_t)> completed;
  // A prefill engine's request gave its first token now (it arrived at `arrival`); its KV is
  // held until release().
  std::function<void(std::uint32_t, sim::Tick arrival)> prefilled;
  // Optional, a prefill engine's: the iteration starting now completes the prefill of a request
  // (it arrived at `arrival`) at `first_token`, when prefilled follows; its last chunk writes
  // `last_tokens` tokens' KV, what came before it already written.
  std::function<void(std::uint32_t, sim::Tick arrival, sim::Tick first_token,
                     std::uint64_t last_tokens)>
      prefill_ending;
  // A decode engine admitted a request submitted prefilled: its KV is wanted (kv_received()).
  std::function<void(std::uint32_t)> kv_wanted;
};

class ServingEngine {
 public:
  // `tiers` (not owned; null for the full cache) must outlive the engine. A prefill engine holds
  // the full cache (std::logic_error otherwise: the cluster gives the policy to decode engines).
  ServingEngine(sim::Simulator& simulator, const config::RunSpec& run, Workload workload,
                const TierDemand* tiers = nullptr, EngineRole role = EngineRole::kPrefillAndDecode);
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  // Serves its workload alone: schedules the arrivals (serving/arrivals.hpp); run the simulator
  // afterwards.
  void start();
  // Serves as one engine of a cluster: a router submits the requests routed to it (ids of its
  // workload, each at most once, when it arrives) and hears what `hooks` tell (those of its
  // role: every one completed, a prefill engine's prefilled, a decode engine's kv_wanted).
  void start_serving(EngineHooks hooks);
  void submit(std::uint32_t request);
  // A decode engine's request, prefilled elsewhere: it arrived at `arrival` and its first token
  // came at `first_token`.
  void submit_prefilled(std::uint32_t request, sim::Tick arrival, sim::Tick first_token);
  // A prefill engine's request whose KV has left: its blocks are free (or cached).
  void release(std::uint32_t request);
  // A decode engine's request whose KV has come: it decodes from the next iteration on.
  void kv_received(std::uint32_t request);
  [[nodiscard]] EngineRole role() const noexcept { return role_; }
  // The run it was built from (a disaggregated cluster's prefill pool's, for a prefill engine).
  [[nodiscard]] const config::RunSpec& run() const noexcept { return run_; }

  // What a router weighs (serving/router.hpp): the requests it holds (running or waiting), the
  // KV blocks of their contexts so far (memory.kv_block_tokens; 0 without it), and the cached
  // blocks (HBM or the host tier) a request's prefill would take here now.
  [[nodiscard]] std::size_t outstanding_requests() const noexcept {
    return running_.size() + waiting_.size();
  }
  [[nodiscard]] std::uint64_t active_blocks() const;
  [[nodiscard]] std::uint64_t cached_prefix_blocks(std::uint32_t request) const {
    return prefix_hits(request).blocks;
  }
  // The blocks of a request's context it holds from the prefix cache: a decode engine's
  // request receiving its KV pulls its prompt's other blocks only.
  [[nodiscard]] std::uint64_t held_cached_blocks(std::uint32_t request) const {
    return requests_[request].cache_held;
  }
  // Whether the engine dispatches its requests to its GPUs (engine.data_parallel_dispatch; a
  // prefill engine whose pool splits attention by heads does not), and the GPU a request that
  // has arrived was dispatched to (0 without it).
  [[nodiscard]] bool dispatches() const noexcept { return dispatch_.has_value(); }
  [[nodiscard]] std::uint32_t dispatched_gpu(std::uint32_t request) const {
    return requests_[request].gpu;
  }

  [[nodiscard]] const ServingTotals& totals() const noexcept { return totals_; }
  [[nodiscard]] const MemoryPlan& memory() const noexcept { return plan_; }
  [[nodiscard]] const Workload& workload() const noexcept { return workload_; }
  [[nodiscard]] const hw::PipelineCostModel& cost_model() const noexcept { return cost_model_; }
  [[nodiscard]] const sim::LatencyDistribution& ttft() const noexcept { return ttft_; }
  [[nodiscard]] const sim::LatencyDistribution& tpot() const noexcept { return tpot_; }
  [[nodiscard]] const sim::LatencyDistribution& e2e() const noexcept { return e2e_; }
  [[nodiscard]] const sim::LatencyDistribution& queue_wait() const noexcept { return queue_wait_; }
  [[nodiscard]] const sim::LatencyDistribution& iteration_time() const noexcept {
    return iteration_time_;
  }
  [[nodiscard]] const sim::TimeWeightedGauge& kv_used() const noexcept { return kv_used_; }
  // With engine.data_parallel_dispatch, the most KV one GPU has held (its own requests' whole
  // latents and its staging buffer, in bytes on that GPU, against MemoryPlan::kv_capacity_bytes);
  // absent without it. kv_used() is the mean GPU's.
  [[nodiscard]] std::optional<double> busiest_gpu_kv_peak() const {
    return dispatch_ ? std::optional<double>(busiest_gpu_kv_peak_) : std::nullopt;
  }
  [[nodiscard]] const sim::TimeWeightedGauge& kv_reserved() const noexcept { return kv_reserved_; }
  [[nodiscard]] const sim::TimeWeightedGauge& running() const noexcept { return running_gauge_; }
  // What the running requests' KV would take with the whole cache in HBM, and the host memory
  // their T1/T2 tokens take (both equal kv_used / zero without a tier policy).
  [[nodiscard]] const sim::TimeWeightedGauge& full_kv() const noexcept { return full_kv_; }
  [[nodiscard]] const sim::TimeWeightedGauge& host_kv_used() const noexcept { return host_used_; }
  [[nodiscard]] const sim::TimeWeightedGauge& host_kv_reserved() const noexcept {
    return host_reserved_;
  }
  // The swap space the swapped-out requests' KV takes (their HBM KV copied there, and with a
  // tier policy their T1/T2; zero without swapping).
  [[nodiscard]] const sim::TimeWeightedGauge& swap_used() const noexcept { return swap_used_; }
  [[nodiscard]] const TierDemand* tiers() const noexcept { return tiers_; }
  [[nodiscard]] const CopyRates& copy_rates() const noexcept { return copy_rates_; }
  // Whether the run times the host's recodes (tiering.host_recode).
  [[nodiscard]] bool host_recode_costed() const noexcept { return recode_timing_.has_value(); }
  // HBM and host bytes admission reserves for a request (HBM includes staging).
  [[nodiscard]] double hbm_reservation(std::uint32_t request) const;
  // A decode engine's: the bytes of a request's prompt KV its busiest GPU receives, `extra`
  // tokens past it in each layer, in whole blocks: the prompt's, or with send_kept_only those
  // its tier policy keeps before the request's first step beside the untiered KV (a drafter's,
  // hybrid attention's windowed layers'), sent whole.
  [[nodiscard]] double received_kv_bytes(std::uint32_t request, std::uint64_t extra = 0) const;
  [[nodiscard]] double host_reservation(std::uint32_t request) const;
  // Sampled series (null unless the run asks for outputs.timeseries_interval_us).
  [[nodiscard]] const sim::TimeSeries* kv_used_series() const noexcept { return kv_series_.get(); }
  [[nodiscard]] const sim::TimeSeries* running_series() const noexcept {
    return running_series_.get();
  }
  [[nodiscard]] const sim::TimeSeries* waiting_series() const noexcept {
    return waiting_series_.get();
  }
  [[nodiscard]] const sim::TimeSeries* host_kv_used_series() const noexcept {
    return host_series_.get();
  }

 private:
  struct Request {
    RequestSpec spec;
    sim::Tick arrival;
    sim::Tick admitted;
    sim::Tick first_token;
    std::uint64_t prefilled = 0;
    std::uint64_t generated = 0;
    double kv_reserved = 0.0;
    double host_reserved = 0.0;
    // With a tier policy, once its prompt is placed: its KV in HBM (T0) and in host memory
    // (T1 + T2) after its latest step.
    double tier_hbm = 0.0;
    double tier_host = 0.0;
    // What its current prefill covers: the prompt, or after a preemption the prompt and the
    // tokens generated before it (whose KV is recomputed).
    std::uint64_t prefill_target = 0;
    // `generated` at its first decode step after its latest prefill (1 unless preempted).
    std::uint64_t first_decode = 1;
    // The tokens its latest decode step gave (more than one with speculative decoding).
    std::uint64_t last_step_tokens = 1;
    bool arrived = false;
    bool admitted_once = false;  // its queue wait ends at its first admission
    // A decode engine's: submitted prefilled, its KV still at its prefill engine (`remote`), or
    // admitted with its KV on the way (`receiving`: in the running set, but not in a batch).
    bool remote = false;
    bool receiving = false;
    // With a tier policy, a decode engine's request whose KV came (or comes) whole over the
    // kv_link into HBM, not yet placed by its first decode step (place_received).
    bool whole_in_hbm = false;
    // Or, received into host memory (cluster.disaggregation.receive_into_host_memory), its
    // tiered layers' KV there whole (the untiered in HBM), not yet placed by its first decode
    // step.
    bool whole_in_host = false;
    // Swapped out: its HBM KV copied to the swap space (its T1/T2, `tier_host`, are there too),
    // and the copies that moved it.
    bool swapped = false;
    double swapped_bytes = 0.0;
    std::uint64_t swap_copies = 0;
    // Prefix caching: its first `cache_held` blocks are cached blocks it holds (taken from the
    // cache or cached as they filled); the rest are its own. `caching` ends at a block whose
    // content another request cached first: that one and those after it stay its own.
    std::uint64_t cache_held = 0;
    bool caching = true;
    // With engine.data_parallel_dispatch, the GPU it was dispatched to on arrival.
    std::uint32_t gpu = 0;
  };
  // The cached blocks a request starting a prefill would take: how many, how many of them are
  // cached in HBM but no running request holds them, and how many come from the host tier
  // (both of which its admission takes out of the free memory).
  struct PrefixHits {
    std::uint64_t blocks = 0;
    std::uint64_t free = 0;
    std::uint64_t loaded = 0;
    // Those running requests hold already: they take no memory more.
    [[nodiscard]] std::uint64_t shared() const { return blocks - free - loaded; }
  };
  // The HBM and host bytes a request holds at the end of this iteration's planned work.
  struct Footprint {
    double hbm = 0.0;
    double host = 0.0;
  };
  struct PlannedChunk {
    std::uint32_t request;
    std::uint64_t tokens;
    std::uint32_t micro_batch = 0;  // with pipeline stages, the one it is in
  };

  void arrive(std::uint32_t request, sim::Tick arrival);
  // Starts an iteration after this picosecond's other events unless one runs or is due.
  void wake();
  // A prefill engine's request whose prefill gave its first token: out of the batch, its KV
  // held (handed_off_) until release().
  void hand_off(std::uint32_t id);
  [[nodiscard]] static bool prefilling(const Request& request) {
    return request.prefilled < request.prefill_target;
  }
  // The tokens whose KV it has written: what it prefilled, or once decoding the prompt and
  // every generated token but the newest (whose KV its next step writes).
  [[nodiscard]] static std::uint64_t cached_tokens(const Request& request) {
    return prefilling(request) ? request.prefilled
                               : request.spec.prompt_tokens + request.generated - 1;
  }
  // Fills decoding_now_ and prefilling_now_ from the running requests and returns the prefill
  // budget left.
  std::uint64_t plan_running(hw::BatchShape& batch);
  void add_chunk(std::uint32_t id, std::uint64_t& budget, hw::BatchShape& batch);
  // Admission with whole-request reservations, or on demand (then preempting first).
  void admit_reserving(std::uint64_t budget, hw::BatchShape& batch);
  // One admission pass over the waiting queue: the place of the request it considers, and
  // whether a request was held back for want of HBM or host memory.
  struct AdmissionPass {
    std::size_t next = 0;
    bool held_by_hbm = false;
    bool held_by_host = false;
  };
  // The request the pass considers next: the head, or with dispatch the first from pass.next on
  // whose GPU is not held back; none once the budget, the batch or the queue is spent.
  [[nodiscard]] std::optional<std::uint32_t> next_waiting(AdmissionPass& pass,
                                                          std::uint64_t budget) const;
  // `head` does not fit: counted, and whether the pass goes on (with dispatch, past it, its
  // GPU held back).
  bool hold_back(AdmissionPass& pass, const Request& head, bool hbm_short, bool host_short);
  // Takes the request the pass considers out of the queue (its queue wait ends at its first
  // admission).
  void take_from_queue(const AdmissionPass& pass);
  // Adds the pass's holds to the totals: an iteration counts once.
  void end_pass(const AdmissionPass& pass);
  void admit_on_demand(std::uint64_t budget, hw::BatchShape& batch);
  [[nodiscard]] Footprint footprint(std::uint32_t id, std::uint64_t chunk_tokens) const;
  // Host bytes of T1 token-layers at full precision and T2 ones in the policy's format.
  [[nodiscard]] double host_bytes(double full_token_layers, double compressed_token_layers) const {
    return full_token_layers * bytes_per_token_layer_ +
           compressed_token_layers * compressed_bytes_per_token_layer_;
  }
  // A request received into host memory: its prompt's KV there at full precision, whole or (with
  // send_kept_only) the tokens its policy keeps, in the tiered layers (the untiered KV is
  // received into HBM).
  [[nodiscard]] double received_host_bytes(std::uint32_t id) const;
  // Token-layers of the prompt's tokens a received request's policy keeps before its first step
  // (with send_kept_only, what was sent), `extra` tokens past them in each tiered layer, on this
  // engine's busiest GPU; in whole blocks of each layer when `in_blocks`.
  [[nodiscard]] double kept_token_layers(std::uint32_t id, std::uint64_t extra,
                                         bool in_blocks) const;
  // Every running request's (and a prefill engine's handed-off ones'); with `hbm_by_gpu`, set
  // to each dispatched GPU's HBM share of it too.
  [[nodiscard]] Footprint planned_footprint(std::vector<double>* hbm_by_gpu = nullptr) const;
  // The running request to preempt while the iteration's KV `need` (by dispatched GPU,
  // `hbm_by_gpu`) does not fit: the one admitted last (on the first GPU short of memory), but
  // never a request alone (on its GPU) or one whose KV is on its way or not yet placed.
  [[nodiscard]] std::optional<std::uint32_t> preemption_victim(
      const Footprint& need, const std::vector<double>& hbm_by_gpu) const;
  // Data-parallel dispatch (serving/impl/engine_dispatch.cpp): takes `run`'s, or throws a
  // ConfigError where it is not modelled.
  void start_dispatching(const config::RunSpec& run);
  // The most tokens a request's next prefill chunk may take this iteration: chunk_cap_, or its
  // GPU's prefill room left.
  [[nodiscard]] std::uint64_t chunk_room(const Request& request) const;
  // Whether an admission pass skips a waiting request: its dispatched GPU is held back, or it
  // starts a prefill chunk and its GPU's prefill budget is spent.
  [[nodiscard]] bool admission_held(const Request& request) const {
    return dispatch_ && (dispatch_->held(request.gpu) ||
                         (prefilling(request) && dispatch_->prefill_room(request.gpu) == 0));
  }
  // Prefix caching (none without it or once a prefill has begun; at most all but the last
  // token's blocks, which the prefill computes to give the next token; a decode engine's
  // request received prefilled: every full block of its prompt).
  [[nodiscard]] PrefixHits prefix_hits(std::uint32_t id) const;
  // Takes them: its prefill starts after them.
  void take_prefix_hits(std::uint32_t id, const PrefixHits& hits);
  // Caches the blocks it filled, and lets go of those it holds (finished or preempted).
  void cache_filled_blocks(std::uint32_t id);
  void release_cached_blocks(std::uint32_t id);
  // Evicts free cached blocks until they fit beside what this iteration's requests use.
  void evict_prefix_cache();
  // Times this iteration's loads from the prefix cache's host tier (before its forward pass)
  // and the stores the last one's filled blocks issued (beside it), and returns the iteration's
  // duration with them; without work to overlap (`duration` empty) the stores are only counted.
  sim::Tick time_prefix_copies(sim::Tick duration);
  // Bytes of the cached blocks a request holds, and of those running requests hold (each once;
  // both zero without prefix caching).
  [[nodiscard]] double cached_blocks_held(const Request& request) const {
    return static_cast<double>(request.cache_held) * plan_.block_bytes();
  }
  [[nodiscard]] double cached_blocks_in_use() const {
    return prefix_cache_ ? static_cast<double>(prefix_cache_->held_blocks()) * plan_.block_bytes()
                         : 0.0;
  }
  // Whole-request reservations with prefix caching: every running request's whole life less the
  // cached blocks it holds, with those counted once.
  [[nodiscard]] double shared_reservations() const;
  // Preempts a running request: swapped out when the swap space has room for it, recomputed
  // otherwise.
  void preempt(std::uint32_t id);
  // The KV a request holds in HBM now (without its staging share), and the copies that swap
  // `bytes` of it.
  [[nodiscard]] double hbm_kv_bytes(std::uint32_t id) const;
  [[nodiscard]] std::uint64_t swap_copies(double bytes) const;
  // Runs an admitted request: swaps it in if it is swapped out, and adds its prompt chunk or its
  // decode step to the batch.
  void admit(std::uint32_t id, std::uint64_t& budget, hw::BatchShape& batch);
  // Times this iteration's swaps (none: zero) and adds them to the totals.
  sim::Tick time_swaps();
  void try_start_iteration();
  void finish_iteration();
  void complete(std::uint32_t id);
  [[nodiscard]] std::uint64_t attended(const Request& request) const;
  // The tokens a decode step attends once `generated` tokens are out (the first from the
  // prefill), its own included: in the layers that attend within a sliding window, the window's.
  [[nodiscard]] std::uint64_t attended(const Request& request, std::uint64_t generated) const;
  // What a decode step attends in the tiered layers (tiered_layers_), its own token included:
  // with hybrid attention the whole context, else attended().
  [[nodiscard]] std::uint64_t tiered_context(const Request& request, std::uint64_t generated) const;
  // Adds a decoding request's context to `batch`, `extra` tokens past what its step attends (a
  // draft pass's drafts before it): in the windowed layers and, with hybrid attention, in the
  // global ones.
  // Dispatched, it counts as one of its GPU's decoding requests too.
  void add_decode_context(const Request& request, std::uint64_t extra, hw::BatchShape& batch) const;
  // Adds `drafted` draft tokens of a decoding request to `batch` (and to its GPU's).
  static void add_drafts(const Request& request, std::uint64_t drafted, hw::BatchShape& batch);
  // A batch's per-GPU decodes, one entry a dispatched GPU (none without dispatch).
  void prepare_gpu_decodes(hw::BatchShape& batch) const;
  [[nodiscard]] double kv_in_use() const;
  // Sets kv_used_ to kv_in_use() and, dispatched, raises the busiest GPU's peak.
  void record_kv_used();
  [[nodiscard]] double full_kv_in_use() const;
  [[nodiscard]] double host_kv_in_use() const;
  // Sets the decode context of `batch` (with hybrid attention, the global layers'; dispatched,
  // each GPU's too) and fills copies_by_part_ from the decoding requests' tier demand and the
  // placement of prompts this iteration completes (tiered runs only).
  void plan_tier_traffic(hw::BatchShape& batch);
  // A received request's first step: its copies (into `copies`, its micro-batch's), the tokens
  // it stages by layer (`staged`, its micro-batch's) and the resident tokens attention reads.
  void place_received(Request& request, std::uint32_t id, std::vector<LayerCopies>& copies,
                      std::vector<double>& staged, double& resident);
  // The KV a tier policy leaves in HBM (MemoryPlan::untiered_kv_bytes_for: a drafter's, hybrid
  // attention's windowed layers') once a step giving `tokens` tokens has written them.
  [[nodiscard]] double untiered_kv_after_step(const Request& request, std::uint64_t tokens) const;
  // Request `id`'s next decode step in tiered layer `layer` (an index into tiered_layers_),
  // giving `tokens` tokens (TierDemand::step); `first` when nothing of it is staged yet.
  [[nodiscard]] LayerDemand step_demand(std::uint32_t id, const Request& request,
                                        std::uint32_t layer, std::uint64_t tokens,
                                        bool first) const;
  // The iteration's duration with its tier copies, and their totals: its compute `cost`, with
  // pipeline stages each stage's on each micro-batch (PipelineCostModel's StageTimer).
  [[nodiscard]] sim::Tick time_tier_copies(const hw::BatchShape& batch, hw::IterationCost& cost);
  // The copies' times over an iteration's stages and micro-batches (Totals' fields of the
  // same names, before the mean over the stages' GPUs).
  struct CopyTimes {
    sim::Tick h2d_busy;
    sim::Tick d2h_busy;
    sim::Tick prefetch_stall;
    sim::Tick copy_wait;
  };
  // One stage's layers on one micro-batch with their copies (with one stage, the iteration;
  // dispatched, each GPU's copies): how long they take; adds their copies' times to `times`.
  [[nodiscard]] sim::Tick time_stage_copies(const hw::IterationCost& compute,
                                            std::span<const std::span<const LayerCopies>> gpus,
                                            CopyTimes& times) const;
  // The tier policy's settings of `run`: copy rates, tiered layers, bytes of a token-layer,
  // how it receives KV and recodes it (serving/impl/engine_tiers.cpp).
  void start_tiering(const config::RunSpec& run);
  // Speculative decoding (serving/impl/engine_speculative.cpp). Takes `run`'s, or throws a
  // ConfigError where it is not modelled.
  void start_speculating(const config::RunSpec& run);
  // The draft tokens a decoding
  // request's step verifies: none without it, else draft_tokens, fewer near its end so that no
  // step gives a token past its last.
  [[nodiscard]] std::uint64_t drafts(const Request& request) const;
  // The tokens request `id`'s step gives: the drafts accepted in a row, and one more.
  [[nodiscard]] std::uint64_t step_tokens(std::uint32_t id, const Request& request) const;
  // The drafter's passes over this iteration's decoding requests, before the forward pass that
  // verifies their drafts (of cost `cost`, to which their work is added): their time, which
  // is also added to totals_.draft_busy (not to cost.total).
  [[nodiscard]] sim::Tick draft_passes(hw::IterationCost& cost);
  // Times this iteration's recodes (of `duration` on the GPU) as tiering.host_recode says and
  // returns how long the iteration waits for recodes beyond its own work; zero when not costed.
  sim::Tick time_host_recodes(sim::Tick duration);

  sim::Simulator& simulator_;
  config::RunSpec run_;
  Workload workload_;
  MemoryPlan plan_;
  hw::PipelineCostModel cost_model_;
  std::uint64_t prefill_budget_;
  // The most prompt tokens one request prefills in an iteration: the whole budget, or with
  // data-parallel attention one GPU's share of it (SGLang divides chunked_prefill_size by the
  // data-parallel size), so that the GPUs prefill different requests side by side.
  std::uint64_t chunk_cap_;
  std::uint32_t max_batch_;
  // engine.data_parallel_dispatch (empty without it).
  std::optional<DataParallelDispatch> dispatch_;
  sim::Tick iteration_overhead_;
  // workload.on_demand_admission's watermark; absent: whole-request reservations.
  std::optional<double> on_demand_watermark_;
  // engine.speculative (empty without it, and on a prefill engine, which never decodes).
  std::optional<config::SpeculativeDecoding> speculative_;
  const TierDemand* tiers_;
  // A decode engine under a tier policy that receives prompts' KV into host memory, and one that
  // receives only the tokens its policy keeps (cluster.disaggregation).
  bool receives_into_host_ = false;
  bool receives_kept_only_ = false;
  CopyRates copy_rates_;
  std::uint32_t lookahead_ = 1;
  // Tiered layers whose staging the buffer holds at once: of the one computing and those ahead,
  // the most a GPU holds (as the live cache's transient regions).
  std::uint32_t staged_layers_ = 2;
  // The model's layers a tier policy places (tiered_layers: all, or with hybrid attention the
  // global ones), by their index among them (TierDemand's target layers), and each one's
  // pipeline stage (all 0 without stages): a GPU holds its stage's layers' KV.
  std::vector<std::uint32_t> tiered_layers_;
  std::vector<std::uint32_t> stage_of_tiered_layer_;
  // The most of them one GPU holds.
  std::uint32_t tiered_layers_per_gpu_ = 0;
  // The most layers one GPU holds: the model's, or its largest pipeline stage's.
  std::uint32_t layers_per_gpu_;
  // Of them, and a drafter's, those whose KV its blocks hold (each a copy of keys and one of
  // values when a block moves).
  std::uint32_t kv_layers_per_gpu_;
  double bytes_per_token_layer_ = 0.0;             // full precision, this GPU's share
  double compressed_bytes_per_token_layer_ = 0.0;  // T2
  // This iteration's copies by part, each by layer: by micro-batch (one without pipeline
  // stages), or dispatched by GPU (data-parallel dispatch refuses stages).
  std::vector<std::vector<LayerCopies>> copies_by_part_;
  // What a part copies of a token-layer against bytes_per_token_layer_: dispatched, a GPU
  // copies its own requests' whole latents; else 1.
  double copy_scale_ = 1.0;
  double tier_staging_bytes_ = 0.0;  // the staging buffer of this iteration's prefetches
  // Dispatched, each GPU's staging buffer (mean-GPU bytes, as tier_staging_bytes_, their sum).
  std::vector<double> staging_by_gpu_;
  // This iteration's recodes, in token-layers, from plan_tier_traffic.
  double recoded_to_compressed_ = 0.0;
  double recoded_to_full_ = 0.0;
  // Costing them (tiering.host_recode; no timing: not costed): nanoseconds of one thread per
  // token-layer each way (every KV head of the model: the engine's threads recode each GPU's
  // share), the values of a token-layer, and when the recodes issued by the last two
  // iterations end (the threads: run_.tiering().host_recode()).
  std::optional<config::HostRecodeTiming> recode_timing_;
  double recode_ns_to_compressed_ = 0.0;
  double recode_ns_to_full_ = 0.0;
  double recode_values_per_token_layer_ = 0.0;
  sim::Tick recodes_done_latest_;
  sim::Tick recodes_done_previous_;
  // Swapping (on_demand_admission.swap; false: preemption by recompute), its copies a block of
  // memory.kv_block_tokens each: the rates, the swap space used, and this iteration's swaps out
  // and in.
  bool swapping_ = false;
  CopyRates swap_rates_;
  double swap_used_bytes_ = 0.0;
  double swap_out_bytes_now_ = 0.0;
  double swap_in_bytes_now_ = 0.0;
  std::uint64_t swap_out_copies_now_ = 0;
  std::uint64_t swap_in_copies_now_ = 0;
  // memory.prefix_caching (empty without it), over the KV capacity's blocks.
  std::optional<PrefixCache> prefix_cache_;
  std::uint64_t capacity_blocks_ = 0;
  // Its host tier (memory.prefix_cache_host_gib; empty without it), the rates of its copies,
  // and the blocks this iteration loads and the last one's filled blocks store.
  std::optional<HostBlockStore> prefix_host_;
  CopyRates prefix_copy_rates_;
  std::uint64_t prefix_loads_now_ = 0;
  std::uint64_t prefix_stores_now_ = 0;
  // memory.prefix_cache_host_chunk_tokens in blocks (0: a copy per block and layer's K or V),
  // and the chunks this iteration's loads and stores touch, each one copy.
  std::uint64_t prefix_chunk_blocks_ = 0;
  std::uint64_t prefix_load_chunks_now_ = 0;
  std::uint64_t prefix_store_chunks_now_ = 0;

  std::vector<Request> requests_;
  // Its own arrivals when it serves alone (start), and who hears of completions.
  std::optional<Arrivals> own_arrivals_;
  EngineRole role_;
  EngineHooks hooks_;
  std::deque<std::uint32_t> waiting_;
  std::vector<std::uint32_t> running_;  // admitted, in admission order
  // A prefill engine's requests prefilled whose KV has not left yet, in hand-off order.
  std::vector<std::uint32_t> handed_off_;
  double kv_reserved_bytes_ = 0.0;
  double host_reserved_bytes_ = 0.0;
  bool iteration_in_flight_ = false;
  bool start_pending_ = false;
  // With pipeline stages: the prefill tokens each micro-batch of this round has room for.
  std::vector<std::uint64_t> micro_room_;
  std::vector<std::uint32_t> decoding_now_;
  std::vector<PlannedChunk> prefilling_now_;
  sim::Tick iteration_started_;

  ServingTotals totals_;
  sim::LatencyDistribution ttft_;
  sim::LatencyDistribution tpot_;
  sim::LatencyDistribution e2e_;
  sim::LatencyDistribution queue_wait_;
  sim::LatencyDistribution iteration_time_;
  sim::TimeWeightedGauge kv_used_;
  double busiest_gpu_kv_peak_ = 0.0;
  sim::TimeWeightedGauge kv_reserved_;
  sim::TimeWeightedGauge running_gauge_;
  sim::TimeWeightedGauge full_kv_;
  sim::TimeWeightedGauge host_used_;
  sim::TimeWeightedGauge host_reserved_;
  sim::TimeWeightedGauge swap_used_;
  std::unique_ptr<sim::TimeSeries> kv_series_;
  std::unique_ptr<sim::TimeSeries> running_series_;
  std::unique_ptr<sim::TimeSeries> waiting_series_;
  std::unique_ptr<sim::TimeSeries> host_series_;
};

}  // namespace kvtier::serving
