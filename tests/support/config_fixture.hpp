#pragma once
// Loading configs from strings in tests, with the built-in presets.

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"

namespace kvtier::test {

inline const config::PresetRegistry& builtin_presets() {
  static const config::PresetRegistry registry(config::builtin_preset_files());
  return registry;
}

inline const config::ConfigLoader& loader() {
  static const config::ConfigLoader instance(builtin_presets());
  return instance;
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

// A valid RunSpec to start tests from.
inline std::string quickstart_run() {
  return R"(
hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
model { preset: "Llama-3.1-8B" }
tensor_parallel_degree: 1
workload {
  closed_loop { concurrency: 4 num_requests: 8 prompt_tokens { fixed_tokens: 128 }
                output_tokens { fixed_tokens: 64 } }
  max_batch_size: 64
  prefill_chunk_tokens: 512
}
policy { name: "full" }
memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
engine { iteration_overhead_us: 1000 }
seed: 7
)";
}

}  // namespace kvtier::test
