#pragma once
// Output files are written to a temporary name in the same folder and renamed into place, so an
// interrupted run never leaves a half-written file that looks whole.

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/errors.hpp"
#include "common/temporary_file.hpp"

namespace kvtier {

namespace detail {

// Writes `content` beside `path` under a temporary name and returns that name.
inline TemporaryFile write_temporary(const std::filesystem::path& path, std::string_view content) {
  std::error_code error;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      throw Error("cannot create folder: " + error.message(), path.parent_path().string(),
                  ExitCode::kRuntimeFailure);
    }
  }
  TemporaryFile temporary(path);
  errno = 0;
  std::ofstream out(temporary.path(), std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.flush();
  if (!out) {
    const int reason = errno;
    throw Error(std::string("cannot write output file") +
                    (reason != 0 ? ": " + std::system_category().message(reason) : ""),
                path.string(), ExitCode::kRuntimeFailure);
  }
  return temporary;
}

inline void move_into_place(TemporaryFile& temporary, const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::rename(temporary.path(), temporary.target(), error);
  if (error) {
    throw Error("cannot move output file into place: " + error.message(), path.string(),
                ExitCode::kRuntimeFailure);
  }
  temporary.release();
}

}  // namespace detail

inline void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  TemporaryFile temporary = detail::write_temporary(path, content);
  detail::move_into_place(temporary, path);
}

struct OutputFile {
  std::filesystem::path path;
  std::string_view content;
};

// Files that belong together (a report and its tables): every one is written to its temporary
// before any is renamed, and a folder in the way of one is found before any is renamed, so a
// failed run leaves the previous set as it was rather than half replaced.
inline void write_files_atomically(std::span<const OutputFile> files) {
  std::vector<TemporaryFile> temporaries;  // each removed by its destructor unless renamed
  temporaries.reserve(files.size());
  for (const OutputFile& file : files) {
    temporaries.push_back(detail::write_temporary(file.path, file.content));
  }
  for (const OutputFile& file : files) {
    std::error_code error;
    if (std::filesystem::is_directory(file.path, error)) {
      throw Error("cannot move output file into place: a folder has its name", file.path.string(),
                  ExitCode::kRuntimeFailure);
    }
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    detail::move_into_place(temporaries[i], files[i].path);
  }
}

}  // namespace kvtier
