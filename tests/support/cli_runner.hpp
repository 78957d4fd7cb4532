#pragma once
// Runs the kvtier binary as a user would, capturing stdout, stderr and the exit code.

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/fixtures.hpp"
#include "tests/support/paths.hpp"

namespace kvtier::test {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// A folder of this test process's own, made on first use.
inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "kvtier-cli-XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    REQUIRE(made != nullptr);
    return std::filesystem::path(made);
  }();
  return dir;
}

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `args` is passed through the shell: tests quote what needs quoting. `environment` is put in
// front of the command ("SOURCE_DATE_EPOCH=0").
inline CliResult run_kvtier(const std::string& args, const std::string& environment = "") {
  const std::filesystem::path out = scratch_dir() / "stdout";
  const std::filesystem::path err = scratch_dir() / "stderr";
  const std::string command = environment + (environment.empty() ? "" : " ") + "'" +
                              kvtier::test::kvtier_binary() + "' " + args + " >'" + out.string() +
                              "' 2>'" + err.string() + "' </dev/null";
  const int status = std::system(command.c_str());
  CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = slurp(out);
  result.err = slurp(err);
  return result;
}

// A path in single quotes, for the shell.
inline std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

// A failed command as the CLI must report it: the exit code, nothing on stdout, and exactly one
// line on stderr, "kvtier: error: ..." containing `text`.
inline void expect_one_line_error(const CliResult& result, int exit_code, const std::string& text) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == exit_code);
  CHECK(result.out.empty());
  CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(text));
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
}

}  // namespace kvtier::test
