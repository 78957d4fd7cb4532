#pragma once
// Policies by name, each with its declared parameters; `kvtier policies list/show` prints this.

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"
#include "replay/parameters.hpp"
#include "replay/policy.hpp"

namespace kvtier::replay {

struct PolicyInfo {
  std::string name;
  std::string summary;
  std::string source;  // the paper or repository the rule and defaults come from
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Policy>(const PolicyParameters&, const ReplayShape&)> make;
};

class PolicyRegistry {
 public:
  explicit PolicyRegistry(std::vector<PolicyInfo> policies);

  [[nodiscard]] std::span<const PolicyInfo> all() const noexcept { return policies_; }
  // nullptr when unknown.
  [[nodiscard]] const PolicyInfo* find(const std::string& name) const;
  // Checks the parameters and builds the policy; ConfigError for unknown names or parameters.
  // `canonical` receives "name:param=value,..." with every parameter (defaults included).
  [[nodiscard]] std::unique_ptr<Policy> create(const config::PolicySpec& spec,
                                               const ReplayShape& shape,
                                               std::string* canonical = nullptr) const;

 private:
  std::vector<PolicyInfo> policies_;
};

// Every policy kvtier ships.
[[nodiscard]] PolicyRegistry builtin_policies();

// Per-layer token budgets from a policy's `budget` (mean per layer) and `allocation`
// (uniform | pyramid) parameters; pyramid follows PyramidKV (REFERENCE.md §2).
[[nodiscard]] std::vector<std::uint64_t> layer_budgets(const PolicyParameters& params,
                                                       std::uint32_t layers);
[[nodiscard]] std::vector<ParamSpec> budget_params(const std::string& default_budget);

}  // namespace kvtier::replay
