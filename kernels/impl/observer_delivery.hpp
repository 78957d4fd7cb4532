#pragma once
// How the CUDA engine hands what its forward pass observed to a ForwardObserver without making
// the decoding thread wait for it. Host code only, with no CUDA in it, so that CI (no GPU) tests
// it (tests/kernels/test_observer_delivery.cpp):
//
// - StagingRing hands out byte ranges of a staging buffer (the engine's pinned host ring) first
//   in, first out: the decoding thread acquires a range, the device copies into it, and the
//   delivery thread releases it once the observer has seen it. acquire() waits while the ring is
//   full, which is the only way a slow observer slows decoding down.
// - DeliveryQueue runs jobs in order on one thread of its own (or at once, on the caller's thread,
//   when synchronous). A job waits for its data (a CUDA event), calls the observer, then releases
//   its range. An exception from a job is kept and rethrown on the engine's thread by flush() or
//   rethrow_if_failed(); while it is pending, later jobs are released without being delivered.
//   discard_pending() releases every queued job without delivering it: the engine calls it before
//   an exception leaves prefill() or decode(), so that no observer call happens after the caller
//   has seen the exception (and perhaps destroyed the observer).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace kvtier::kernels::detail {

class StagingRing {
 public:
  // Ranges start at multiples of this many bytes.
  static constexpr std::size_t kAlignment = 256;

  explicit StagingRing(std::size_t capacity) : capacity_(capacity) {}

  // The offset of `bytes` contiguous bytes, once they are free (waits for release() otherwise).
  // std::logic_error when `bytes` can never fit (more than the capacity).
  [[nodiscard]] std::size_t acquire(std::size_t bytes);
  // Frees the oldest range still held (ranges are released in the order they were acquired).
  void release();
  // Changes the capacity; only while nothing is held (std::logic_error otherwise).
  void resize(std::size_t capacity);
  // Forgets every range (after a failure, once nothing that holds one can still use it).
  void clear();

  [[nodiscard]] std::size_t capacity() const;
  [[nodiscard]] std::size_t held() const;  // ranges acquired and not yet released

 private:
  [[nodiscard]] bool fits(std::size_t bytes, std::size_t& offset) const;

  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::size_t capacity_;
  struct Range {
    std::size_t offset;
    std::size_t bytes;
  };
  std::deque<Range> held_;
};

class DeliveryQueue {
 public:
  struct Job {
    std::function<void()> wait;     // until the job's data is ready; always run
    std::function<void()> deliver;  // calls the observer; skipped after an unreported failure
    std::function<void()> release;  // frees what the job holds; always run, must not throw
  };

  // `thread_start` runs first on the delivery thread (the engine selects its device there).
  explicit DeliveryQueue(bool asynchronous, std::function<void()> thread_start = {});
  DeliveryQueue(const DeliveryQueue&) = delete;
  DeliveryQueue& operator=(const DeliveryQueue&) = delete;
  DeliveryQueue(DeliveryQueue&&) = delete;
  DeliveryQueue& operator=(DeliveryQueue&&) = delete;
  // Jobs not yet delivered are waited for and released but not delivered; a failure not yet
  // reported is dropped.
  ~DeliveryQueue();

  [[nodiscard]] bool asynchronous() const { return asynchronous_; }

  // Queues `job` (asynchronous) or runs it now (synchronous; an exception from deliver then
  // propagates from here, after release).
  void push(Job job);
  // Waits until every queued job has run, then rethrows the first failure not yet reported.
  void flush();
  // Waits until every queued job has run; a failure stays pending.
  void wait_idle();
  // Rethrows the first failure not yet reported, without waiting.
  void rethrow_if_failed();
  // Whether a failure is waiting to be reported.
  [[nodiscard]] bool failed();
  // Waits for the job being delivered, then releases every queued job without delivering it. A
  // pending failure stays pending.
  void discard_pending();
  // Drops a failure not yet reported (for paths that must not throw).
  void forget_failure();
  // Whether discard_pending() or the destructor has begun, so that jobs popped from now on are
  // released without being delivered (what a test waits for rather than sleeping).
  [[nodiscard]] bool releasing_undelivered();

 private:
  void run_thread();
  void run_job(Job& job, bool deliver);

  bool asynchronous_;
  std::function<void()> thread_start_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  bool running_ = false;  // the thread is running a job it popped
  bool stopping_ = false;
  bool discarding_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace kvtier::kernels::detail
