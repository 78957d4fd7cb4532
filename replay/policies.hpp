#pragma once
// The built-in policies, one description (name, parameters, factory) each; the registry
// (replay/registry.hpp) lists them.

#include "replay/registry.hpp"

namespace kvtier::replay {

[[nodiscard]] PolicyInfo full_policy_info();
[[nodiscard]] PolicyInfo tiered_policy_info();
[[nodiscard]] PolicyInfo streaming_policy_info();
[[nodiscard]] PolicyInfo h2o_policy_info();
[[nodiscard]] PolicyInfo tova_policy_info();
[[nodiscard]] PolicyInfo oracle_policy_info();

}  // namespace kvtier::replay
