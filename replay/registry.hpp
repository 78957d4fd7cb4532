#pragma once
// Policies by name, each with its declared parameters; `kvtier policies list/show` prints this.

#include <functional>
#include <memory>
#include <optional>
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
  // Optional: settles values that follow from others (a preset's), so that the canonical string
  // holds what the policy really runs with; called by create() before make.
  std::function<void(PolicyParameters&, const ReplayShape&)> resolve = {};
  // Optional: checks of values together that need no trace (a window that must fit in the hot
  // capacity); ParameterValueError when one fails. check() runs it, so that a config check
  // places the value; make() checks again when it builds the policy.
  std::function<void(const PolicyParameters&)> check = {};
};

class PolicyRegistry {
 public:
  explicit PolicyRegistry(std::vector<PolicyInfo> policies);

  [[nodiscard]] std::span<const PolicyInfo> all() const noexcept { return policies_; }
  // nullptr when unknown.
  [[nodiscard]] const PolicyInfo* find(const std::string& name) const;
  // The name and parameters of `spec`, without a trace's shape (budgets against its layers are
  // checked by create); ConfigError for unknown names or parameters and bad values.
  void check(const config::PolicySpec& spec) const;
  // Checks the parameters and builds the policy; ConfigError for unknown names or parameters.
  // `canonical` receives "name:param=value,..." with every parameter (defaults included).
  [[nodiscard]] std::unique_ptr<Policy> create(const config::PolicySpec& spec,
                                               const ReplayShape& shape,
                                               std::string* canonical = nullptr) const;

 private:
  [[nodiscard]] const PolicyInfo& known(const std::string& name) const;

  std::vector<PolicyInfo> policies_;
};

// Every policy kvtier ships.
[[nodiscard]] PolicyRegistry builtin_policies();

// Per-layer token budgets from a policy's `budget` (mean per layer), `allocation` (uniform |
// pyramid | explicit) and `budgets` parameters: pyramid follows PyramidKV (REFERENCE.md §2);
// explicit takes `budgets`, one integer per layer separated by '/'
// ("h2o:allocation=explicit,budgets=64/128/96"). ConfigError naming the parameter when the list
// is missing, has a wrong number of entries, or is given without allocation=explicit.
// `compressed_prompt`: for a policy that cuts the prompt to its budgets at prefill (snapkv,
// pyramidkv, adakv), the prompt's length, at which PyramidKV caps the pyramid's first layer.
// Pyramid budgets sum to exactly layers × budget.
[[nodiscard]] std::vector<std::uint64_t> layer_budgets(
    const PolicyParameters& params, std::uint32_t layers,
    std::optional<std::uint64_t> compressed_prompt = std::nullopt);
// The declarations of `budget`, `allocation` and `budgets` every budgeted policy takes.
[[nodiscard]] std::vector<ParamSpec> budget_params(
    const std::string& default_budget, const std::string& default_allocation = "uniform");
// Checks the budget parameters against the layer count and, with allocation=explicit, sets
// `budget` to the mean of `budgets` (rounded to nearest) unless it was given, when it must be
// that mean rounded either way. PolicyRegistry::create calls it for every policy declaring
// `allocation`, before the canonical string is made.
void resolve_budget_params(PolicyParameters& params, std::uint32_t layers);
// The budget parameters' checks that need no trace: a budgets list only with allocation=explicit
// and then required, a given budget the list's mean; ParameterValueError.
void check_budget_params(const PolicyParameters& params);

}  // namespace kvtier::replay
