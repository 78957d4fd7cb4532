// The generic half of validation: walks any config message and applies the (required),
// (min_value), (max_value) and (min_items) annotations of its schema.

#include "configs/validate.hpp"

#include <google/protobuf/descriptor.h>

#include <cmath>
#include <sstream>

#include "configs/schema/options.pb.h"

namespace kvtier::config {
namespace {

namespace pb = google::protobuf;

std::string format_number(double value) {
  std::ostringstream out;
  out.precision(12);
  out << value;
  return out.str();
}

std::string unit_text(const pb::FieldDescriptor* field) {
  const std::string& symbol = field->options().GetExtension(unit);
  return symbol.empty() || symbol == "1" ? std::string() : " " + symbol;
}

double numeric_value(const pb::Message& message, const pb::FieldDescriptor* field, int index) {
  const pb::Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(rep ? r->GetRepeatedInt64(message, field, index)
                                     : r->GetInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field);
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(rep ? r->GetRepeatedUInt64(message, field, index)
                                     : r->GetUInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field);
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field);
    default: return 0.0;
  }
}

bool is_numeric(const pb::FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: return true;
    default: return false;
  }
}

// A field without explicit presence (a proto3 enum or message list) counts as present when it
// holds a non-default value.
bool is_present(const pb::Message& message, const pb::FieldDescriptor* field) {
  const pb::Reflection* reflection = message.GetReflection();
  if (field->is_repeated()) {
    return reflection->FieldSize(message, field) > 0;
  }
  if (field->has_presence()) {
    return reflection->HasField(message, field);
  }
  if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
    return reflection->GetEnumValue(message, field) != 0;
  }
  return reflection->HasField(message, field);
}

void check_range(const pb::Message& message, const pb::FieldDescriptor* field, int index,
                 const std::string& path, std::vector<Problem>& problems) {
  const double value = numeric_value(message, field, index);
  const pb::FieldOptions& options = field->options();
  if (!std::isfinite(value)) {
    problems.push_back({path, "value " + format_number(value) + " is not a finite number"});
    return;
  }
  const bool has_min = options.HasExtension(min_value);
  const bool has_max = options.HasExtension(max_value);
  const double low = options.GetExtension(min_value);
  const double high = options.GetExtension(max_value);
  const bool exclusive = options.GetExtension(min_exclusive);
  const bool below = has_min && (exclusive ? value <= low : value < low);
  const bool above = has_max && value > high;
  if (!below && !above) {
    return;
  }
  std::string expected;
  if (has_min && has_max) {
    expected =
        (exclusive ? "in (" : "in [") + format_number(low) + ", " + format_number(high) + "]";
  } else if (has_min) {
    expected = (exclusive ? "> " : ">= ") + format_number(low);
  } else {
    expected = "<= " + format_number(high);
  }
  problems.push_back({path, "value " + format_number(value) + unit_text(field) +
                                " is out of range: expected " + expected + unit_text(field)});
}

void walk(const pb::Message& message, const std::string& prefix, const ConfigLoader& loader,
          const LocationMap& locations, std::vector<Problem>& problems) {
  const pb::Descriptor* type = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  for (int f = 0; f < type->field_count(); ++f) {
    const pb::FieldDescriptor* field = type->field(f);
    const pb::FieldOptions& options = field->options();
    const std::string path = join_path(prefix, field->name());
    if (field->is_repeated()) {
      const int count = reflection->FieldSize(message, field);
      const uint32_t minimum = options.GetExtension(min_items);
      if (count < static_cast<int>(minimum)) {
        problems.push_back({path, count == 0 ? "missing required list '" + field->name() + "'"
                                             : "'" + field->name() + "' needs at least " +
                                                   std::to_string(minimum) + " entries, has " +
                                                   std::to_string(count)});
      }
      for (int i = 0; i < count; ++i) {
        const std::string item = path + "[" + std::to_string(i) + "]";
        if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          walk(reflection->GetRepeatedMessage(message, field, i), item, loader, locations,
               problems);
        } else if (is_numeric(field)) {
          check_range(message, field, i, item, problems);
        }
      }
      continue;
    }
    if (!is_present(message, field)) {
      if (options.GetExtension(required)) {
        const std::string& symbol = options.GetExtension(unit);
        problems.push_back(
            {path, "missing required field '" + field->name() + "'" +
                       (symbol.empty() || symbol == "1" ? "" : " (" + symbol + ")")});
      }
      continue;
    }
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      walk(reflection->GetMessage(message, field), path, loader, locations, problems);
    } else if (is_numeric(field)) {
      check_range(message, field, -1, path, problems);
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM &&
               field->enum_type()->FindValueByNumber(reflection->GetEnumValue(message, field)) ==
                   nullptr) {
      // proto3 enums are open: a number the schema does not name parses, and is refused here.
      problems.push_back({path, "value " +
                                    std::to_string(reflection->GetEnumValue(message, field)) +
                                    " is not a " + field->enum_type()->name()});
      return;  // the consistency rules below assume known values
    }
  }
  detail::check_consistency(message, prefix, loader, locations, problems);
}

}  // namespace

std::vector<Problem> validate(const pb::Message& message, const ConfigLoader& loader,
                              const LocationMap& locations) {
  std::vector<Problem> problems;
  walk(message, "", loader, locations, problems);
  return problems;
}

InvalidConfig::InvalidConfig(const std::vector<Problem>& problems, const LocationMap& locations)
    : ConfigError(problems.empty() ? "invalid config" : problems.front().what) {
  for (const Problem& problem : problems) {
    std::string where = describe(locations.nearest(problem.path));
    if (!problem.path.empty()) {
      where += ", field " + problem.path;
    }
    lines_.push_back(format_error_line(problem.what, where));
  }
}

std::vector<std::string> InvalidConfig::lines() const {
  return lines_;
}

}  // namespace kvtier::config
