#include "serving/data_parallel_dispatch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvtier::serving {
namespace {

// SGLang divides max_running_requests by the data-parallel size (and at least one runs).
std::uint32_t batch_share(std::uint32_t max_batch, std::uint32_t gpus) {
  return std::max(max_batch / std::max(gpus, 1U), 1U);
}

}  // namespace

DataParallelDispatch::DataParallelDispatch(config::Routing routing, std::uint32_t gpus,
                                           std::uint32_t max_batch,
                                           std::uint64_t prefill_tokens_per_gpu)
    : routing_(routing),
      gpus_(gpus),
      max_batch_(batch_share(max_batch, gpus)),
      prefill_tokens_(prefill_tokens_per_gpu),
      outstanding_(gpus, 0),
      running_(gpus, 0),
      handed_off_(gpus, 0),
      prefill_room_(gpus, prefill_tokens_),
      held_(gpus, false),
      reserved_(gpus, 0.0) {
  if (gpus == 0 || (routing != config::ROUND_ROBIN && routing != config::LEAST_OUTSTANDING)) {
    throw std::invalid_argument("data-parallel dispatch over " + std::to_string(gpus) +
                                " GPUs by " + config::Routing_Name(routing) +
                                ": needs GPUs, and ROUND_ROBIN or LEAST_OUTSTANDING");
  }
}

std::uint32_t DataParallelDispatch::dispatch() {
  std::uint32_t gpu = 0;
  if (routing_ == config::ROUND_ROBIN) {
    gpu = static_cast<std::uint32_t>(next_++ % gpus_);
  } else {
    gpu = static_cast<std::uint32_t>(std::min_element(outstanding_.begin(), outstanding_.end()) -
                                     outstanding_.begin());
  }
  ++outstanding_[gpu];
  return gpu;
}

void DataParallelDispatch::completed(std::uint32_t gpu) {
  --outstanding_[gpu];
}

void DataParallelDispatch::plan_iteration() {
  std::fill(prefill_room_.begin(), prefill_room_.end(), prefill_tokens_);
}

void DataParallelDispatch::start_admission() {
  std::fill(held_.begin(), held_.end(), false);
}

bool DataParallelDispatch::all_held() const {
  for (std::uint32_t gpu = 0; gpu < gpus_; ++gpu) {
    if (!held(gpu)) {
      return false;
    }
  }
  return true;
}

}  // namespace kvtier::serving
