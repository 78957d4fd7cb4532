#pragma once
// Loading configs from strings in tests, with the built-in presets.

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "tests/support/small_run.hpp"

namespace kvtier::test {

inline const config::PresetRegistry& builtin_presets() {
  static const config::PresetRegistry registry(config::builtin_preset_files());
  return registry;
}

inline const config::ConfigLoader& loader() {
  static const config::ConfigLoader instance(builtin_presets());
  return instance;
}

// A built-in preset of `kind` (gpu, link, model, ...), loaded as its spec.
template <typename Spec>
Spec preset(const char* kind, const char* name) {
  Spec spec;
  (void)loader().load_preset(*builtin_presets().find(kind, name), spec, {});
  return spec;
}

template <typename Spec>
Spec load_spec(const std::string& text, const std::vector<std::string>& sets = {}) {
  std::vector<config::Override> overrides;
  for (const auto& set : sets) {
    overrides.push_back(config::parse_override(set));
  }
  Spec spec;
  (void)loader().load_text(text, "test.textproto", spec, overrides);
  return spec;
}

// The lines an invalid config produces ("kvtier: error: ..."), or an empty list when valid.
template <typename Spec>
std::vector<std::string> problems(const std::string& text,
                                  const std::vector<std::string>& sets = {}) {
  try {
    (void)load_spec<Spec>(text, sets);
  } catch (const Error& error) {
    return error.lines();
  }
  return {};
}

// Error lines (as `problems` gives them) as one text, a line each, for Catch::Contains.
inline std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) {
    text += line + "\n";
  }
  return text;
}

// A valid RunSpec to start tests from (small_run.hpp's, after an empty line).
inline std::string quickstart_run() {
  return "\n" + small_run_text();
}

}  // namespace kvtier::test
