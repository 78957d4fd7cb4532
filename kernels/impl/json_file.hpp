#pragma once
// Reading a whole JSON file (config.json, tokenizer.json, safetensors indexes); a missing or
// malformed file is a DataError naming it.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw DataError("cannot open file", path.string());
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw DataError(std::string("invalid JSON: ") + error.what(), path.string());
  }
}

}  // namespace kvtier::kernels
