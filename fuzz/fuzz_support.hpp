#pragma once
// What the libFuzzer harnesses share: whole-file reads and writes, the -write_seeds=DIR flag, and
// printing a refused input's error when KVTIER_FUZZ_PRINT_ERRORS is set (to check that seeds
// load, or to read what a minimised input does).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>

#include "common/errors.hpp"

namespace kvtier::fuzz {

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::filesystem::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

// With -write_seeds=DIR among the arguments, calls `write_seeds(DIR)` and exits the process.
inline void write_seeds_if_asked(
    int argc, char** argv, const std::function<void(const std::filesystem::path&)>& write_seeds) {
  constexpr std::string_view kSeedsFlag = "-write_seeds=";
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument.starts_with(kSeedsFlag)) {
      write_seeds(std::filesystem::path(argument.substr(kSeedsFlag.size())));
      std::exit(0);
    }
  }
}

inline void print_error_if_asked(const Error& error) {
  if (std::getenv("KVTIER_FUZZ_PRINT_ERRORS") != nullptr) {
    for (const std::string& line : error.lines()) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
}

}  // namespace kvtier::fuzz
