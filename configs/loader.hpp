#pragma once
// Loading a config end to end: parse (text or JSON), apply `--set` overrides, expand preset
// references, validate. The result is a fully resolved message in which every required value
// is present, plus the position each value came from.

#include <google/protobuf/message.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "configs/locations.hpp"
#include "configs/presets.hpp"
#include "configs/schema/run.pb.h"

namespace kvtier::config {

// One `--set PATH=VALUE`: PATH is dotted field names with [i] for repeated entries; a field
// whose name ends in its unit may be named without it (`gpu.memory_capacity=80GiB`), and then
// the value must carry a unit. The value kRemoveField (`PATH=~`, YAML's null) removes the field
// instead: a value, a whole list or a sub-message; under a sub-message that is not there it
// does nothing. Not a list's entry, a preset's name or anything under a message naming a
// preset (expanded again at a sweep's points, its values would come back).
struct Override {
  std::string path;
  std::string value;
  std::string argument;  // as written, for diagnostics
};

inline constexpr std::string_view kRemoveField = "~";

[[nodiscard]] Override parse_override(std::string_view argument);

// Applies one override to `root`, converting units; records its position in `locations`.
void apply_override(google::protobuf::Message& root, const Override& override_,
                    LocationMap& locations);

// The message types a config file can hold, by the names `--kind` and `# proto-message:` use.
[[nodiscard]] std::unique_ptr<google::protobuf::Message> new_config_message(std::string_view kind);
[[nodiscard]] std::span<const std::string_view> config_kinds();
// The kind named by a "# proto-message: RunSpec" line at the top of `text`, if any.
[[nodiscard]] std::string declared_kind(std::string_view text);

// A run's request file, traces and output folder, named relative to the config file they are
// written in, made relative to the working directory (or left absolute), as every command
// reading a run from a file resolves them. `traces`: false when the command line gave the traces
// instead.
void resolve_run_paths(config::RunSpec& run, const std::string& config_file, bool traces = true);

class ConfigLoader {
 public:
  explicit ConfigLoader(const PresetRegistry& presets) : presets_(presets) {}

  LocationMap load_file(const std::string& path, google::protobuf::Message& message,
                        std::span<const Override> overrides) const;
  LocationMap load_text(std::string_view text, const std::string& file_name,
                        google::protobuf::Message& message,
                        std::span<const Override> overrides) const;
  LocationMap load_preset(const PresetFile& preset, google::protobuf::Message& message,
                          std::span<const Override> overrides) const;

  // Parses and resolves without validating (sweeps validate each point after its overrides;
  // sim and plan validate a run once their --policy and --compare have edited it).
  LocationMap resolve_text(std::string_view text, const std::string& file_name,
                           google::protobuf::Message& message,
                           std::span<const Override> overrides) const;
  LocationMap resolve_file(const std::string& path, google::protobuf::Message& message,
                           std::span<const Override> overrides) const;

  // Applies overrides to an already parsed message and expands its preset references:
  // overrides of `preset` fields first, then presets, then every other override.
  void apply_and_resolve(google::protobuf::Message& message, LocationMap& locations,
                         std::span<const Override> overrides) const;

  [[nodiscard]] const PresetRegistry& presets() const noexcept { return presets_; }

 private:
  void resolve(google::protobuf::Message& message, LocationMap& locations,
               const std::string& prefix, int depth) const;

  const PresetRegistry& presets_;
};

}  // namespace kvtier::config
