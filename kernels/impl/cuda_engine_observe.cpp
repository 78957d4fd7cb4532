// What the CUDA engine shows an observer (kernels/impl/cuda_engine_impl.hpp): each layer's keys
// and values, queries and probabilities (per head, or their head mean reduced on the device)
// copied asynchronously into a pinned host ring, and delivered by the delivery thread once each
// copy's event has completed (observer_delivery.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "kernels/impl/cuda_engine_impl.hpp"

namespace kvtier::kernels::detail {

void CudaEngine::report_observer_failure() {
  if (delivery_->failed()) {
    // Nothing more reaches the observer once its failure leaves the engine.
    delivery_->discard_pending();
    delivery_->rethrow_if_failed();
  }
}

void CudaEngine::abandon_deliveries() noexcept {
  try {
    delivery_->discard_pending();
    // A record staged but never queued (a copy failed) still holds its range.
    ring_.clear();
  } catch (...) {
    // Only reachable through a broken invariant; the exception being thrown says more.
  }
}

void CudaEngine::set_observer(ForwardObserver* observer) {
  select_device();
  observer_ = observer;
  if (std::uncaught_exceptions() > 0) {
    // Detaching while an exception unwinds (capture_trace's scope guard): the observer may be
    // gone already, so nothing pending is delivered, and nothing is thrown.
    delivery_->discard_pending();
    delivery_->forget_failure();
    return;
  }
  delivery_->flush();
}

void CudaEngine::ensure_ring(std::size_t bytes) {
  if (ring_memory_.get() != nullptr && bytes <= ring_memory_.bytes()) {
    return;
  }
  // Only while nothing is in flight: records point into the old memory.
  delivery_->wait_idle();
  const std::size_t capacity =
      std::max({bytes, options_.observer_ring_bytes, 2 * ring_.capacity()});
  ring_memory_ = PinnedMemory();
  ring_memory_ = PinnedMemory(capacity, check_);
  ring_.resize(capacity);
}

std::byte* CudaEngine::stage(std::size_t bytes, std::size_t& offset) {
  if (bytes > ring_.capacity()) {
    ensure_ring(bytes);
  }
  offset = ring_.acquire(bytes);
  return ring_memory_.get() + offset;
}

void CudaEngine::push_record(cudaEvent_t event, std::function<void()> deliver) {
  detail::DeliveryQueue::Job job;
  const Checker check = check_;
  job.wait = [event, check] { check(cudaEventSynchronize(event), "cudaEventSynchronize"); };
  job.deliver = std::move(deliver);
  job.release = [this, event]() noexcept {
    try {
      ring_.release();
    } catch (...) {  // NOLINT(bugprone-empty-catch): only after ring_.clear(); nothing to free
    }
    events_.give_back(event);
  };
  delivery_->push(std::move(job));
}

void CudaEngine::observe_key_values(ForwardObserver* observer, int layer, int rows) {
  const std::size_t row_bytes = 2 * static_cast<std::size_t>(kv_width_) * sizeof(float);
  const int per_record =
      static_cast<int>(std::max<std::size_t>(1, (ring_.capacity() / 4) / row_bytes));
  for (int first = 0; first < rows; first += per_record) {
    const int count = std::min(per_record, rows - first);
    std::size_t offset = 0;
    auto* host =
        reinterpret_cast<float*>(stage(row_bytes * static_cast<std::size_t>(count), offset));
    const std::size_t width = static_cast<std::size_t>(kv_width_) * sizeof(float);
    const float* source =
        qkv_.floats() + static_cast<std::ptrdiff_t>(first) * qkv_width_ + q_width_;
    const cudaEvent_t event = events_.take();
    try {
      check_(
          cudaMemcpy2DAsync(host, width, source, static_cast<std::size_t>(qkv_width_) * 4, width,
                            static_cast<std::size_t>(count), cudaMemcpyDeviceToHost, stream_.get()),
          "cudaMemcpy2DAsync (observed keys)");
      check_(
          cudaMemcpy2DAsync(host + static_cast<std::ptrdiff_t>(count) * kv_width_, width,
                            source + kv_width_, static_cast<std::size_t>(qkv_width_) * 4, width,
                            static_cast<std::size_t>(count), cudaMemcpyDeviceToHost, stream_.get()),
          "cudaMemcpy2DAsync (observed values)");
      check_(cudaEventRecord(event, stream_.get()), "cudaEventRecord");
    } catch (...) {
      events_.give_back(event);
      throw;
    }
    const int first_position = position_ + first;
    push_record(event,
                [=, this] { show_key_values(observer, layer, first_position, count, host); });
  }
}

void CudaEngine::show_key_values(ForwardObserver* observer, int layer, int first_position,
                                 int count, const float* host) const {
  const auto width_floats = static_cast<std::size_t>(kv_width_);
  for (int row = 0; row < count; ++row) {
    const float* keys = host + static_cast<std::ptrdiff_t>(row) * kv_width_;
    const float* values = keys + static_cast<std::ptrdiff_t>(count) * kv_width_;
    observer->on_key_value({layer,
                            first_position + row,
                            kv_heads_,
                            head_dim_,
                            {keys, width_floats},
                            {values, width_floats}});
  }
}

void CudaEngine::observe_attention(ForwardObserver* observer, int layer, const Chunk& chunk,
                                   bool prefill) {
  const bool mean = options_.observer_rows == ObserverRows::kHeadMean;
  const int first_position = position_ + chunk.first_row;
  const std::size_t query_floats = static_cast<std::size_t>(chunk.rows) * q_width_;
  const std::size_t probability_floats =
      static_cast<std::size_t>(chunk.keys) * (mean ? 1U : static_cast<std::size_t>(heads_));
  if (mean) {
    launched(cuda::launch_head_mean(probabilities_.floats(), mean_.floats(), chunk.rows, heads_,
                                    first_position, window_, stream_.get()),
             "head mean kernel");
  }
  std::size_t offset = 0;
  auto* host = reinterpret_cast<float*>(stage((query_floats + probability_floats) * 4, offset));
  const cudaEvent_t event = events_.take();
  try {
    const std::size_t width = static_cast<std::size_t>(q_width_) * 4;
    check_(
        cudaMemcpy2DAsync(
            host, width, qkv_.floats() + static_cast<std::ptrdiff_t>(chunk.first_row) * qkv_width_,
            static_cast<std::size_t>(qkv_width_) * 4, width, static_cast<std::size_t>(chunk.rows),
            cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpy2DAsync (observed queries)");
    check_(cudaMemcpyAsync(host + query_floats, mean ? mean_.get() : probabilities_.get(),
                           probability_floats * 4, cudaMemcpyDeviceToHost, stream_.get()),
           "cudaMemcpyAsync (observed probabilities)");
    check_(cudaEventRecord(event, stream_.get()), "cudaEventRecord");
  } catch (...) {
    events_.give_back(event);
    throw;
  }
  const int rows = chunk.rows;
  push_record(event, [=, this] {
    show_attention(observer, layer, first_position, rows, prefill, host, query_floats);
  });
}

void CudaEngine::show_attention(ForwardObserver* observer, int layer, int first_position, int rows,
                                bool prefill, const float* host, std::size_t query_floats) {
  const bool mean = options_.observer_rows == ObserverRows::kHeadMean;
  const float* probabilities = host + query_floats;
  for (int row = 0; row < rows; ++row) {
    const int position = first_position + row;
    AttentionStep step;
    step.layer = layer;
    step.query_position = position;
    step.prefill = prefill;
    step.first_key_position = cuda::first_key(position, window_);
    step.key_count = position - step.first_key_position + 1;
    step.query_heads = heads_;
    step.kv_heads = kv_heads_;
    step.head_dim = head_dim_;
    step.queries = {host + static_cast<std::ptrdiff_t>(row) * q_width_,
                    static_cast<std::size_t>(q_width_)};
    const auto keys = static_cast<std::size_t>(step.key_count);
    const std::int64_t before = cuda::keys_before_row(row, first_position, window_);
    if (mean) {
      // Every head's row is the mean (ObserverRows::kHeadMean).
      const float* row_mean = probabilities + before;
      broadcast_.resize(static_cast<std::size_t>(heads_) * keys);
      for (int head = 0; head < heads_; ++head) {
        std::copy_n(row_mean, keys, broadcast_.begin() + static_cast<std::ptrdiff_t>(head * keys));
      }
      step.probabilities = broadcast_;
    } else {
      step.probabilities = {probabilities + static_cast<std::ptrdiff_t>(heads_) * before,
                            static_cast<std::size_t>(heads_) * keys};
    }
    observer->on_attention(step);
  }
}

std::size_t CudaEngine::gathered_step_bytes(const ForwardObserver* observer, int rows, bool prefill,
                                            const std::vector<Chunk>& chunks) {
  if (observer == nullptr || rows != 1 || prefill || chunks.size() != 1 ||
      options_.observer_delivery != ObserverDelivery::kAsynchronous) {
    return 0;
  }
  // At most a quarter of the ring, as the per-layer records: a step of per-head rows at a long
  // context would otherwise hold much of the ring (and as much device memory) at once.
  const auto bytes =
      static_cast<std::size_t>(cuda::observed_layer_floats(observed_layer(0, chunks.front()))) *
      layers_count_ * sizeof(float);
  return bytes <= ring_.capacity() / 4 ? bytes : 0;
}

cuda::ObservedLayer CudaEngine::observed_layer(int layer, const Chunk& chunk) {
  cuda::ObservedLayer record;
  record.qkv = qkv_.floats();
  record.q_width = q_width_;
  record.kv_width = kv_width_;
  record.probabilities = probabilities_.floats();
  record.heads = heads_;
  record.keys = static_cast<int>(chunk.keys);
  record.head_mean = options_.observer_rows == ObserverRows::kHeadMean;
  record.out =
      observed_.floats() + static_cast<std::ptrdiff_t>(layer) * cuda::observed_layer_floats(record);
  return record;
}

void CudaEngine::gather_observed_layer(int layer, const Chunk& chunk) {
  launched(cuda::launch_gather_observation(observed_layer(layer, chunk), stream_.get()),
           "gather observation kernel");
}

void CudaEngine::observe_gathered_step(ForwardObserver* observer, const Chunk& chunk,
                                       std::size_t bytes) {
  const std::int64_t floats = cuda::observed_layer_floats(observed_layer(0, chunk));
  std::size_t offset = 0;
  auto* host = reinterpret_cast<float*>(stage(bytes, offset));
  const cudaEvent_t event = events_.take();
  try {
    check_(cudaMemcpyAsync(host, observed_.get(), bytes, cudaMemcpyDeviceToHost, stream_.get()),
           "cudaMemcpyAsync (observed step)");
    check_(cudaEventRecord(event, stream_.get()), "cudaEventRecord");
  } catch (...) {
    events_.give_back(event);
    throw;
  }
  const int first_position = position_ + chunk.first_row;
  const int layers = layers_count_;
  const int kv_floats = 2 * kv_width_;
  const auto query_floats = static_cast<std::size_t>(q_width_);
  // The CPU engine's order: each layer's keys and values, then its attention.
  push_record(event, [=, this] {
    for (int layer = 0; layer < layers; ++layer) {
      const float* record = host + static_cast<std::ptrdiff_t>(layer) * floats;
      show_key_values(observer, layer, first_position, 1, record);
      show_attention(observer, layer, first_position, 1, false, record + kv_floats, query_floats);
    }
  });
}

}  // namespace kvtier::kernels::detail
