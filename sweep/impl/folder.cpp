// A sweep folder's files: manifest, point files, the results pair (sweep/impl/folder.hpp).

#include "sweep/impl/folder.hpp"

#include <google/protobuf/text_format.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <iterator>
#include <limits>

#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "sweep/impl/results_html.hpp"

namespace kvtier::sweep::detail {
namespace {

namespace fs = std::filesystem;

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

}  // namespace

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

void write_results(const fs::path& out, const ResultTable& table, const Manifest& manifest) {
  TemporaryFile csv = kvtier::detail::write_temporary(out / "results.csv", results_csv(table));
  TemporaryFile html =
      kvtier::detail::write_temporary(out / "results.html", results_html(table, manifest));
  write_results_h5(out / "results.h5", table);
  kvtier::detail::move_into_place(html, out / "results.html");
  kvtier::detail::move_into_place(csv, out / "results.csv");
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

std::error_code make_scratch(const fs::path& folder) {
  constexpr int kAttempts = 100;
  std::error_code error;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    error.clear();
    fs::create_directories(folder, error);
    if (fs::is_directory(folder)) {
      return {};
    }
  }
  return error ? error : std::make_error_code(std::errc::no_such_file_or_directory);
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

}  // namespace kvtier::sweep::detail
