// Running a sweep into its folder on threads, resuming it, and merging shard folders.

#include <google/protobuf/text_format.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "serving/demand_memo.hpp"
#include "sweep/sweep.hpp"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::sweep {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kManifest = "sweep.json";
constexpr const char* kPoints = "points";
constexpr const char* kScratch = ".tmp";

// What identifies the sweep a folder belongs to, and what merging needs without the spec.
struct Manifest {
  std::string name;
  std::string spec_hash;
  std::string kvtier_version;
  std::uint64_t points = 0;
  std::vector<std::string> axis_paths;
  std::vector<std::string> axis_columns;
  std::vector<std::vector<std::string>> axis_values;
  std::string mode;
  std::string spec_text;  // the resolved spec, for provenance
};

Manifest manifest_of(const Sweep& sweep) {
  Manifest manifest;
  manifest.name = sweep.spec.name();
  manifest.spec_hash = sweep.hash;
  manifest.kvtier_version = kvtier_version();
  manifest.points = point_count(sweep.spec);
  manifest.axis_columns = sweep.axis_columns;
  for (const config::SweepAxis& axis : sweep.spec.axis()) {
    manifest.axis_paths.push_back(axis.path());
    manifest.axis_values.emplace_back(axis.values().begin(), axis.values().end());
  }
  manifest.mode = config::SweepMode_Name(sweep.spec.mode());
  (void)google::protobuf::TextFormat::PrintToString(sweep.spec, &manifest.spec_text);
  return manifest;
}

std::string manifest_json(const Manifest& manifest) {
  nlohmann::ordered_json json;
  json["schema"] = kSchema;
  json["name"] = manifest.name;
  json["spec_hash"] = manifest.spec_hash;
  json["kvtier_version"] = manifest.kvtier_version;
  json["mode"] = manifest.mode;
  json["points"] = manifest.points;
  json["axes"] = nlohmann::ordered_json::array();
  for (std::size_t a = 0; a < manifest.axis_columns.size(); ++a) {
    json["axes"].push_back({{"path", manifest.axis_paths[a]},
                            {"column", manifest.axis_columns[a]},
                            {"values", manifest.axis_values[a]}});
  }
  json["spec"] = manifest.spec_text;
  return json.dump(1) + "\n";
}

Manifest read_manifest(const fs::path& folder) {
  const fs::path path = folder / kManifest;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("not a sweep folder: no " + std::string(kManifest), path.string());
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Manifest manifest;
  try {
    const auto json = nlohmann::json::parse(text);
    if (json.at("schema").get<std::string>() != kSchema) {
      throw DataError("not a " + std::string(kSchema) + " manifest", path.string());
    }
    manifest.name = json.at("name").get<std::string>();
    manifest.spec_hash = json.at("spec_hash").get<std::string>();
    manifest.kvtier_version = json.at("kvtier_version").get<std::string>();
    manifest.mode = json.at("mode").get<std::string>();
    manifest.points = json.at("points").get<std::uint64_t>();
    for (const auto& axis : json.at("axes")) {
      manifest.axis_paths.push_back(axis.at("path").get<std::string>());
      manifest.axis_columns.push_back(axis.at("column").get<std::string>());
      manifest.axis_values.push_back(axis.at("values").get<std::vector<std::string>>());
    }
    manifest.spec_text = json.at("spec").get<std::string>();
  } catch (const nlohmann::json::exception& error) {
    throw DataError(std::string("unreadable sweep manifest: ") + error.what(), path.string());
  }
  return manifest;
}

fs::path point_file(const fs::path& folder, std::uint64_t point) {
  return folder / kPoints / (std::to_string(point) + ".csv");
}

// The values of `point` from the manifest (the spec's enumeration, without the spec).
std::vector<std::string> manifest_values(const Manifest& manifest, std::uint64_t point) {
  std::vector<std::string> values(manifest.axis_values.size());
  for (std::size_t a = manifest.axis_values.size(); a-- > 0;) {
    const auto length = static_cast<std::uint64_t>(manifest.axis_values[a].size());
    if (manifest.mode == "ZIP") {
      values[a] = manifest.axis_values[a].at(point);
    } else {
      values[a] = manifest.axis_values[a].at(point % length);
      point /= length;
    }
  }
  return values;
}

// A point file's rows, checked against the point they claim to be.
std::vector<Row> read_point(const fs::path& folder, std::uint64_t point, const Manifest& manifest) {
  const fs::path path = point_file(folder, point);
  std::vector<Row> rows = read_point_file(path, manifest.axis_columns);
  const std::vector<std::string> values = manifest_values(manifest, point);
  for (const Row& row : rows) {
    if (row.point != point || row.axis_values != values) {
      throw DataError("point file holds another point than " + std::to_string(point),
                      path.string());
    }
  }
  return rows;
}

// Refuses a folder that belongs to another spec or kvtier version; claims a new one.
void claim_folder(const fs::path& out, const Manifest& manifest) {
  const fs::path path = out / kManifest;
  std::error_code error;
  if (fs::exists(path, error)) {
    const Manifest existing = read_manifest(out);
    if (existing.spec_hash != manifest.spec_hash) {
      throw ConfigError("this folder holds points of another sweep spec ('" + existing.name +
                            "', spec hash " + existing.spec_hash + "; this spec's is " +
                            manifest.spec_hash + "): use another --out, or delete the folder",
                        path.string());
    }
    if (existing.kvtier_version != manifest.kvtier_version) {
      throw ConfigError("this folder's points were computed by kvtier " + existing.kvtier_version +
                            ", this is " + manifest.kvtier_version +
                            ": use another --out, or delete the folder",
                        path.string());
    }
    return;
  }
  if (fs::exists(out / kPoints, error) && !fs::is_empty(out / kPoints, error)) {
    throw ConfigError("the folder holds point files but no " + std::string(kManifest) +
                          ", so their spec is unknown: use another --out, or delete the folder",
                      out.string());
  }
  write_file_atomically(path, manifest_json(manifest));
}

// The two results files as a set: the CSV waits under its temporary name until the HDF5 file is
// in place, so a failure leaves the previous pair (or none), never a new CSV beside an old HDF5.
void write_results(const fs::path& out, const ResultTable& table) {
  TemporaryFile csv = detail::write_temporary(out / "results.csv", results_csv(table));
  write_results_h5(out / "results.h5", table);
  detail::move_into_place(csv, out / "results.csv");
}

std::uint64_t failed_points(const ResultTable& table) {
  std::uint64_t failed = 0;
  std::uint64_t last = UINT64_MAX;
  for (const Row& row : table.rows) {
    if (!row.error.empty() && row.point != last) {
      ++failed;
      last = row.point;
    }
  }
  return failed;
}

// "3, 5-7, 9"
std::string ranges(const std::vector<std::uint64_t>& points) {
  std::string text;
  for (std::size_t i = 0; i < points.size();) {
    std::size_t j = i;
    while (j + 1 < points.size() && points[j + 1] == points[j] + 1) {
      ++j;
    }
    text += (text.empty() ? "" : ", ") + std::to_string(points[i]);
    if (j > i) {
      text += "-" + std::to_string(points[j]);
    }
    i = j + 1;
  }
  return text;
}

// Writes `content` to `path` under a temporary name in `scratch`, a folder of the calling
// thread's own, then renames it into place. Creating a file holds its folder's lock while the
// file system allocates the inode — slow on a busy ext4 — so temporary files made in the shared
// points/ folder serialised the threads (a profile showed them spinning on that lock); the
// rename into points/ is quick.
void write_point_file(const fs::path& path, const fs::path& scratch, std::string_view content) {
  const fs::path temporary = scratch / (path.filename().string() + ".tmp");
  std::error_code error;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      out.close();
      fs::remove(temporary, error);
      throw Error("cannot write point file", temporary.string(), ExitCode::kRuntimeFailure);
    }
  }
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, error);
    throw Error("cannot move point file into place: " + error.message(), path.string(),
                ExitCode::kRuntimeFailure);
  }
}

// Points run on `jobs` threads. Each thread takes the next point in index order, keeps it when
// the folder already holds its file (resuming), else simulates it and writes its file — so a
// kill loses at most the points in flight — and reads the file back: the table is what the
// point files hold, whether a point was resumed or computed, and all per-point file work runs
// in parallel. The first error (lowest point) is rethrown after all threads stop.
class PointRunner {
 public:
  PointRunner(const Sweep& sweep, const config::ConfigLoader& loader, const RunOptions& options,
              const Manifest& manifest, std::vector<std::uint64_t> points)
      : sweep_(sweep),
        loader_(loader),
        options_(options),
        manifest_(manifest),
        points_(std::move(points)),
        rows_(points_.size()) {}

  void run(Clock::time_point start) {
    const unsigned jobs =
        std::max(1U, std::min<unsigned>(options_.jobs, static_cast<unsigned>(points_.size())));
    std::vector<std::thread> threads;
    threads.reserve(jobs);
    for (unsigned j = 0; j < jobs && !points_.empty(); ++j) {
      threads.emplace_back([this, j] { work(j); });
    }
    {
      std::unique_lock lock(mutex_);
      while (finished_threads_ < threads.size()) {
        if (options_.progress) {
          lock.unlock();
          report(start);
          lock.lock();
        }
        changed_.wait_for(lock, std::chrono::milliseconds(250));
      }
    }
    for (std::thread& thread : threads) {
      thread.join();
    }
    if (!errors_.empty()) {
      std::rethrow_exception(errors_.begin()->second);
    }
  }

  void report(Clock::time_point start) const {
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

  // Every point's rows, in point order.
  [[nodiscard]] std::vector<Row> rows() {
    std::vector<Row> all;
    for (std::vector<Row>& point_rows : rows_) {
      std::move(point_rows.begin(), point_rows.end(), std::back_inserter(all));
    }
    return all;
  }
  [[nodiscard]] std::uint64_t resumed() const { return resumed_.load(); }
  [[nodiscard]] std::uint64_t replaced() const { return replaced_.load(); }
  [[nodiscard]] std::uint64_t computed() const { return computed_.load(); }

 private:
  void run_point(std::size_t slot, const fs::path& scratch) {
    const std::uint64_t point = points_[slot];
    const fs::path file = point_file(options_.out, point);
    std::error_code ignored;
    if (fs::exists(file, ignored)) {
      try {
        rows_[slot] = read_point(options_.out, point, manifest_);
        ++resumed_;
        return;
      } catch (const DataError&) {
        ++replaced_;  // damaged on disk or written by hand: computed again
      }
    }
    const std::vector<Row> rows =
        simulate_point(sweep_, point, loader_, memo_, options_.out / "demand-cache");
    write_point_file(file, scratch, point_file_csv(rows, sweep_.axis_columns));
    rows_[slot] = read_point(options_.out, point, manifest_);
    ++computed_;
  }

  void work(unsigned thread) {
    // OUT/.tmp/PID-THREAD: this thread's temporary files; empty again once the thread is done.
    const fs::path scratch =
        options_.out / kScratch /
        (std::to_string(static_cast<long>(::getpid())) + "-" + std::to_string(thread));
    std::error_code error;
    fs::create_directories(scratch, error);
    if (error) {
      const std::lock_guard lock(mutex_);
      errors_.emplace(0,
                      std::make_exception_ptr(Error("cannot create folder: " + error.message(),
                                                    scratch.string(), ExitCode::kRuntimeFailure)));
      stop_ = true;
    }
    while (!stop_.load()) {
      const std::size_t slot = next_.fetch_add(1);
      if (slot >= points_.size()) {
        break;
      }
      try {
        run_point(slot, scratch);
      } catch (...) {
        const std::lock_guard lock(mutex_);
        errors_.emplace(points_[slot], std::current_exception());
        stop_ = true;
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

}  // namespace

std::string kvtier_version() {
  return KVTIER_VERSION;
}

Shard parse_shard(const std::string& text) {
  // Digits only: std::stoull would take "-1" as 2^64 - 1 and skip leading blanks.
  const auto natural = [&text](std::string_view digits, std::uint64_t& value) {
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || parsed.ec != std::errc() || parsed.ptr != digits.data() + digits.size()) {
      throw ConfigError("--shard '" + text + "': expected K/N, e.g. 0/4");
    }
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string::npos) {
    throw ConfigError("--shard '" + text + "': expected K/N, e.g. 0/4");
  }
  Shard shard;
  const std::string_view whole = text;
  natural(whole.substr(0, slash), shard.index);
  natural(whole.substr(slash + 1), shard.count);
  if (shard.count == 0 || shard.index >= shard.count) {
    throw ConfigError("--shard '" + text +
                      (shard.count == 0 ? "': N must be at least 1"
                                        : "': K must be below N (0/" + std::to_string(shard.count) +
                                              " ... " + std::to_string(shard.count - 1) + "/" +
                                              std::to_string(shard.count) + ")"));
  }
  return shard;
}

// Removes the scratch folders (OUT/.tmp/PID-THREAD) of sweeps killed before they could: those
// whose process is gone. A live process's folders, another sweep's writing into the same
// folder, are left alone.
void remove_stale_scratch(const fs::path& out) {
  std::error_code error;
  const fs::path root = out / kScratch;
  for (fs::directory_iterator entry(root, error), end; !error && entry != end;
       entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    long pid = 0;
    const auto parsed = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (parsed.ec != std::errc() || parsed.ptr == name.data() + name.size() || *parsed.ptr != '-' ||
        pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove_all(entry->path(), ignored);
    }
  }
  std::error_code ignored;
  fs::remove(root, ignored);  // only when empty
}

RunSummary run_sweep(const Sweep& sweep, const config::ConfigLoader& loader,
                     const RunOptions& options) {
  const Clock::time_point start = Clock::now();
  const Manifest manifest = manifest_of(sweep);
  claim_folder(options.out, manifest);
  remove_stale_scratch(options.out);
  std::error_code error;
  fs::create_directories(options.out / kPoints, error);
  if (error) {
    throw Error("cannot create folder: " + error.message(), (options.out / kPoints).string(),
                ExitCode::kRuntimeFailure);
  }

  RunSummary summary;
  summary.total_points = manifest.points;
  std::vector<std::uint64_t> selected;
  for (std::uint64_t point = options.shard.index; point < manifest.points;
       point += options.shard.count) {
    selected.push_back(point);
  }
  summary.selected = selected.size();

  PointRunner runner(sweep, loader, options, manifest, std::move(selected));
  runner.run(start);
  summary.resumed = runner.resumed();
  summary.replaced = runner.replaced();
  summary.computed = runner.computed();
  summary.table =
      make_table(manifest.name, manifest.spec_hash, manifest.axis_columns, runner.rows());
  summary.failed_points = failed_points(summary.table);
  write_results(options.out, summary.table);
  if (options.progress) {
    runner.report(start);
  }
  return summary;
}

ResultTable merge_sweeps(std::span<const fs::path> folders, const fs::path& out) {
  if (folders.empty()) {
    throw ConfigError("merge needs at least one sweep folder");
  }
  std::vector<Manifest> manifests;
  for (const fs::path& folder : folders) {
    manifests.push_back(read_manifest(folder));
    const Manifest& first = manifests.front();
    const Manifest& last = manifests.back();
    if (last.spec_hash != first.spec_hash || last.kvtier_version != first.kvtier_version) {
      throw ConfigError("cannot merge different sweeps: " + folders.front().string() + " holds '" +
                            first.name + "' (spec hash " + first.spec_hash + ", kvtier " +
                            first.kvtier_version + "), " + folder.string() + " holds '" +
                            last.name + "' (spec hash " + last.spec_hash + ", kvtier " +
                            last.kvtier_version + ")",
                        (folder / kManifest).string());
    }
  }
  for (const fs::path& folder : folders) {
    std::error_code error;
    if (fs::equivalent(folder, out, error)) {
      throw ConfigError("--out is one of the folders being merged: merge into a folder of its own",
                        out.string());
    }
  }
  const Manifest& manifest = manifests.front();
  std::vector<Row> rows;
  std::vector<std::uint64_t> missing;
  std::error_code error;
  const auto file_bytes = [](const fs::path& path) {
    return read_input_file(path, kTextInputLimitBytes).text;
  };
  for (std::uint64_t point = 0; point < manifest.points; ++point) {
    const auto holder = std::find_if(folders.begin(), folders.end(), [&](const fs::path& folder) {
      return fs::exists(point_file(folder, point), error);
    });
    if (holder == folders.end()) {
      missing.push_back(point);
      continue;
    }
    std::vector<Row> point_rows = read_point(*holder, point, manifest);
    // One spec and kvtier version compute a point to the same bytes: copies that differ were
    // edited or damaged, and which to take is not the merge's to guess (nor the folders' order).
    std::optional<std::string> first_copy;  // read only when another folder holds the point
    for (auto other = std::next(holder); other != folders.end(); ++other) {
      if (!fs::exists(point_file(*other, point), error)) {
        continue;
      }
      if (!first_copy) {
        first_copy = file_bytes(point_file(*holder, point));
      }
      if (file_bytes(point_file(*other, point)) != *first_copy) {
        throw DataError("point " + std::to_string(point) + " differs from its copy in " +
                            point_file(*holder, point).string() +
                            ": one was edited or damaged; remove the wrong one",
                        point_file(*other, point).string());
      }
    }
    std::move(point_rows.begin(), point_rows.end(), std::back_inserter(rows));
  }
  if (!missing.empty()) {
    throw ConfigError("missing points " + ranges(missing) + " (" + std::to_string(missing.size()) +
                      " of " + std::to_string(manifest.points) +
                      "): no folder given holds them; run their shards first");
  }
  claim_folder(out, manifest);
  ResultTable table =
      make_table(manifest.name, manifest.spec_hash, manifest.axis_columns, std::move(rows));
  write_results(out, table);
  return table;
}

}  // namespace kvtier::sweep
