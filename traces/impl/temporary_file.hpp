#pragma once
// The output file's temporary name, removed unless the trace was finished. Internal to traces/.

#include <filesystem>

namespace kvtier::traces {

// FILE.tmp.PID next to FILE: renamed into place by finish(), removed by the destructor
// otherwise, so an interrupted run never leaves a trace that looks whole.
class TemporaryFile {
 public:
  explicit TemporaryFile(const std::filesystem::path& final_path);
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile();
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  void release() noexcept { released_ = true; }

 private:
  std::filesystem::path path_;
  bool released_ = false;
};

}  // namespace kvtier::traces
