// Points of a sweep run on threads, resumed from the folder or computed (point_runner.hpp).

#include "sweep/impl/point_runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/errors.hpp"

namespace kvtier::sweep::detail {

namespace fs = std::filesystem;

PointRunner::PointRunner(const Sweep& sweep, const config::ConfigLoader& loader,
                         const RunOptions& options, const Manifest& manifest,
                         std::vector<std::uint64_t> points)
    : sweep_(sweep),
      loader_(loader),
      options_(options),
      manifest_(manifest),
      points_(std::move(points)),
      rows_(points_.size()) {}

void PointRunner::run(Clock::time_point start, const Serve& serve) {
  const unsigned jobs =
      std::max(1U, std::min<unsigned>(options_.jobs, static_cast<unsigned>(points_.size())));
  std::vector<std::thread> threads;
  threads.reserve(jobs);
  for (unsigned j = 0; j < jobs && !points_.empty(); ++j) {
    threads.emplace_back([this, j] { work(j); });
  }
  // Alone, this thread only reports progress; serving other processes, it polls their messages
  // often, and reports at most as often as alone.
  const auto wait = serve ? std::chrono::milliseconds(1) : std::chrono::milliseconds(250);
  Clock::time_point reported = start;
  {
    std::unique_lock lock(mutex_);
    for (;;) {
      lock.unlock();
      const bool elsewhere = serve && serve(*this);
      if (options_.progress && Clock::now() - reported >= std::chrono::milliseconds(250)) {
        report(start);
        reported = Clock::now();
      }
      lock.lock();
      if (finished_threads_ == threads.size() && !elsewhere) {
        break;
      }
      changed_.wait_for(lock, wait);
    }
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  if (!errors_.empty()) {
    std::rethrow_exception(errors_.begin()->second);
  }
}

void PointRunner::report(Clock::time_point start) const {
  Progress progress;
  progress.total = points_.size();
  progress.resumed = resumed_.load();
  const std::uint64_t computed = computed_.load();
  progress.done = progress.resumed + computed;
  progress.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (computed > 0) {
    progress.eta_s = progress.elapsed_s / static_cast<double>(computed) *
                     static_cast<double>(progress.total - progress.done);
  }
  options_.progress(progress);
}

std::optional<std::size_t> PointRunner::take_for_elsewhere() {
  while (!stop_.load()) {
    const std::size_t slot = next_.fetch_add(1);
    if (slot >= points_.size()) {
      return std::nullopt;
    }
    try {
      if (!resume(slot)) {
        return slot;
      }
    } catch (...) {
      fail(points_[slot], std::current_exception());
    }
    changed_.notify_all();
  }
  return std::nullopt;
}

void PointRunner::store_computed(std::size_t slot, std::string_view point_csv,
                                 const fs::path& scratch) {
  try {
    store(slot, point_csv, scratch);
  } catch (...) {
    fail(points_[slot], std::current_exception());
  }
  changed_.notify_all();
}

void PointRunner::fail(std::uint64_t point, std::exception_ptr error) {
  {
    const std::lock_guard lock(mutex_);
    errors_.emplace(point, std::move(error));
    stop_ = true;
  }
  changed_.notify_all();
}

std::vector<Row> PointRunner::rows() {
  std::vector<Row> all;
  for (std::vector<Row>& point_rows : rows_) {
    std::move(point_rows.begin(), point_rows.end(), std::back_inserter(all));
  }
  return all;
}

bool PointRunner::resume(std::size_t slot) {
  const std::uint64_t point = points_[slot];
  std::error_code ignored;
  if (!fs::exists(point_file(options_.out, point), ignored)) {
    return false;
  }
  try {
    rows_[slot] = read_point(options_.out, point, manifest_);
    ++resumed_;
    return true;
  } catch (const DataError&) {
    ++replaced_;  // damaged on disk or written by hand: computed again
    return false;
  }
}

void PointRunner::run_point(std::size_t slot, const fs::path& scratch) {
  if (resume(slot)) {
    return;
  }
  const std::vector<Row> rows =
      simulate_point(sweep_, points_[slot], loader_, memo_, options_.out / "demand-cache");
  store(slot, point_file_csv(rows, sweep_.axis_columns), scratch);
}

void PointRunner::store(std::size_t slot, std::string_view point_csv, const fs::path& scratch) {
  const std::uint64_t point = points_[slot];
  write_point_file(point_file(options_.out, point), scratch, point_csv);
  rows_[slot] = read_point(options_.out, point, manifest_);
  ++computed_;
}

void PointRunner::work(unsigned thread) {
  // OUT/.tmp/PID-THREAD: this thread's temporary files; empty again once the thread is done.
  const fs::path scratch =
      options_.out / kScratch /
      (std::to_string(static_cast<long>(::getpid())) + "-" + std::to_string(thread));
  std::error_code error = make_scratch(scratch);
  if (error) {
    fail(0, std::make_exception_ptr(Error("cannot create folder: " + error.message(),
                                          scratch.string(), ExitCode::kRuntimeFailure)));
  }
  while (!stop_.load()) {
    const std::size_t slot = next_.fetch_add(1);
    if (slot >= points_.size()) {
      break;
    }
    try {
      run_point(slot, scratch);
    } catch (...) {
      fail(points_[slot], std::current_exception());
    }
    changed_.notify_all();
  }
  fs::remove_all(scratch, error);
  fs::remove(scratch.parent_path(), error);  // fails, as it should, while other threads use it
  {
    const std::lock_guard lock(mutex_);
    ++finished_threads_;
  }
  changed_.notify_all();
}

}  // namespace kvtier::sweep::detail
