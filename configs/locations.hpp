#pragma once
// Where each value of a loaded config came from, keyed by field path
// ("hardware.node.gpu.compute[1].dense_tflops"), so that every diagnostic can name the file,
// line and column of the value it is about — a preset file, the user's file or a `--set`.

#include <map>
#include <string>
#include <string_view>

namespace kvtier::config {

struct SourcePosition {
  std::string file;  // a file name, or "--set PATH=VALUE" for a command-line override
  int line = 0;      // 1-based; 0 when only the file is known
  int column = 0;    // 1-based
};

[[nodiscard]] std::string describe(const SourcePosition& position);

class LocationMap {
 public:
  explicit LocationMap(std::string default_file = {}) : default_file_(std::move(default_file)) {}

  void set(const std::string& path, SourcePosition position);
  // The position of `path`, else of its closest recorded ancestor, else the default file.
  [[nodiscard]] SourcePosition nearest(std::string_view path) const;
  // Copies every entry of `other`, its paths placed under `prefix`.
  void insert_under(std::string_view prefix, const LocationMap& other);
  // Forgets `prefix` and everything beneath it.
  void erase_under(std::string_view prefix);
  [[nodiscard]] const std::string& default_file() const noexcept { return default_file_; }
  [[nodiscard]] const std::map<std::string, SourcePosition, std::less<>>& entries() const noexcept {
    return entries_;
  }

 private:
  std::string default_file_;
  std::map<std::string, SourcePosition, std::less<>> entries_;
};

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
[[nodiscard]] std::string join_path(std::string_view prefix, std::string_view name);

}  // namespace kvtier::config
