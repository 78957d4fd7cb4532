// Running a sweep into its folder on threads, resuming it, and merging shard folders.

#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>
#include <system_error>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "sweep/impl/folder.hpp"
#include "sweep/impl/point_runner.hpp"
#include "sweep/sweep.hpp"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::sweep {
namespace {

namespace fs = std::filesystem;
using detail::claim_folder;
using detail::kManifest;
using detail::Manifest;
using detail::point_file;
using detail::read_manifest;
using detail::read_point;
using detail::write_results;

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

RunSummary run_sweep(const Sweep& sweep, const config::ConfigLoader& loader,
                     const RunOptions& options) {
  return detail::run_sweep_served(sweep, loader, options, {});
}

namespace detail {

RunSummary run_sweep_served(const Sweep& sweep, const config::ConfigLoader& loader,
                            const RunOptions& options, const PointRunner::Serve& serve) {
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
  runner.run(start, serve);
  summary.resumed = runner.resumed();
  summary.replaced = runner.replaced();
  summary.computed = runner.computed();
  summary.table =
      make_table(manifest.name, manifest.spec_hash, manifest.axis_columns, runner.rows());
  summary.failed_points = failed_points(summary.table);
  write_results(options.out, summary.table, manifest);
  if (options.progress) {
    runner.report(start);
  }
  return summary;
}

}  // namespace detail

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
  write_results(out, table, manifest);
  return table;
}

}  // namespace kvtier::sweep
