#pragma once
// Hugging Face safetensors checkpoints: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the data. Files are memory-mapped; a
// sharded checkpoint (model.safetensors.index.json) maps every shard it names.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.hpp"

namespace kvtier::kernels {

class SafetensorsFile {
 public:
  // Parses and checks the header (offsets inside the file, sizes matching shapes); throws
  // DataError naming the file and the offending tensor.
  explicit SafetensorsFile(const std::filesystem::path& path);

  [[nodiscard]] bool contains(std::string_view name) const;
  // The tensor's bytes and shape; throws DataError when absent or of a dtype the engine does
  // not read (only F32, F16 and BF16 are).
  [[nodiscard]] RawTensor tensor(std::string_view name) const;
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] const std::shared_ptr<const MappedFile>& mapping() const { return file_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  struct Entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin = 0;
    std::size_t end = 0;
  };
  std::filesystem::path path_;
  std::shared_ptr<const MappedFile> file_;
  std::size_t data_offset_ = 0;
  std::map<std::string, Entry, std::less<>> entries_;
};

// All tensors of a Hugging Face model directory: model.safetensors, or the shards listed in
// model.safetensors.index.json.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open_directory(const std::filesystem::path& directory);

  [[nodiscard]] bool contains(std::string_view name) const;
  // Throws DataError "missing tensor 'NAME'" naming the checkpoint when absent.
  [[nodiscard]] RawTensor tensor(std::string_view name) const;
  // The file a tensor lives in (or the directory when absent), for diagnostics.
  [[nodiscard]] std::string where(std::string_view name) const;
  // Keeps every mapping alive in `storage`.
  void keep_mappings(WeightStorage& storage) const;

 private:
  std::filesystem::path directory_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, std::size_t, std::less<>> file_of_tensor_;
};

}  // namespace kvtier::kernels
