#include "replay/registry.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/budget_rescale.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

// The most attention any policy holding `budget` tokens of a layer between steps can keep at a
// step: the step's own token (always present) plus the budget's worth of the largest weights on
// earlier tokens. Not causal (it may keep a token it dropped a step earlier), so it bounds every
// budgeted policy from above.
class OraclePolicy final : public Policy {
 public:
  OraclePolicy(const PolicyParameters& params, const ReplayShape& shape)
      : budgets_(layer_budgets(params, shape.layers)) {}

  void observe(const StepView& /*view*/, std::vector<LayerPlacement>& /*placement*/) override {}

  [[nodiscard]] double own_kept_mass(const StepView& view, std::uint32_t layer) const override {
    const std::vector<float>& row = view.rows[layer];
    const std::uint64_t budget = budgets_[layer];
    const std::uint64_t earlier = row.size() - 1;
    double kept = row.back();
    if (earlier <= budget) {
      for (std::uint64_t i = 0; i < earlier; ++i) {
        kept += row[i];
      }
      return kept;
    }
    scratch_.assign(row.begin(), row.end() - 1);
    std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(budget),
                     scratch_.end(), std::greater<>());
    for (std::uint64_t i = 0; i < budget; ++i) {
      kept += scratch_[i];
    }
    return kept;
  }

 private:
  std::vector<std::uint64_t> budgets_;
  mutable std::vector<float> scratch_;
};

}  // namespace

std::vector<ParamSpec> budget_params(const std::string& default_budget,
                                     const std::string& default_allocation) {
  return {{"budget",
           ParamType::kInteger,
           default_budget,
           "mean tokens kept per layer (with allocation=explicit: the mean of budgets, which may "
           "be left out)",
           1,
           1e9,
           {}},
          {"allocation",
           ParamType::kChoice,
           default_allocation,
           "how the budget is spread over layers: uniform; pyramid (PyramidKV: more in lower "
           "layers, beta 20, window 64); explicit (one budget per layer in budgets)",
           0,
           0,
           {"uniform", "pyramid", "explicit"}},
          {"budgets",
           ParamType::kInteger,
           "",
           "with allocation=explicit: tokens kept in each layer, one integer per layer from the "
           "first, separated by '/' (64/128/96/...)",
           1,
           1e9,
           {},
           true}};
}

std::vector<std::uint64_t> layer_budgets(const PolicyParameters& params, std::uint32_t layers,
                                         std::optional<std::uint64_t> compressed_prompt) {
  check_budget_params(params);
  const std::string& allocation = params.choice("allocation");
  const std::vector<std::int64_t> explicit_budgets = params.integers("budgets");
  if (allocation == "explicit") {
    if (explicit_budgets.size() != layers) {
      throw ParameterValueError("budgets has " + std::to_string(explicit_budgets.size()) +
                                    " entries for a model of " + std::to_string(layers) + " layers",
                                params.policy(), "budgets");
    }
    return {explicit_budgets.begin(), explicit_budgets.end()};
  }
  const auto budget = static_cast<double>(params.integer("budget"));
  if (allocation != "pyramid" || layers < 2) {
    return std::vector<std::uint64_t>(layers, static_cast<std::uint64_t>(budget));
  }
  // PyramidKV: min = (B − w)/β, max = 2(B − w) − min, k_l = max − l(max − min)/(L − 1), + w.
  constexpr double kWindow = 64.0;
  constexpr double kBeta = 20.0;
  const double spread = std::max(budget - kWindow, 0.0);
  double low = spread / kBeta;
  double high = 2.0 * spread - low;
  // PyramidKV's own code (PyramidKVCluster.update_kv) compresses a prompt shorter than 2(B − w)
  // with the uniform budget, and otherwise caps the first layer at the prompt beyond the window
  // and raises the last by as much, so that the budget of the first layers is not left unused.
  if (compressed_prompt.has_value()) {
    if (static_cast<double>(*compressed_prompt) < 2.0 * spread) {
      return std::vector<std::uint64_t>(layers, static_cast<std::uint64_t>(budget));
    }
    const double prompt_beyond_window = static_cast<double>(*compressed_prompt) - kWindow;
    if (prompt_beyond_window > 0.0 && high >= prompt_beyond_window) {
      high = prompt_beyond_window;
      low = 2.0 * spread - high;
    }
  }
  std::vector<double> shares(layers);
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    shares[layer] = high - layer * (high - low) / (layers - 1) + std::min(kWindow, budget);
  }
  // Largest remainder, so that the layers hold exactly L·B.
  return round_to_total(shares, static_cast<std::uint64_t>(budget) * layers);
}

namespace {

// The mean of an explicit budgets list (allocation=explicit; budgets checked non-empty).
double mean_budget(const PolicyParameters& params) {
  const std::vector<std::int64_t> budgets = params.integers("budgets");
  return std::accumulate(budgets.begin(), budgets.end(), 0.0) / static_cast<double>(budgets.size());
}

}  // namespace

void check_budget_params(const PolicyParameters& params) {
  const std::string& allocation = params.choice("allocation");
  const bool listed = !params.integers("budgets").empty();
  if (allocation != "explicit") {
    if (listed) {
      throw ParameterValueError(
          "budgets needs allocation=explicit (allocation is " + allocation + ")", params.policy(),
          "budgets");
    }
    return;
  }
  if (!listed) {
    throw ParameterValueError(
        "allocation=explicit needs budgets: one integer per layer, '/' between", params.policy(),
        "budgets");
  }
  // `budget` keeps meaning the mean: when given it must be the mean rounded either way, and the
  // canonical string carries the mean rounded to nearest, so that it parses back.
  if (params.given("budget")) {
    const auto given = static_cast<double>(params.integer("budget"));
    const double mean = mean_budget(params);
    if (given != std::floor(mean) && given != std::ceil(mean)) {
      throw ParameterValueError("budget " + format_double(given) + " is not the mean of budgets (" +
                                    format_double(mean) +
                                    "); leave it out with allocation=explicit",
                                params.policy(), "budget");
    }
  }
}

void resolve_budget_params(PolicyParameters& params, std::uint32_t layers) {
  (void)layer_budgets(params, layers);  // the list against the layers, and check_budget_params
  if (params.choice("allocation") == "explicit" && !params.given("budget")) {
    params.set("budget", std::to_string(std::llround(mean_budget(params))));
  }
}

PolicyInfo oracle_policy_info() {
  return PolicyInfo{
      "oracle",
      "upper bound: at each step, the step's own token plus the budget's worth of the highest "
      "attention on earlier tokens (not a causal policy)",
      "—", budget_params("1024"),
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<OraclePolicy>(p, shape);
      }};
}

PolicyRegistry::PolicyRegistry(std::vector<PolicyInfo> policies) : policies_(std::move(policies)) {
  std::sort(policies_.begin(), policies_.end(),
            [](const PolicyInfo& a, const PolicyInfo& b) { return a.name < b.name; });
}

const PolicyInfo* PolicyRegistry::find(const std::string& name) const {
  for (const auto& info : policies_) {
    if (info.name == name) {
      return &info;
    }
  }
  return nullptr;
}

const PolicyInfo& PolicyRegistry::known(const std::string& name) const {
  const PolicyInfo* info = find(name);
  if (info == nullptr) {
    std::string names;
    for (const auto& policy : policies_) {
      names += (names.empty() ? "" : ", ") + policy.name;
    }
    throw ConfigError("unknown policy '" + name + "' (policies: " + names + ")");
  }
  return *info;
}

void PolicyRegistry::check(const config::PolicySpec& spec) const {
  const PolicyInfo& info = known(spec.name());
  const PolicyParameters params(info.name, info.params, spec);
  for (const auto& param : info.params) {
    if (param.name == "allocation") {
      check_budget_params(params);
    }
  }
  if (info.check) {
    info.check(params);
  }
}

std::unique_ptr<Policy> PolicyRegistry::create(const config::PolicySpec& spec,
                                               const ReplayShape& shape,
                                               std::string* canonical) const {
  const PolicyInfo* info = &known(spec.name());
  PolicyParameters params(info->name, info->params, spec);
  for (const auto& param : info->params) {
    if (param.name == "allocation") {
      resolve_budget_params(params, shape.layers);
    }
  }
  if (info->resolve) {
    info->resolve(params, shape);
  }
  if (canonical != nullptr) {
    const std::string values = params.canonical();
    *canonical = info->name + (values.empty() ? "" : ":" + values);
  }
  return info->make(params, shape);
}

PolicyRegistry builtin_policies() {
  return PolicyRegistry({full_policy_info(), tiered_policy_info(), streaming_policy_info(),
                         h2o_policy_info(), tova_policy_info(), oracle_policy_info(),
                         monarch_policy_info(), dms_policy_info(), snapkv_policy_info(),
                         pyramidkv_policy_info(), adakv_policy_info(), knorm_policy_info()});
}

}  // namespace kvtier::replay
