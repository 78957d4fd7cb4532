#pragma once
// Output files are written to a temporary name in the same folder and renamed into place, so an
// interrupted run never leaves a half-written file that looks whole.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "common/errors.hpp"

namespace kvtier {

inline void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
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
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(temporary, error);
      throw Error("cannot write output file", temporary.string(), ExitCode::kRuntimeFailure);
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw Error("cannot move output file into place", path.string(), ExitCode::kRuntimeFailure);
  }
}

}  // namespace kvtier
