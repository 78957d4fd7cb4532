#include "kernels/safetensors.hpp"

#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "kernels/impl/json_file.hpp"
#include "kernels/mapped_file.hpp"

namespace kvtier::kernels {
namespace {

using Json = nlohmann::json;

// A header larger than this is not a safetensors header (the format's own limit is 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

std::size_t dtype_size_or_zero(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") {
    return 4;
  }
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") {
    return 2;
  }
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") {
    return 8;
  }
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

// A header list of non-negative integers (shape, data_offsets). nlohmann's get<> would convert
// a float such as 1e30 or a negative number out of range (undefined or wrapped), so each item
// is checked first.
std::vector<std::uint64_t> natural_numbers(const Json& list, const char* field,
                                           const std::string& tensor, const std::string& where) {
  const auto refuse = [&] {
    return DataError(
        "tensor '" + tensor + "' field '" + field + "' must be a list of non-negative integers",
        where);
  };
  if (!list.is_array()) {
    throw refuse();
  }
  std::vector<std::uint64_t> numbers;
  for (const Json& item : list) {
    if (!item.is_number_unsigned()) {  // the parser stores every integer >= 0 as unsigned
      throw refuse();
    }
    numbers.push_back(item.get<std::uint64_t>());
  }
  return numbers;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : path_(path), file_(std::make_shared<const MappedFile>(path)) {
  const std::string where = path.string();
  const std::span<const std::byte> bytes = file_->bytes();
  std::uint64_t header_bytes = 0;
  if (bytes.size() < sizeof(header_bytes)) {
    throw DataError("file too short for a safetensors header", where);
  }
  std::memcpy(&header_bytes, bytes.data(), sizeof(header_bytes));
  if (header_bytes > kMaxHeaderBytes || header_bytes + 8 > bytes.size()) {
    throw DataError("safetensors header length " + std::to_string(header_bytes) +
                        " does not fit the file (" + std::to_string(bytes.size()) + " bytes)",
                    where);
  }
  data_offset_ = 8 + static_cast<std::size_t>(header_bytes);
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data()) + 8,
                                     static_cast<std::size_t>(header_bytes));
  Json header;
  try {
    header = Json::parse(header_text);
  } catch (const Json::exception& error) {
    throw DataError(std::string("invalid safetensors header JSON: ") + error.what(), where);
  }
  if (!header.is_object()) {
    throw DataError("safetensors header is not a JSON object", where);
  }
  const std::size_t data_bytes = bytes.size() - data_offset_;
  for (const auto& [name, description] : header.items()) {
    if (name == "__metadata__") {
      continue;
    }
    try {
      Entry entry;
      entry.dtype = description.at("dtype").get<std::string>();
      const auto offsets =
          natural_numbers(description.at("data_offsets"), "data_offsets", name, where);
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes) {
        throw DataError("tensor '" + name + "' has data_offsets outside the file's data", where);
      }
      entry.begin = offsets[0];
      entry.end = offsets[1];
      const std::size_t element = dtype_size_or_zero(entry.dtype);
      if (element == 0) {
        throw DataError("tensor '" + name + "' has unknown dtype '" + entry.dtype + "'", where);
      }
      // The byte count is multiplied out without wrapping: a wrapped product could equal the
      // span and pass a shape of 2^64 elements as a tensor of none.
      std::size_t tensor_bytes = element;
      for (const std::uint64_t extent :
           natural_numbers(description.at("shape"), "shape", name, where)) {
        if (extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
            (extent != 0 && tensor_bytes > std::numeric_limits<std::size_t>::max() / extent)) {
          throw DataError("tensor '" + name + "' has a shape too large to address", where);
        }
        tensor_bytes *= extent;
        entry.shape.push_back(static_cast<std::int64_t>(extent));
      }
      if (tensor_bytes != entry.end - entry.begin) {
        throw DataError("tensor '" + name + "' spans " + std::to_string(entry.end - entry.begin) +
                            " bytes; " + entry.dtype + " " + shape_text(entry.shape) + " needs " +
                            std::to_string(tensor_bytes),
                        where);
      }
      entries_.emplace(name, std::move(entry));
    } catch (const Json::exception& error) {
      throw DataError("tensor '" + name + "' has a malformed header entry: " + error.what(), where);
    }
  }
}

bool SafetensorsFile::contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

RawTensor SafetensorsFile::tensor(std::string_view name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end()) {
    throw DataError("missing tensor '" + std::string(name) + "'", path_.string());
  }
  const Entry& entry = found->second;
  RawTensor raw;
  raw.name = std::string(name);
  if (entry.dtype == "F32") {
    raw.dtype = TensorDtype::kF32;
  } else if (entry.dtype == "F16") {
    raw.dtype = TensorDtype::kF16;
  } else if (entry.dtype == "BF16") {
    raw.dtype = TensorDtype::kBF16;
  } else {
    throw DataError("tensor '" + raw.name + "' has dtype " + entry.dtype +
                        "; the engine reads F32, F16 and BF16",
                    path_.string());
  }
  raw.shape = entry.shape;
  raw.bytes = file_->bytes().subspan(data_offset_ + entry.begin, entry.end - entry.begin);
  return raw;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) {
    names.push_back(name);
  }
  return names;
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_directory(
    const std::filesystem::path& directory) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.directory_ = directory;
  const std::filesystem::path single = directory / "model.safetensors";
  const std::filesystem::path index = directory / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  if (std::filesystem::exists(index)) {
    const Json index_json = read_json_file(index);
    if (!index_json.contains("weight_map") || !index_json["weight_map"].is_object()) {
      throw DataError("index has no 'weight_map' object", index.string());
    }
    std::map<std::string, std::size_t> shard_of_name;
    for (const auto& [tensor, shard] : index_json["weight_map"].items()) {
      // A shard is a file of the model's folder: a path could read files outside it.
      const std::string name = shard.is_string() ? shard.get<std::string>() : std::string();
      if (name.empty() || name == "." || name == ".." ||
          std::filesystem::path(name).filename() != name) {
        throw DataError(
            "weight_map entry '" + tensor + "' is not a file name of the model's folder",
            index.string());
      }
      const auto [it, inserted] = shard_of_name.emplace(name, shard_names.size());
      if (inserted) {
        shard_names.push_back(it->first);
      }
    }
  } else if (std::filesystem::exists(single)) {
    shard_names.emplace_back("model.safetensors");
  } else {
    throw DataError("no model.safetensors or model.safetensors.index.json", directory.string());
  }
  for (const std::string& shard : shard_names) {
    auto file = std::make_shared<const SafetensorsFile>(directory / shard);
    for (const std::string& name : file->names()) {
      const auto [it, inserted] =
          checkpoint.file_of_tensor_.emplace(name, checkpoint.files_.size());
      if (!inserted) {
        throw DataError("tensor '" + name + "' appears in two shards",
                        (directory / shard).string());
      }
    }
    checkpoint.files_.push_back(std::move(file));
  }
  return checkpoint;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
  return file_of_tensor_.find(name) != file_of_tensor_.end();
}

RawTensor SafetensorsCheckpoint::tensor(std::string_view name) const {
  const auto found = file_of_tensor_.find(name);
  if (found == file_of_tensor_.end()) {
    throw DataError("missing tensor '" + std::string(name) + "'", directory_.string());
  }
  return files_[found->second]->tensor(name);
}

std::string SafetensorsCheckpoint::where(std::string_view name) const {
  const auto found = file_of_tensor_.find(name);
  return found == file_of_tensor_.end() ? directory_.string()
                                        : files_[found->second]->path().string();
}

void SafetensorsCheckpoint::keep_mappings(WeightStorage& storage) const {
  for (const auto& file : files_) {
    storage.keep(file->mapping());
  }
}

}  // namespace kvtier::kernels
