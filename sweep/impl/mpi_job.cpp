// Sweeps over the ranks of an MPI job (sweep/mpi.hpp): rank 0 coordinates and writes, every rank
// computes. Only the thread that made the MpiJob calls MPI (MPI_THREAD_FUNNELED): rank 0's is
// the one that serves the others between its waits for its own threads (PointRunner::run), a
// worker's relays between rank 0 and its threads.

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "serving/demand_memo.hpp"
#include "sweep/impl/folder.hpp"
#include "sweep/impl/point_runner.hpp"
#include "sweep/mpi.hpp"

namespace kvtier::sweep {
namespace {

namespace fs = std::filesystem;

// Messages between rank 0 and the others.
enum Tag : int {
  kAsk = 1,     // worker -> 0: u32 count of points it can take now (its --jobs), once at start
  kResult = 2,  // worker -> 0: u64 slot, then the point file's bytes; asks for one more point
  kFailed = 3,  // worker -> 0: u64 slot, i32 exit code, the error's lines; asks for one more
  kAssign = 4,  // 0 -> worker: u64 slot, u64 point
  kDone = 5,    // 0 -> worker: nothing more to take; it sends what it holds, then stops
};

// OpenMPI's handles are macros with C casts; named once here.
MPI_Comm world() {
  return MPI_COMM_WORLD;
}

// Numbers in messages: the ranks of one job run one build, so their bytes are the same.
template <typename Number>
void put(std::string& bytes, Number value) {
  char raw[sizeof value];
  std::memcpy(raw, &value, sizeof value);
  bytes.append(raw, sizeof value);
}

template <typename Number>
Number get(const std::string& bytes, std::size_t offset) {
  Number value{};
  if (offset + sizeof value > bytes.size()) {
    throw Error("MPI message too short", "", ExitCode::kRuntimeFailure);
  }
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

void send(int rank, Tag tag, const std::string& bytes) {
  if (bytes.size() > static_cast<std::size_t>(INT_MAX)) {
    throw Error("MPI message larger than 2 GiB", "", ExitCode::kRuntimeFailure);
  }
  MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, rank, tag, world());
}

struct Message {
  int source = 0;
  int tag = 0;
  std::string bytes;
};

// The next message from `source` (MPI_ANY_SOURCE: from anyone), if one has arrived.
std::optional<Message> poll(int source) {
  int arrived = 0;
  MPI_Status status;
  MPI_Iprobe(source, MPI_ANY_TAG, world(), &arrived, &status);
  if (arrived == 0) {
    return std::nullopt;
  }
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  Message message{status.MPI_SOURCE, status.MPI_TAG,
                  std::string(static_cast<std::size_t>(count), '\0')};
  MPI_Recv(message.bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, world(),
           MPI_STATUS_IGNORE);
  return message;
}

// A message that breaks the exchange is a bug, not a user's error, and no run can go on from it:
// the job ends at once (the folder keeps the points finished so far).
[[noreturn]] void abort_job(const std::string& what) {
  std::cerr << format_error_line("MPI sweep: " + what, "") << std::endl;
  MPI_Abort(world(), static_cast<int>(ExitCode::kRuntimeFailure));
  std::abort();  // MPI_Abort does not return
}

// Rank 0's exit code, to every rank.
int broadcast_code(int code) {
  MPI_Bcast(&code, 1, MPI_INT, 0, world());
  return code;
}

// What an error prints and the exit code it ends with (as apps/main.cpp reports it).
struct Failure {
  int code = 0;
  std::vector<std::string> lines;
};

Failure failure_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& known) {
    return {static_cast<int>(known.exit_code()), known.lines()};
  } catch (const std::exception& other) {
    return {static_cast<int>(ExitCode::kRuntimeFailure), {format_error_line(other.what(), "")}};
  } catch (...) {
    return {static_cast<int>(ExitCode::kRuntimeFailure), {format_error_line("unknown error", "")}};
  }
}

std::string encode_failure(const Failure& failure) {
  std::string bytes;
  put(bytes, static_cast<std::int32_t>(failure.code));
  for (std::size_t i = 0; i < failure.lines.size(); ++i) {
    bytes += (i > 0 ? "\n" : "") + failure.lines[i];
  }
  return bytes;
}

Failure decode_failure(const std::string& bytes, std::size_t offset) {
  Failure failure;
  failure.code = get<std::int32_t>(bytes, offset);
  std::size_t start = offset + sizeof(std::int32_t);
  while (start <= bytes.size()) {
    const std::size_t end = std::min(bytes.find('\n', start), bytes.size());
    failure.lines.push_back(bytes.substr(start, end - start));
    start = end + 1;
  }
  return failure;
}

// An error raised on another rank, reported here as it would have been there.
class ForwardedError : public Error {
 public:
  explicit ForwardedError(Failure failure)
      : Error(failure.lines.empty() ? std::string() : failure.lines.front(), "",
              static_cast<ExitCode>(failure.code)),
        lines_(std::move(failure.lines)) {}
  [[nodiscard]] std::vector<std::string> lines() const override { return lines_; }

 private:
  std::vector<std::string> lines_;
};

// "kvtier: error: X" -> "kvtier: error: rank 3: X"
Failure on_rank(Failure failure, int rank) {
  const std::string prefix = format_error_line("", "");
  for (std::string& line : failure.lines) {
    if (line.rfind(prefix, 0) == 0) {
      line.insert(prefix.size(), "rank " + std::to_string(rank) + ": ");
    }
  }
  return failure;
}

// Rank 0's side of the exchange, called by PointRunner::run between its waits.
class Coordinator {
 public:
  Coordinator(int ranks, fs::path scratch)
      : workers_(static_cast<std::size_t>(ranks)), scratch_(std::move(scratch)) {}

  // Handles every message that has arrived; returns whether a worker still holds points or has
  // not been told there are none left.
  bool serve(detail::PointRunner& runner) {
    while (std::optional<Message> message = poll(MPI_ANY_SOURCE)) {
      try {
        handle(*message, runner);
      } catch (const std::exception& error) {
        abort_job(error.what());
      }
    }
    return std::any_of(workers_.begin() + 1, workers_.end(), [](const Worker& worker) {
      return !worker.told_done || worker.holding > 0;
    });
  }

  [[nodiscard]] const fs::path& scratch() const { return scratch_; }

 private:
  struct Worker {
    bool told_done = false;
    std::uint64_t holding = 0;
  };

  void handle(const Message& message, detail::PointRunner& runner) {
    Worker& worker = workers_.at(static_cast<std::size_t>(message.source));
    if (message.tag == kAsk) {
      hand_out(message.source, runner, get<std::uint32_t>(message.bytes, 0));
      return;
    }
    const auto slot = get<std::uint64_t>(message.bytes, 0);
    if (worker.holding == 0 || slot >= runner.slots()) {
      abort_job("rank " + std::to_string(message.source) +
                " returned a point it was not given (slot " + std::to_string(slot) + ")");
    }
    --worker.holding;
    if (message.tag == kResult) {
      ensure_scratch();
      runner.store_computed(static_cast<std::size_t>(slot),
                            std::string_view(message.bytes).substr(sizeof(std::uint64_t)),
                            scratch_);
    } else {
      runner.fail(runner.point(static_cast<std::size_t>(slot)),
                  std::make_exception_ptr(ForwardedError(on_rank(
                      decode_failure(message.bytes, sizeof(std::uint64_t)), message.source))));
    }
    hand_out(message.source, runner, 1);
  }

  void hand_out(int rank, detail::PointRunner& runner, std::uint32_t count) {
    Worker& worker = workers_.at(static_cast<std::size_t>(rank));
    for (std::uint32_t i = 0; i < count && !worker.told_done; ++i) {
      const std::optional<std::size_t> slot = runner.take_for_elsewhere();
      if (!slot) {
        send(rank, kDone, {});
        worker.told_done = true;
        return;
      }
      std::string bytes;
      put(bytes, static_cast<std::uint64_t>(*slot));
      put(bytes, runner.point(*slot));
      send(rank, kAssign, bytes);
      ++worker.holding;
    }
  }

  // Made (again) before each result: the local threads remove an empty OUT/.tmp as they finish.
  void ensure_scratch() { (void)detail::make_scratch(scratch_); }

  std::vector<Worker> workers_;  // by rank; rank 0's entry unused
  fs::path scratch_;
};

// A worker's points: taken by its threads, results returned to its MPI thread.
class WorkerQueue {
 public:
  struct Outcome {
    std::uint64_t slot = 0;
    Tag tag = kResult;
    std::string bytes;  // after the slot: the point file, or the encoded failure
  };

  void push(std::uint64_t slot, std::uint64_t point) {
    {
      const std::lock_guard lock(mutex_);
      todo_.emplace_back(slot, point);
    }
    changed_.notify_all();
  }
  void close() {
    {
      const std::lock_guard lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }
  // For its threads: the next point, or nullopt once closed and empty.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> take() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return closed_ || !todo_.empty(); });
    if (todo_.empty()) {
      return std::nullopt;
    }
    auto next = todo_.front();
    todo_.pop_front();
    return next;
  }
  void finish(Outcome outcome) {
    {
      const std::lock_guard lock(mutex_);
      done_.push_back(std::move(outcome));
    }
    changed_.notify_all();
  }
  // For the MPI thread: what has finished, after waiting at most `wait` for something to.
  std::deque<Outcome> finished(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, wait, [this] { return !done_.empty(); });
    return std::exchange(done_, {});
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> todo_;
  std::deque<Outcome> done_;
  bool closed_ = false;
};

}  // namespace

bool MpiJob::available() {
  return true;
}

MpiJob::MpiJob() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw ConfigError(
        "this MPI library cannot be used from a threaded program (MPI_THREAD_FUNNELED)");
  }
  MPI_Comm_rank(world(), &rank_);
  MPI_Comm_size(world(), &size_);
}

MpiJob::~MpiJob() {
  MPI_Finalize();
}

void MpiJob::barrier() const {
  MPI_Barrier(world());
}

int MpiJob::agree(const std::string& spec_hash, const std::exception_ptr& failure) const {
  const std::string mine = failure ? "E" + encode_failure(failure_of(failure)) : "H" + spec_hash;
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, world());
  std::vector<int> offsets(static_cast<std::size_t>(size_), 0);
  std::string all;
  if (rank_ == 0) {
    for (std::size_t r = 1; r < lengths.size(); ++r) {
      offsets[r] = offsets[r - 1] + lengths[r - 1];
    }
    all.resize(static_cast<std::size_t>(offsets.back()) + static_cast<std::size_t>(lengths.back()));
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, world());
  if (rank_ != 0) {
    return broadcast_code(0);
  }
  std::vector<std::string> answers;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    answers.push_back(
        all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
  }
  std::optional<Failure> first;  // the lowest rank's problem
  for (std::size_t r = 0; r < answers.size() && !first; ++r) {
    const int rank = static_cast<int>(r);
    if (answers[r].front() == 'E') {
      first = on_rank(decode_failure(answers[r], 1), rank);
    } else if (answers[0].front() == 'H' && answers[r] != answers[0]) {
      first = Failure{
          static_cast<int>(ExitCode::kUsageOrConfig),
          {format_error_line("rank " + std::to_string(rank) + " loaded another spec (hash " +
                                 answers[r].substr(1) + ", rank 0's is " + spec_hash +
                                 "): every rank must read the same spec and --set values",
                             "")}};
    }
  }
  broadcast_code(first ? first->code : 0);
  if (failure) {
    std::rethrow_exception(failure);
  }
  if (first) {
    throw ForwardedError(std::move(*first));
  }
  return 0;
}

RunSummary MpiJob::coordinate(const Sweep& sweep, const config::ConfigLoader& loader,
                              const RunOptions& options) const {
  Coordinator coordinator(size_, options.out / detail::kScratch /
                                     (std::to_string(static_cast<long>(::getpid())) + "-mpi"));
  bool started = false;
  const auto serve = [&](detail::PointRunner& runner) {
    if (!started) {
      started = true;
      broadcast_code(0);  // the folder is claimed: the workers may ask for points
    }
    return coordinator.serve(runner);
  };
  const auto remove_scratch = [&coordinator] {
    std::error_code ignored;
    fs::remove_all(coordinator.scratch(), ignored);
    fs::remove(coordinator.scratch().parent_path(), ignored);  // only when empty
  };
  RunSummary summary;
  try {
    summary = detail::run_sweep_served(sweep, loader, options, serve);
  } catch (...) {
    // Before the start the workers end there; after it, at the end.
    broadcast_code(failure_of(std::current_exception()).code);
    remove_scratch();
    throw;
  }
  broadcast_code(0);
  remove_scratch();
  return summary;
}

int MpiJob::work(const Sweep& sweep, const config::ConfigLoader& loader,
                 const RunOptions& options) const {
  if (const int code = broadcast_code(0); code != 0) {
    return code;
  }
  const unsigned jobs = std::max(1U, options.jobs);
  {
    std::string ask;
    put(ask, static_cast<std::uint32_t>(jobs));
    send(0, kAsk, ask);
  }
  WorkerQueue queue;
  serving::DemandMemo memo;
  std::vector<std::thread> threads;
  threads.reserve(jobs);
  for (unsigned j = 0; j < jobs; ++j) {
    threads.emplace_back([&] {
      while (const auto next = queue.take()) {
        WorkerQueue::Outcome outcome;
        outcome.slot = next->first;
        try {
          const std::vector<Row> rows =
              simulate_point(sweep, next->second, loader, memo, options.out / "demand-cache");
          outcome.bytes = point_file_csv(rows, sweep.axis_columns);
        } catch (...) {
          outcome.tag = kFailed;
          outcome.bytes = encode_failure(failure_of(std::current_exception()));
        }
        queue.finish(std::move(outcome));
      }
    });
  }
  std::uint64_t holding = 0;
  bool done = false;
  while (!done || holding > 0) {
    for (WorkerQueue::Outcome& outcome : queue.finished(std::chrono::milliseconds(1))) {
      std::string bytes;
      put(bytes, outcome.slot);
      bytes += outcome.bytes;
      send(0, outcome.tag, bytes);
      --holding;
    }
    while (std::optional<Message> message = poll(0)) {
      if (message->tag == kAssign && message->bytes.size() == 2 * sizeof(std::uint64_t)) {
        queue.push(get<std::uint64_t>(message->bytes, 0),
                   get<std::uint64_t>(message->bytes, sizeof(std::uint64_t)));
        ++holding;
      } else if (message->tag == kDone) {
        done = true;
      } else {
        abort_job("rank " + std::to_string(rank_) + " got a message it cannot read (tag " +
                  std::to_string(message->tag) + ")");
      }
    }
  }
  queue.close();
  for (std::thread& thread : threads) {
    thread.join();
  }
  return broadcast_code(0);
}

}  // namespace kvtier::sweep
