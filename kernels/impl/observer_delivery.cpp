#include "kernels/impl/observer_delivery.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvtier::kernels::detail {
namespace {

std::size_t align_up(std::size_t value) {
  return (value + StagingRing::kAlignment - 1) / StagingRing::kAlignment * StagingRing::kAlignment;
}

}  // namespace

bool StagingRing::fits(std::size_t bytes, std::size_t& offset) const {
  if (held_.empty()) {
    offset = 0;
    return bytes <= capacity_;
  }
  const std::size_t tail = held_.front().offset;
  const std::size_t head = align_up(held_.back().offset + held_.back().bytes);
  if (held_.back().offset >= tail) {
    // Not wrapped: [tail, head) is held; free space after head, then before tail.
    if (head <= capacity_ && bytes <= capacity_ - head) {
      offset = head;
      return true;
    }
    offset = 0;
    return bytes <= tail;
  }
  // Wrapped: [tail, end) and [0, head) are held; [head, tail) is free.
  offset = head;
  return head <= tail && bytes <= tail - head;
}

std::size_t StagingRing::acquire(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  std::unique_lock lock(mutex_);
  if (bytes > capacity_) {
    throw std::logic_error("staging ring: " + std::to_string(bytes) +
                           " bytes never fit a ring of " + std::to_string(capacity_));
  }
  std::size_t offset = 0;
  released_.wait(lock, [&] { return fits(bytes, offset); });
  held_.push_back({offset, bytes});
  return offset;
}

void StagingRing::release() {
  {
    const std::lock_guard lock(mutex_);
    if (held_.empty()) {
      throw std::logic_error("staging ring: release() with nothing held");
    }
    held_.pop_front();
  }
  released_.notify_all();
}

void StagingRing::resize(std::size_t capacity) {
  const std::lock_guard lock(mutex_);
  if (!held_.empty()) {
    throw std::logic_error("staging ring: resize() while ranges are held");
  }
  capacity_ = capacity;
}

void StagingRing::clear() {
  {
    const std::lock_guard lock(mutex_);
    held_.clear();
  }
  released_.notify_all();
}

std::size_t StagingRing::capacity() const {
  const std::lock_guard lock(mutex_);
  return capacity_;
}

std::size_t StagingRing::held() const {
  const std::lock_guard lock(mutex_);
  return held_.size();
}

DeliveryQueue::DeliveryQueue(bool asynchronous, std::function<void()> thread_start)
    : asynchronous_(asynchronous), thread_start_(std::move(thread_start)) {
  if (asynchronous_) {
    thread_ = std::thread([this] { run_thread(); });
  }
}

DeliveryQueue::~DeliveryQueue() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void DeliveryQueue::run_job(Job& job, bool deliver) {
  std::exception_ptr failure;
  try {
    if (job.wait) {
      job.wait();
    }
    if (deliver && job.deliver) {
      job.deliver();
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (job.release) {
    job.release();
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
}

void DeliveryQueue::run_thread() {
  if (thread_start_) {
    try {
      thread_start_();
    } catch (...) {
      const std::lock_guard lock(mutex_);
      failure_ = std::current_exception();
    }
  }
  for (;;) {
    Job job;
    bool deliver = false;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) {
        return;  // stopping, and every job has been released
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
      deliver = !failure_ && !stopping_ && !discarding_;
    }
    try {
      run_job(job, deliver);
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!failure_) {
        failure_ = std::current_exception();
      }
    }
    {
      const std::lock_guard lock(mutex_);
      running_ = false;
    }
    changed_.notify_all();
  }
}

void DeliveryQueue::push(Job job) {
  if (!asynchronous_) {
    run_job(job, true);
    return;
  }
  {
    const std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void DeliveryQueue::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return jobs_.empty() && !running_; });
}

void DeliveryQueue::flush() {
  wait_idle();
  rethrow_if_failed();
}

void DeliveryQueue::rethrow_if_failed() {
  std::exception_ptr failure;
  {
    const std::lock_guard lock(mutex_);
    std::swap(failure, failure_);
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
}

bool DeliveryQueue::failed() {
  const std::lock_guard lock(mutex_);
  return static_cast<bool>(failure_);
}

void DeliveryQueue::discard_pending() {
  std::unique_lock lock(mutex_);
  discarding_ = true;
  changed_.wait(lock, [&] { return jobs_.empty() && !running_; });
  discarding_ = false;
}

bool DeliveryQueue::releasing_undelivered() {
  const std::lock_guard lock(mutex_);
  return stopping_ || discarding_;
}

void DeliveryQueue::forget_failure() {
  const std::lock_guard lock(mutex_);
  failure_ = nullptr;
}

}  // namespace kvtier::kernels::detail
