#pragma once
// The built-in presets (configs/hardware/*, configs/models/*), compiled into the binary so that
// `kvtier` works from any directory. Each is a text-format file whose stem is its name.

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::config {

struct PresetFile {
  std::string_view kind;  // "gpu", "host", "link", "node" or "model"
  std::string_view name;
  std::string_view path;  // repository-relative, for diagnostics
  std::string_view text;
};

// Generated at build time from the preset folders.
[[nodiscard]] std::span<const PresetFile> builtin_preset_files();

class PresetRegistry {
 public:
  explicit PresetRegistry(std::span<const PresetFile> files);

  [[nodiscard]] static std::span<const std::string_view> kinds();
  [[nodiscard]] std::vector<const PresetFile*> list(std::string_view kind) const;
  // Exact name first, then a unique case-insensitive match; nullptr when there is none.
  [[nodiscard]] const PresetFile* find(std::string_view kind, std::string_view name) const;
  // A name in any kind (for `presets show NAME`); throws ConfigError when ambiguous or unknown.
  [[nodiscard]] const PresetFile& find_any(std::string_view name) const;
  // "unknown gpu preset 'X'; known: A, B, C" — for errors.
  [[nodiscard]] std::string unknown_message(std::string_view kind, std::string_view name) const;

 private:
  std::vector<PresetFile> files_;
};

}  // namespace kvtier::config
