#pragma once
// A sweep folder's files (docs/SWEEPS.md, "Outputs"): the manifest that says which spec it
// belongs to, the point files, and the results pair. Shared by the runner, the merge and the
// MPI coordinator; not part of the module's interface.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "sweep/sweep.hpp"

namespace kvtier::sweep::detail {

inline constexpr const char* kManifest = "sweep.json";
inline constexpr const char* kPoints = "points";
inline constexpr const char* kScratch = ".tmp";

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

[[nodiscard]] Manifest manifest_of(const Sweep& sweep);
[[nodiscard]] Manifest read_manifest(const std::filesystem::path& folder);

// Refuses (ConfigError) a folder that belongs to another spec or kvtier version; claims a new one.
void claim_folder(const std::filesystem::path& out, const Manifest& manifest);

// Removes the scratch folders (OUT/.tmp/PID-THREAD) of sweeps killed before they could: those
// whose process is gone.
void remove_stale_scratch(const std::filesystem::path& out);

// Creates `folder` (OUT/.tmp/NAME) for the calling thread's temporary files. Other threads
// remove OUT/.tmp when it is empty as they finish, which can fall between create_directories
// making OUT/.tmp and making NAME in it; so this tries again until NAME is there. Returns the
// last error when it never is.
[[nodiscard]] std::error_code make_scratch(const std::filesystem::path& folder);

[[nodiscard]] std::filesystem::path point_file(const std::filesystem::path& folder,
                                               std::uint64_t point);
// A point file's rows, checked against the point they claim to be (DataError otherwise).
[[nodiscard]] std::vector<Row> read_point(const std::filesystem::path& folder, std::uint64_t point,
                                          const Manifest& manifest);
// Writes `content` to `path` under a temporary name in `scratch`, a folder of the calling
// thread's own, then renames it into place.
void write_point_file(const std::filesystem::path& path, const std::filesystem::path& scratch,
                      std::string_view content);

// results.csv, results.h5 and results.html as a set: the CSV is renamed into place last.
void write_results(const std::filesystem::path& out, const ResultTable& table,
                   const Manifest& manifest);

// Points whose rows carry an error.
[[nodiscard]] std::uint64_t failed_points(const ResultTable& table);

}  // namespace kvtier::sweep::detail
