#pragma once
// The error types that cross module boundaries. Each layer throws its own kind; the CLI catches
// them at the top and turns each into one line on stderr and the documented exit code.

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier {

enum class ExitCode : int {
  kOk = 0,
  kRuntimeFailure = 1,
  kUsageOrConfig = 2,
  kBadData = 3,
};

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string where, ExitCode code)
      : std::runtime_error(std::move(what)), where_(std::move(where)), code_(code) {}

  // File, line:column and field (or dataset) the problem is in; empty when it has no place.
  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  [[nodiscard]] ExitCode exit_code() const noexcept { return code_; }

  // The lines to print, one per problem; most errors have one, a config check may find several.
  [[nodiscard]] virtual std::vector<std::string> lines() const;

 private:
  std::string where_;
  ExitCode code_;
};

// A configuration, preset or command line that cannot be used as given (exit 2).
class ConfigError : public Error {
 public:
  explicit ConfigError(std::string what, std::string where = {})
      : Error(std::move(what), std::move(where), ExitCode::kUsageOrConfig) {}
};

// Input data (a trace, a checkpoint, a measurement file) that is malformed (exit 3).
class DataError : public Error {
 public:
  explicit DataError(std::string what, std::string where = {})
      : Error(std::move(what), std::move(where), ExitCode::kBadData) {}
};

// The one-line form every diagnostic takes: "kvtier: error: <what> (<where>)".
inline std::string format_error_line(std::string_view what, std::string_view where) {
  std::string line = "kvtier: error: ";
  line += what;
  if (!where.empty()) {
    line += " (";
    line += where;
    line += ")";
  }
  return line;
}

inline std::vector<std::string> Error::lines() const {
  return {format_error_line(what(), where())};
}

}  // namespace kvtier
