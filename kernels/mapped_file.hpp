#pragma once
// A read-only memory map of a whole file. Checkpoints are mapped, never read into memory, so a
// 16 GB model costs page cache rather than a private copy, and float32 tensors are used in place.

#include <cstddef>
#include <filesystem>
#include <span>

namespace kvtier::kernels {

class MappedFile {
 public:
  // Throws DataError when the file cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&&) = delete;
  MappedFile& operator=(MappedFile&&) = delete;

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvtier::kernels
