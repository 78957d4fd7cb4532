#include "configs/presets.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include <tuple>

#include "common/errors.hpp"

namespace kvtier::config {
namespace {

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

constexpr std::array<std::string_view, 5> kKinds = {"gpu", "host", "link", "node", "model"};

}  // namespace

PresetRegistry::PresetRegistry(std::span<const PresetFile> files)
    : files_(files.begin(), files.end()) {
  std::sort(files_.begin(), files_.end(), [](const PresetFile& a, const PresetFile& b) {
    return std::tie(a.kind, a.name) < std::tie(b.kind, b.name);
  });
}

std::span<const std::string_view> PresetRegistry::kinds() {
  return kKinds;
}

std::vector<const PresetFile*> PresetRegistry::list(std::string_view kind) const {
  std::vector<const PresetFile*> matching;
  for (const auto& file : files_) {
    if (file.kind == kind) {
      matching.push_back(&file);
    }
  }
  return matching;
}

const PresetFile* PresetRegistry::find(std::string_view kind, std::string_view name) const {
  const PresetFile* folded = nullptr;
  int folded_count = 0;
  for (const auto& file : files_) {
    if (file.kind != kind) {
      continue;
    }
    if (file.name == name) {
      return &file;
    }
    if (equal_ignoring_case(file.name, name)) {
      folded = &file;
      ++folded_count;
    }
  }
  return folded_count == 1 ? folded : nullptr;
}

const PresetFile& PresetRegistry::find_any(std::string_view name) const {
  std::vector<const PresetFile*> found;
  for (const auto kind : kKinds) {
    if (const PresetFile* file = find(kind, name)) {
      found.push_back(file);
    }
  }
  if (found.empty()) {
    throw ConfigError("unknown preset '" + std::string(name) +
                      "'; `kvtier presets list` shows the known ones");
  }
  if (found.size() > 1) {
    std::string kinds;
    for (const auto* file : found) {
      kinds += (kinds.empty() ? "" : ", ") + std::string(file->kind);
    }
    throw ConfigError("preset name '" + std::string(name) + "' is ambiguous between kinds " +
                      kinds + "; give --kind");
  }
  return *found.front();
}

std::string PresetRegistry::unknown_message(std::string_view kind, std::string_view name) const {
  std::string message =
      "unknown " + std::string(kind) + " preset '" + std::string(name) + "'; known:";
  for (const auto* file : list(kind)) {
    message += " ";
    message += file->name;
  }
  return message;
}

}  // namespace kvtier::config
