#include "replay/parameters.hpp"

#include <charconv>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"
#include "common/text_output.hpp"

namespace kvtier::replay {
namespace {

std::string value_text(const config::PolicyParam& param) {
  switch (param.value_case()) {
    case config::PolicyParam::kNumber: return format_double(param.number());
    case config::PolicyParam::kInteger: return std::to_string(param.integer());
    case config::PolicyParam::kText: return param.text();
    case config::PolicyParam::kFlag: return param.flag() ? "true" : "false";
    case config::PolicyParam::VALUE_NOT_SET: break;
  }
  return {};
}

bool parse_double(const std::string& text, double& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc{} && end == text.data() + text.size() && std::isfinite(value);
}

// The entries of a list value ("64/128/96"); an empty entry stays empty so that it is reported.
std::vector<std::string> split_list(const std::string& value) {
  std::vector<std::string> entries;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = value.find(kListSeparator, start);
    entries.push_back(value.substr(start, end == std::string::npos ? end : end - start));
    if (end == std::string::npos) {
      return entries;
    }
    start = end + 1;
  }
}

// Checks one number or integer of `policy`; `entry` names a list entry ("entry 2 ") or is empty.
void check_number(const ParamSpec& spec, const std::string& value, const std::string& entry,
                  const std::string& policy) {
  double number = 0.0;
  if (!parse_double(value, number) ||
      (spec.type == ParamType::kInteger && std::floor(number) != number)) {
    throw ParameterValueError(entry + "'" + value + "' is not " +
                                  (spec.type == ParamType::kInteger ? "an integer" : "a number"),
                              policy, spec.name);
  }
  if (number < spec.min || number > spec.max) {
    throw ParameterValueError(entry + "value " + value + " is out of range [" +
                                  format_double(spec.min) + ", " + format_double(spec.max) + "]",
                              policy, spec.name);
  }
}

void check_value(const ParamSpec& spec, const std::string& value, const std::string& policy) {
  if (spec.list) {
    if (value.empty()) {
      throw ParameterValueError("an empty list: give one or more values separated by '" +
                                    std::string(1, kListSeparator) + "'",
                                policy, spec.name);
    }
    const std::vector<std::string> entries = split_list(value);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      check_number(spec, entries[i], "entry " + std::to_string(i + 1) + " ", policy);
    }
    return;
  }
  switch (spec.type) {
    case ParamType::kNumber:
    case ParamType::kInteger: check_number(spec, value, "", policy); break;
    case ParamType::kFlag:
      if (value != "true" && value != "false") {
        throw ParameterValueError("'" + value + "' is not true or false", policy, spec.name);
      }
      break;
    case ParamType::kChoice: {
      bool allowed = false;
      std::string options;
      for (const auto& choice : spec.choices) {
        allowed = allowed || choice == value;
        options += options.empty() ? "" : ", ";
        options += choice;
      }
      if (!allowed) {
        throw ParameterValueError("'" + value + "' is not one of " + options, policy, spec.name);
      }
      break;
    }
  }
}

}  // namespace

PolicyParameters::PolicyParameters(const std::string& policy, const std::vector<ParamSpec>& specs,
                                   const config::PolicySpec& given)
    : policy_(policy), specs_(specs) {
  std::map<std::string, std::string> supplied;
  for (const auto& param : given.param()) {
    bool known = false;
    for (const auto& spec : specs) {
      known = known || spec.name == param.name();
    }
    if (!known) {
      std::string names;
      for (const auto& spec : specs) {
        names += (names.empty() ? "" : ", ") + spec.name;
      }
      throw ConfigError("policy " + policy + " has no parameter '" + param.name() + "'" +
                        (names.empty() ? " (it takes none)" : " (parameters: " + names + ")"));
    }
    if (!supplied.emplace(param.name(), value_text(param)).second) {
      throw ConfigError("policy " + policy + ": parameter '" + param.name() + "' given twice");
    }
  }
  for (const auto& spec : specs) {
    const auto found = supplied.find(spec.name);
    const bool is_given = found != supplied.end();
    const std::string value = is_given ? found->second : spec.default_value;
    // An absent list (empty default, not given) has no entries to check.
    if (is_given || !spec.list || !value.empty()) {
      check_value(spec, value, policy);
    }
    values_.push_back({spec.name, value, is_given});
  }
}

const PolicyParameters::Value& PolicyParameters::find(const std::string& name) const {
  for (const auto& value : values_) {
    if (value.name == name) {
      return value;
    }
  }
  throw std::logic_error("policy " + policy_ + " reads undeclared parameter " + name);
}

const std::string& PolicyParameters::raw(const std::string& name) const {
  return find(name).text;
}

double PolicyParameters::number(const std::string& name) const {
  double value = 0.0;
  (void)parse_double(raw(name), value);
  return value;
}

std::int64_t PolicyParameters::integer(const std::string& name) const {
  return static_cast<std::int64_t>(number(name));
}

bool PolicyParameters::flag(const std::string& name) const {
  return raw(name) == "true";
}

const std::string& PolicyParameters::choice(const std::string& name) const {
  return raw(name);
}

std::vector<double> PolicyParameters::numbers(const std::string& name) const {
  const std::string& text = raw(name);
  std::vector<double> values;
  if (text.empty()) {
    return values;
  }
  for (const std::string& entry : split_list(text)) {
    double value = 0.0;
    (void)parse_double(entry, value);
    values.push_back(value);
  }
  return values;
}

std::vector<std::int64_t> PolicyParameters::integers(const std::string& name) const {
  std::vector<std::int64_t> values;
  for (const double value : numbers(name)) {
    values.push_back(static_cast<std::int64_t>(value));
  }
  return values;
}

bool PolicyParameters::given(const std::string& name) const {
  return find(name).given;
}

void PolicyParameters::set(const std::string& name, const std::string& value) {
  for (std::size_t i = 0; i < values_.size(); ++i) {
    if (values_[i].name == name) {
      check_value(specs_[i], value, policy_);
      values_[i].text = value;
      return;
    }
  }
  throw std::logic_error("policy " + policy_ + " sets undeclared parameter " + name);
}

std::string PolicyParameters::canonical() const {
  std::string text;
  for (const auto& value : values_) {
    if (value.text.empty()) {
      continue;  // an absent list
    }
    text += text.empty() ? "" : ",";
    text += value.name;
    text += '=';
    text += value.text;
  }
  return text;
}

config::PolicySpec parse_policy_string(const std::string& text) {
  config::PolicySpec spec;
  const size_t colon = text.find(':');
  spec.set_name(text.substr(0, colon));
  if (spec.name().empty()) {
    throw ConfigError("policy string '" + text + "' has no policy name");
  }
  if (colon == std::string::npos) {
    return spec;
  }
  std::string_view rest(text);
  rest.remove_prefix(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      throw ConfigError("policy string '" + text + "': expected NAME=VALUE, found '" +
                        std::string(item) + "'");
    }
    auto* param = spec.add_param();
    param->set_name(std::string(item.substr(0, equals)));
    const std::string value(item.substr(equals + 1));
    double number = 0.0;
    if (value == "true" || value == "false") {
      param->set_flag(value == "true");
    } else if (parse_double(value, number)) {
      // A whole number int64 cannot hold stays a number, which the range check then refuses.
      if (std::floor(number) == number && value.find_first_of(".eE") == std::string::npos &&
          std::fabs(number) < 9223372036854775808.0) {
        param->set_integer(static_cast<std::int64_t>(number));
      } else {
        param->set_number(number);
      }
    } else {
      param->set_text(value);
    }
  }
  return spec;
}

std::string policy_string(const config::PolicySpec& policy) {
  std::string text = policy.name();
  for (int i = 0; i < policy.param_size(); ++i) {
    text += i == 0 ? ':' : ',';
    text += policy.param(i).name();
    text += '=';
    text += value_text(policy.param(i));
  }
  return text;
}

std::string policy_given_twice(const std::string& policy, const std::string& first,
                               const std::string& second) {
  std::string message = "policy '";
  message += policy;
  message += "' is given twice (";
  message += first;
  message += " and ";
  message += second;
  message += "): give each policy once";
  return message;
}

}  // namespace kvtier::replay
