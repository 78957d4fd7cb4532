#pragma once
// Typed, declared policy parameters. Every policy lists its parameters with type, range,
// default (the published default, cited in the policy's doc) and meaning; a parameter that is
// not declared, or a value of the wrong type or out of range, is a ConfigError.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
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
  // A list of numbers or integers separated by '/' ("64/128/96": ',' already separates a policy
  // string's parameters), each entry typed and range-checked. A list whose default is empty is
  // absent unless given; an empty list cannot be given.
  bool list = false;
};

inline constexpr char kListSeparator = '/';

// A value a policy's parameter does not take: a ConfigError placed at "policy P, parameter N",
// which also says which parameter, so that a caller can name where the value was written.
class ParameterValueError : public ConfigError {
 public:
  ParameterValueError(const std::string& what, const std::string& policy, std::string parameter)
      : ConfigError(what, "policy " + policy + ", parameter " + parameter),
        parameter_(std::move(parameter)) {}
  [[nodiscard]] const std::string& parameter() const noexcept { return parameter_; }

 private:
  std::string parameter_;
};

// Values of one policy's parameters, defaults filled in, checked against the specs.
class PolicyParameters {
 public:
  PolicyParameters(const std::string& policy, const std::vector<ParamSpec>& specs,
                   const config::PolicySpec& given);

  [[nodiscard]] const std::string& policy() const noexcept { return policy_; }
  [[nodiscard]] double number(const std::string& name) const;
  [[nodiscard]] std::int64_t integer(const std::string& name) const;
  [[nodiscard]] bool flag(const std::string& name) const;
  [[nodiscard]] const std::string& choice(const std::string& name) const;
  // The entries of a list parameter (empty when it is absent).
  [[nodiscard]] std::vector<double> numbers(const std::string& name) const;
  [[nodiscard]] std::vector<std::int64_t> integers(const std::string& name) const;
  // Whether the policy string gave the parameter (false when it holds its default).
  [[nodiscard]] bool given(const std::string& name) const;
  // Replaces a value that follows from others (the mean budget of an explicit budget list),
  // checked like a given one; ConfigError when it is not a valid value.
  void set(const std::string& name, const std::string& value);
  // "hbm=0.5,evict=0.1,..." with every parameter, in declaration order (for reports and keys);
  // absent lists are left out, so the text parses back to the same values.
  [[nodiscard]] std::string canonical() const;

 private:
  struct Value {
    std::string name;
    std::string text;
    bool given = false;
  };
  const Value& find(const std::string& name) const;
  const std::string& raw(const std::string& name) const;

  std::string policy_;
  std::vector<ParamSpec> specs_;
  std::vector<Value> values_;  // declaration order
};

// "tiered:hbm=0.5,evict=0.1" -> PolicySpec{name: "tiered", params...}; values are typed by
// their look (true/false flags, integers, numbers, else text) and checked by the registry.
[[nodiscard]] config::PolicySpec parse_policy_string(const std::string& text);

// The inverse: a policy as written, its name and the parameters given ("tiered:hbm=0.5"), without
// the defaults (the canonical string needs the registry; see PolicyRegistry::create).
[[nodiscard]] std::string policy_string(const config::PolicySpec& policy);

// The message refusing a policy given twice in one run, which would run it twice and give two
// results of one name: "policy 'P' is given twice (FIRST and SECOND): give each policy once".
[[nodiscard]] std::string policy_given_twice(const std::string& policy, const std::string& first,
                                             const std::string& second);

}  // namespace kvtier::replay
