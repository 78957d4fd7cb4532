#include "kernels/impl/worker_pool.hpp"

#include <string>
#include <system_error>
#include <utility>

#include "common/errors.hpp"

namespace kvtier::kernels {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) {
    throw ConfigError("threads " + std::to_string(threads) + ": at least 1");
  }
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  try {
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this] { work(); });
    }
  } catch (const std::system_error& error) {
    stop();
    throw Error("cannot start " + std::to_string(threads - 1) + " worker threads: " + error.what(),
                "", ExitCode::kRuntimeFailure);
  }
}

WorkerPool::~WorkerPool() {
  stop();
}

void WorkerPool::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();
  }
  workers_.clear();
}

void WorkerPool::for_each_chunk(int chunks, std::int64_t work,
                                const std::function<void(int)>& body) {
  if (workers_.empty() || chunks <= 1 || work < kParallelWork) {
    for (int chunk = 0; chunk < chunks; ++chunk) {
      body(chunk);
    }
    return;
  }
  {
    const std::lock_guard lock(mutex_);
    body_ = &body;
    chunks_ = chunks;
    next_chunk_.store(0, std::memory_order_relaxed);
    busy_workers_ = static_cast<int>(workers_.size());
    ++loop_;
  }
  wake_.notify_all();
  run_chunks();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busy_workers_ == 0; });
  body_ = nullptr;
  if (failure_) {
    std::rethrow_exception(std::exchange(failure_, nullptr));
  }
}

void WorkerPool::run_chunks() {
  try {
    for (int chunk = next_chunk_.fetch_add(1, std::memory_order_relaxed); chunk < chunks_;
         chunk = next_chunk_.fetch_add(1, std::memory_order_relaxed)) {
      (*body_)(chunk);
    }
  } catch (...) {
    next_chunk_.store(chunks_, std::memory_order_relaxed);  // no thread starts another chunk
    const std::lock_guard lock(mutex_);
    if (!failure_) {
      failure_ = std::current_exception();
    }
  }
}

void WorkerPool::work() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || loop_ != seen; });
    if (stopping_) {
      return;
    }
    seen = loop_;
    lock.unlock();
    run_chunks();
    lock.lock();
    if (--busy_workers_ == 0) {
      done_.notify_one();
    }
  }
}

}  // namespace kvtier::kernels
