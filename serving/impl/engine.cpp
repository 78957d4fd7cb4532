#include "serving/engine.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/text_output.hpp"

namespace kvtier::serving {
namespace {

// Below the time-series sampler (kLastPriority), above everything else.
constexpr sim::Priority kStartPriority = sim::kLastPriority - 1;

const config::LinkSpec* gpu_link_of(const config::RunSpec& run) {
  const auto& node = run.hardware().node();
  return node.has_gpu_link() ? &node.gpu_link() : nullptr;
}

}  // namespace

ServingEngine::ServingEngine(sim::Simulator& simulator, const config::RunSpec& run,
                             Workload workload)
    : simulator_(simulator),
      run_(run),
      workload_(std::move(workload)),
      plan_(plan_memory(run)),
      cost_model_(run.model(), run.hardware().node().gpu(), gpu_link_of(run),
                  run.tensor_parallel_degree()),
      prefill_budget_(run.workload().prefill_chunk_tokens()),
      max_batch_(run.workload().max_batch_size()),
      iteration_overhead_(
          sim::from_microseconds(run.engine().iteration_overhead_us(), sim::Rounding::kUp)),
      kv_used_(simulator),
      kv_reserved_(simulator),
      running_gauge_(simulator) {
  const auto max_positions = run.model().max_position_embeddings();
  for (size_t i = 0; i < workload_.requests.size(); ++i) {
    const RequestSpec& spec = workload_.requests[i];
    const std::uint64_t tokens = spec.prompt_tokens + spec.output_tokens;
    if (tokens > max_positions) {
      throw ConfigError("request " + std::to_string(i) + " has " + std::to_string(tokens) +
                        " tokens, more than " + run.model().name() + "'s " +
                        std::to_string(max_positions) + " positions");
    }
    if (plan_.kv_bytes_for(tokens) > plan_.kv_capacity_bytes) {
      throw ConfigError(
          "request " + std::to_string(i) + " (" + std::to_string(tokens) + " tokens) needs " +
          format_fixed(plan_.kv_bytes_for(tokens) / (1 << 30), 2) +
          " GiB of KV per GPU, but only " + format_fixed(plan_.kv_capacity_bytes / (1 << 30), 2) +
          " GiB are left after " + plan_.breakdown());
    }
    requests_.push_back(Request{spec, {}, {}, {}, 0, 0, 0.0});
  }
  if (run.has_outputs() && run.outputs().has_timeseries_interval_us()) {
    const sim::Tick interval =
        sim::from_microseconds(run.outputs().timeseries_interval_us(), sim::Rounding::kUp);
    kv_series_ =
        std::make_unique<sim::TimeSeries>(simulator_, interval, [this] { return kv_in_use(); });
    running_series_ = std::make_unique<sim::TimeSeries>(
        simulator_, interval, [this] { return static_cast<double>(running_.size()); });
  }
}

void ServingEngine::start() {
  if (kv_series_) {
    kv_series_->start();
    running_series_->start();
  }
  if (workload_.closed_loop_concurrency) {
    const std::uint32_t initial = std::min<std::uint32_t>(
        *workload_.closed_loop_concurrency, static_cast<std::uint32_t>(requests_.size()));
    for (std::uint32_t i = 0; i < initial; ++i) {
      simulator_.schedule_at(sim::Tick::zero(), [this] { arrive(next_arrival_++); });
    }
  } else {
    schedule_next_open_loop_arrival();
  }
}

void ServingEngine::schedule_next_open_loop_arrival() {
  if (next_arrival_ >= requests_.size()) {
    return;
  }
  const sim::Tick when = std::max(simulator_.now(), *requests_[next_arrival_].spec.arrival);
  simulator_.schedule_at(when, [this] {
    arrive(next_arrival_++);
    schedule_next_open_loop_arrival();
  });
}

void ServingEngine::arrive(std::uint32_t request) {
  requests_[request].arrival = simulator_.now();
  waiting_.push_back(request);
  totals_.max_waiting = std::max<std::uint64_t>(totals_.max_waiting, waiting_.size());
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

std::uint64_t ServingEngine::attended(const Request& request) const {
  const std::uint64_t context = request.spec.prompt_tokens + request.generated;
  return plan_.window_tokens > 0 ? std::min(context, plan_.window_tokens) : context;
}

double ServingEngine::kv_in_use() const {
  double bytes = 0.0;
  for (const std::uint32_t id : running_) {
    const Request& request = requests_[id];
    bytes += plan_.kv_bytes_for(request.prefilled + request.generated);
  }
  return bytes;
}

void ServingEngine::try_start_iteration() {
  decoding_now_.clear();
  prefilling_now_.clear();
  hw::BatchShape batch;
  std::uint64_t budget = prefill_budget_;
  for (const std::uint32_t id : running_) {
    const Request& request = requests_[id];
    if (request.prefilled == request.spec.prompt_tokens) {
      decoding_now_.push_back(id);
      batch.decode_context_tokens += attended(request);
    }
  }
  batch.decode_tokens = decoding_now_.size();
  budget -= std::min<std::uint64_t>(budget, batch.decode_tokens);
  auto add_chunk = [&](std::uint32_t id) {
    Request& request = requests_[id];
    const std::uint64_t tokens = std::min(budget, request.spec.prompt_tokens - request.prefilled);
    budget -= tokens;
    prefilling_now_.push_back(PlannedChunk{id, tokens});
    batch.prefill.push_back(hw::PrefillChunk{tokens, request.prefilled});
    if (request.prefilled + tokens == request.spec.prompt_tokens) {
      ++batch.logits_tokens;
    }
  };
  for (const std::uint32_t id : running_) {
    if (budget > 0 && requests_[id].prefilled < requests_[id].spec.prompt_tokens) {
      add_chunk(id);
    }
  }
  while (budget > 0 && !waiting_.empty() && running_.size() < max_batch_) {
    Request& head = requests_[waiting_.front()];
    const double kv = plan_.kv_bytes_for(head.spec.prompt_tokens + head.spec.output_tokens);
    if (kv_reserved_bytes_ + kv > plan_.kv_capacity_bytes) {
      break;  // first come, first served: later requests wait behind the head
    }
    const std::uint32_t id = waiting_.front();
    waiting_.pop_front();
    head.admitted = simulator_.now();
    head.kv_reserved = kv;
    kv_reserved_bytes_ += kv;
    queue_wait_.record(head.admitted - head.arrival);
    running_.push_back(id);
    add_chunk(id);
  }
  batch.logits_tokens += batch.decode_tokens;
  kv_reserved_.set(kv_reserved_bytes_);
  running_gauge_.set(static_cast<double>(running_.size()));
  totals_.max_running = std::max<std::uint64_t>(totals_.max_running, running_.size());
  if (decoding_now_.empty() && prefilling_now_.empty()) {
    iteration_in_flight_ = false;
    return;
  }
  const hw::IterationCost cost = cost_model_.cost(batch);
  iteration_in_flight_ = true;
  iteration_started_ = simulator_.now();
  totals_.flops += cost.flops;
  totals_.hbm_bytes += cost.hbm_bytes;
  totals_.interconnect_bytes += cost.interconnect_bytes;
  totals_.busy += cost.total;
  simulator_.schedule_after(cost.total + iteration_overhead_, [this] { finish_iteration(); });
}

void ServingEngine::finish_iteration() {
  const sim::Tick now = simulator_.now();
  iteration_time_.record(now - iteration_started_);
  ++totals_.iterations;
  std::vector<std::uint32_t> finished;
  for (const std::uint32_t id : decoding_now_) {
    Request& request = requests_[id];
    ++request.generated;
    if (request.generated == request.spec.output_tokens) {
      finished.push_back(id);
    }
  }
  for (const PlannedChunk& chunk : prefilling_now_) {
    Request& request = requests_[chunk.request];
    request.prefilled += chunk.tokens;
    if (request.prefilled == request.spec.prompt_tokens) {
      request.generated = 1;
      request.first_token = now;
      ttft_.record(now - request.arrival);
      if (request.spec.output_tokens == 1) {
        finished.push_back(chunk.request);
      }
    }
  }
  std::sort(finished.begin(), finished.end());
  for (const std::uint32_t id : finished) {
    complete(id);
  }
  kv_used_.set(kv_in_use());
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
  running_.erase(std::find(running_.begin(), running_.end(), id));
  ++totals_.requests_completed;
  totals_.prompt_tokens += request.spec.prompt_tokens;
  totals_.output_tokens += request.spec.output_tokens;
  totals_.last_completion = now;
  if (workload_.closed_loop_concurrency && next_arrival_ < requests_.size()) {
    arrive(next_arrival_++);
  }
}

}  // namespace kvtier::serving
