#include "replay/parameters.hpp"

#include <charconv>
#include <cmath>

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

}  // namespace

PolicyParameters::PolicyParameters(const std::string& policy, const std::vector<ParamSpec>& specs,
                                   const config::PolicySpec& given)
    : policy_(policy) {
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
    const std::string value = found == supplied.end() ? spec.default_value : found->second;
    const std::string where = "policy " + policy + ", parameter " + spec.name;
    double number = 0.0;
    switch (spec.type) {
      case ParamType::kNumber:
      case ParamType::kInteger:
        if (!parse_double(value, number) ||
            (spec.type == ParamType::kInteger && std::floor(number) != number)) {
          throw ConfigError("'" + value + "' is not " +
                                (spec.type == ParamType::kInteger ? "an integer" : "a number"),
                            where);
        }
        if (number < spec.min || number > spec.max) {
          throw ConfigError("value " + value + " is out of range [" + format_double(spec.min) +
                                ", " + format_double(spec.max) + "]",
                            where);
        }
        break;
      case ParamType::kFlag:
        if (value != "true" && value != "false") {
          throw ConfigError("'" + value + "' is not true or false", where);
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
          options.insert(0, "' is not one of ");
          options.insert(0, value);
          throw ConfigError("'" + options, where);
        }
        break;
      }
    }
    values_.emplace_back(spec.name, value);
  }
}

const std::string& PolicyParameters::raw(const std::string& name) const {
  for (const auto& [key, value] : values_) {
    if (key == name) {
      return value;
    }
  }
  throw std::logic_error("policy " + policy_ + " reads undeclared parameter " + name);
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

std::string PolicyParameters::canonical() const {
  std::string text;
  for (const auto& [key, value] : values_) {
    text += text.empty() ? "" : ",";
    text += key;
    text += '=';
    text += value;
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
      if (std::floor(number) == number && value.find_first_of(".eE") == std::string::npos) {
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

}  // namespace kvtier::replay
