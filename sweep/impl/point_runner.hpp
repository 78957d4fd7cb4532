#pragma once
// The points of one sweep run, computed on threads into the sweep folder (resuming those whose
// file is already there), and optionally handed out to other processes by the calling thread
// (the MPI coordinator, sweep/impl/mpi_job.cpp). Not part of the module's interface.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "serving/demand_memo.hpp"
#include "sweep/impl/folder.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep::detail {

using Clock = std::chrono::steady_clock;

// Each thread takes the next point in index order, keeps it when the folder already holds its
// file (resuming), else simulates it and writes its file — so a kill loses at most the points in
// flight — and reads the file back: the table is what the point files hold, whether a point was
// resumed or computed, and all per-point file work runs in parallel. The first error (lowest
// point) is rethrown once every thread has stopped.
class PointRunner {
 public:
  PointRunner(const Sweep& sweep, const config::ConfigLoader& loader, const RunOptions& options,
              const Manifest& manifest, std::vector<std::uint64_t> points);

  // Called on the calling thread between waits while points run; returns whether points handed
  // to other processes are still out. It must not throw (failures go to fail()).
  using Serve = std::function<bool(PointRunner&)>;

  // Computes the points on options.jobs threads; with `serve`, returns only once it too is done.
  void run(Clock::time_point start, const Serve& serve = {});
  void report(Clock::time_point start) const;

  // For `serve`: the next point no thread has taken, skipping (and keeping) those the folder
  // already holds; nullopt once none is left or the run is stopping after an error.
  [[nodiscard]] std::optional<std::size_t> take_for_elsewhere();
  [[nodiscard]] std::size_t slots() const { return points_.size(); }
  [[nodiscard]] std::uint64_t point(std::size_t slot) const { return points_[slot]; }
  // A point computed elsewhere: its point file's content, written and read back as one of ours.
  void store_computed(std::size_t slot, std::string_view point_csv,
                      const std::filesystem::path& scratch);
  // Stops the run; the lowest point's error is rethrown at the end.
  void fail(std::uint64_t point, std::exception_ptr error);

  // Every point's rows, in point order.
  [[nodiscard]] std::vector<Row> rows();
  [[nodiscard]] std::uint64_t resumed() const { return resumed_.load(); }
  [[nodiscard]] std::uint64_t replaced() const { return replaced_.load(); }
  [[nodiscard]] std::uint64_t computed() const { return computed_.load(); }

 private:
  [[nodiscard]] bool resume(std::size_t slot);
  void run_point(std::size_t slot, const std::filesystem::path& scratch);
  void store(std::size_t slot, std::string_view point_csv, const std::filesystem::path& scratch);
  void work(unsigned thread);

  const Sweep& sweep_;
  const config::ConfigLoader& loader_;
  const RunOptions& options_;
  const Manifest& manifest_;
  const std::vector<std::uint64_t> points_;
  std::vector<std::vector<Row>> rows_;  // one slot per point, written by one thread only
  serving::DemandMemo memo_;            // one for the whole sweep: replays shared across points
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> resumed_{0};
  std::atomic<std::uint64_t> replaced_{0};
  std::atomic<std::uint64_t> computed_{0};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t finished_threads_ = 0;
  std::map<std::uint64_t, std::exception_ptr> errors_;
};

// run_sweep's body: claims the folder, runs the selected points (with `serve` on the calling
// thread when given) and writes the results.
[[nodiscard]] RunSummary run_sweep_served(const Sweep& sweep, const config::ConfigLoader& loader,
                                          const RunOptions& options,
                                          const PointRunner::Serve& serve);

}  // namespace kvtier::sweep::detail
