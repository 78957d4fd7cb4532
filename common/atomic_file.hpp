#pragma once
// Output files are written to a temporary name in the same folder and renamed into place, so an
// interrupted run never leaves a half-written file that looks whole.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.hpp"

namespace kvtier {

namespace detail {

// Writes `content` beside `path` under a temporary name and returns that name.
inline std::filesystem::path write_temporary(const std::filesystem::path& path,
                                             std::string_view content) {
  std::error_code error;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      throw Error("cannot create folder: " + error.message(), path.parent_path().string(),
                  ExitCode::kRuntimeFailure);
    }
  }
  const std::filesystem::path temporary =
      path.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.flush();
  if (!out) {
    out.close();
    std::filesystem::remove(temporary, error);
    throw Error("cannot write output file", temporary.string(), ExitCode::kRuntimeFailure);
  }
  return temporary;
}

inline void move_into_place(const std::filesystem::path& temporary,
                            const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw Error("cannot move output file into place", path.string(), ExitCode::kRuntimeFailure);
  }
}

}  // namespace detail

inline void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  detail::move_into_place(detail::write_temporary(path, content), path);
}

struct OutputFile {
  std::filesystem::path path;
  std::string_view content;
};

// Files that belong together (a report and its tables): every one is written to its temporary
// before any is renamed, and a folder in the way of one is found before any is renamed, so a
// failed run leaves the previous set as it was rather than half replaced.
inline void write_files_atomically(std::span<const OutputFile> files) {
  std::vector<std::filesystem::path> temporaries;
  const auto remove_temporaries = [&temporaries] {
    std::error_code ignored;
    for (const std::filesystem::path& temporary : temporaries) {
      std::filesystem::remove(temporary, ignored);
    }
  };
  try {
    for (const OutputFile& file : files) {
      temporaries.push_back(detail::write_temporary(file.path, file.content));
    }
  } catch (const Error&) {
    remove_temporaries();
    throw;
  }
  for (const OutputFile& file : files) {
    std::error_code error;
    if (std::filesystem::is_directory(file.path, error)) {
      remove_temporaries();
      throw Error("cannot move output file into place: a folder has its name", file.path.string(),
                  ExitCode::kRuntimeFailure);
    }
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    detail::move_into_place(temporaries[i], files[i].path);
  }
}

}  // namespace kvtier
