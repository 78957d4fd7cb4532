#pragma once
// Reading a whole input file whose size has a sane bound for its kind. A path that is not a file
// of that size, such as /dev/zero, a FIFO that never ends or a multi-gigabyte file named by
// mistake, is refused after reading at most one byte past the bound, instead of filling memory.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace kvtier {

// Bounds for the kinds of text input kvtier reads whole. Configs, references, live measurement
// files (a step series of 100k steps is about 15 MB), published-figure tables and prompts
// are far below the first; request files (a week of a busy service's arrivals) below the second.
inline constexpr std::uint64_t kTextInputLimitBytes = std::uint64_t{256} << 20;  // 256 MiB
inline constexpr std::uint64_t kRequestFileLimitBytes = std::uint64_t{8} << 30;  // 8 GiB

struct InputText {
  enum class Status { kRead, kCannotOpen, kFolder, kTooLarge, kReadError };
  Status status = Status::kCannotOpen;
  std::string text;
};

[[nodiscard]] inline InputText read_input_file(const std::filesystem::path& path,
                                               std::uint64_t limit_bytes) {
  InputText input;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    input.status = InputText::Status::kFolder;
    return input;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    input.status = InputText::Status::kCannotOpen;
    return input;
  }
  // Regular files are read in one go; others (pipes, devices) in blocks up to the bound.
  constexpr std::size_t kBlock = std::size_t{1} << 20;
  std::string block(kBlock, '\0');
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(kBlock));
    input.text.append(block.data(), static_cast<std::size_t>(in.gcount()));
    if (input.text.size() > limit_bytes) {
      input.status = InputText::Status::kTooLarge;
      input.text.clear();
      return input;
    }
  }
  input.status = in.bad() ? InputText::Status::kReadError : InputText::Status::kRead;
  return input;
}

// "256 MiB": a bound as the errors state it.
[[nodiscard]] inline std::string input_limit_text(std::uint64_t limit_bytes) {
  return limit_bytes >= (std::uint64_t{1} << 30) ? std::to_string(limit_bytes >> 30) + " GiB"
                                                 : std::to_string(limit_bytes >> 20) + " MiB";
}

}  // namespace kvtier
