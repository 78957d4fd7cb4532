#pragma once
// Typed, declared policy parameters. Every policy lists its parameters with type, range,
// default (the published default, cited in the policy's doc) and meaning; a parameter that is
// not declared, or a value of the wrong type or out of range, is a ConfigError.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"

namespace kvtier::replay {

enum class ParamType { kNumber, kInteger, kFlag, kChoice };

struct ParamSpec {
  std::string name;
  ParamType type;
  std::string default_value;  // as written in a policy string
  std::string doc;
  double min = 0.0;  // numbers and integers
  double max = 1e18;
  std::vector<std::string> choices;  // kChoice
};

// Values of one policy's parameters, defaults filled in, checked against the specs.
class PolicyParameters {
 public:
  PolicyParameters(const std::string& policy, const std::vector<ParamSpec>& specs,
                   const config::PolicySpec& given);

  [[nodiscard]] double number(const std::string& name) const;
  [[nodiscard]] std::int64_t integer(const std::string& name) const;
  [[nodiscard]] bool flag(const std::string& name) const;
  [[nodiscard]] const std::string& choice(const std::string& name) const;
  // "hbm=0.5,evict=0.1,..." with every parameter, in declaration order (for reports and keys).
  [[nodiscard]] std::string canonical() const;

 private:
  const std::string& raw(const std::string& name) const;

  std::string policy_;
  std::vector<std::pair<std::string, std::string>> values_;  // declaration order
};

// "tiered:hbm=0.5,evict=0.1" -> PolicySpec{name: "tiered", params...}; values are typed by
// their look (true/false flags, integers, numbers, else text) and checked by the registry.
[[nodiscard]] config::PolicySpec parse_policy_string(const std::string& text);

}  // namespace kvtier::replay
