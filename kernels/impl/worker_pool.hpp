#pragma once
// Internal: the CPU engine's threads. A pool runs one parallel loop at a time over numbered
// chunks; the calling thread runs chunks too and returns when every chunk has run. Callers cut
// their work into chunks fixed by the problem (blocks of output features, attention heads), never
// by the thread count, so which thread runs a chunk cannot change a single bit of the result.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::kernels {

class WorkerPool {
 public:
  // `threads` counts the caller: a pool of 1 starts no thread and runs every loop inline.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  [[nodiscard]] int threads() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(chunk) for every chunk in [0, chunks), in any order and on any of the threads.
  // `work` is the loop's multiply-adds: below kParallelWork it runs on the calling thread alone,
  // as waking the workers would cost more than they save. When a chunk throws (an allocation
  // inside Eigen failing), the chunks not yet started are skipped and the first exception is
  // rethrown here once every thread has left the loop.
  void for_each_chunk(int chunks, std::int64_t work, const std::function<void(int)>& body);

  static constexpr std::int64_t kParallelWork = std::int64_t{1} << 16;

 private:
  void work();
  void run_chunks();
  void stop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* body_ = nullptr;
  int chunks_ = 0;
  std::atomic<int> next_chunk_{0};
  std::exception_ptr failure_;  // the loop's first exception, guarded by mutex_
  int busy_workers_ = 0;
  std::uint64_t loop_ = 0;  // bumped for every parallel loop; workers wait for a new value
  bool stopping_ = false;
  std::vector<std::thread> workers_;  // last: started after everything they read exists
};

}  // namespace kvtier::kernels
