#pragma once
// Data-parallel attention's GPUs as SGLang runs them (engine.data_parallel_dispatch): each
// arriving request is dispatched to one GPU, which attends it, keeps its KV and admits it from
// its own queue. What each GPU holds is its own: its requests (running, and running or waiting;
// a prefill engine's also those it has prefilled, until their KV has left for a decode engine),
// its share of the batch and of the prefill budget, its reserved KV; an admission pass holds
// back a GPU whose next request does not fit, and that GPU's later requests with it, while the
// other GPUs' requests go ahead (first come, first served on each GPU). In a disaggregated
// cluster each engine dispatches the requests it is given: a prefill engine on arrival, a
// decode engine when its router picks it (when the prefill has ended, or layer by layer when
// the iteration ending it starts).
//
// KV bytes here are the engine's: per GPU as the mean GPU holds them (MemoryPlan's, 1/TP of a
// request's latents), so a GPU's own KV memory is the plan's capacity / TP of them.

#include <cstdint>
#include <vector>

#include "configs/schema/run.pb.h"

namespace kvtier::serving {

class DataParallelDispatch {
 public:
  // `routing`: ROUND_ROBIN or LEAST_OUTSTANDING (std::invalid_argument otherwise) over `gpus`
  // GPUs; `max_batch` is split over them (rounded down, at least 1 a GPU, as SGLang divides
  // max_running_requests); each GPU prefills at most `prefill_tokens_per_gpu` an iteration.
  DataParallelDispatch(config::Routing routing, std::uint32_t gpus, std::uint32_t max_batch,
                       std::uint64_t prefill_tokens_per_gpu);

  [[nodiscard]] std::uint32_t gpus() const noexcept { return gpus_; }
  // The GPU an arriving request goes to: in turn, or the one holding the fewest requests (ties
  // to the lowest index). It holds the request until completed() (a prefill engine's, until
  // its KV has left).
  std::uint32_t dispatch();
  void completed(std::uint32_t gpu);

  // The running requests of each GPU, against its share of max_batch.
  void started_running(std::uint32_t gpu) { ++running_[gpu]; }
  void stopped_running(std::uint32_t gpu) { --running_[gpu]; }
  [[nodiscard]] std::uint32_t running(std::uint32_t gpu) const { return running_[gpu]; }
  // A prefill engine's request prefilled on `gpu`: no longer running there, its KV held there
  // until a decode engine has pulled it (released()).
  void handed_off(std::uint32_t gpu) {
    --running_[gpu];
    ++handed_off_[gpu];
  }
  void released(std::uint32_t gpu) { --handed_off_[gpu]; }
  // The requests whose KV a GPU holds: running, or handed off and not yet released.
  [[nodiscard]] std::uint32_t holding(std::uint32_t gpu) const {
    return running_[gpu] + handed_off_[gpu];
  }
  [[nodiscard]] bool batch_full(std::uint32_t gpu) const { return running_[gpu] >= max_batch_; }

  // A new iteration's plan: every GPU's prefill budget whole again.
  void plan_iteration();
  [[nodiscard]] std::uint64_t prefill_room(std::uint32_t gpu) const { return prefill_room_[gpu]; }
  void take_prefill(std::uint32_t gpu, std::uint64_t tokens) { prefill_room_[gpu] -= tokens; }

  // An admission pass: no GPU held back yet. A GPU is held back by hold() (its next request
  // did not fit, or it preempted) and when it has no room for another running request; a
  // request starting a prefill also needs room in its GPU's prefill budget (the engine asks).
  void start_admission();
  void hold(std::uint32_t gpu) { held_[gpu] = true; }
  [[nodiscard]] bool held(std::uint32_t gpu) const { return held_[gpu] || batch_full(gpu); }
  [[nodiscard]] bool all_held() const;

  // Whether `bytes` of KV on one GPU (mean-GPU bytes) exceed its share of `capacity` (the whole
  // plan's, or a part of it), compared as the engine's fit check at construction compares.
  [[nodiscard]] bool exceeds(double bytes, double capacity) const {
    return bytes * static_cast<double>(gpus_) > capacity;
  }
  // What a GPU's admitted requests reserve (whole-request reservations); zero again once it
  // holds nothing, so that no rounding is left over.
  [[nodiscard]] double reserved(std::uint32_t gpu) const { return reserved_[gpu]; }
  void reserve(std::uint32_t gpu, double bytes) { reserved_[gpu] += bytes; }
  void release(std::uint32_t gpu, double bytes) {
    reserved_[gpu] = holding(gpu) == 0 ? 0.0 : reserved_[gpu] - bytes;
  }

 private:
  config::Routing routing_;
  std::uint32_t gpus_;
  std::uint32_t max_batch_;
  std::uint64_t prefill_tokens_;
  std::uint64_t next_ = 0;
  std::vector<std::uint32_t> outstanding_;
  std::vector<std::uint32_t> running_;
  std::vector<std::uint32_t> handed_off_;
  std::vector<std::uint64_t> prefill_room_;
  std::vector<bool> held_;
  std::vector<double> reserved_;
};

}  // namespace kvtier::serving
