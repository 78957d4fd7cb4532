// `--set PATH=VALUE` on any config message, through reflection and the schema's unit annotations.

#include <google/protobuf/descriptor.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/schema/options.pb.h"
#include "configs/units.hpp"

namespace kvtier::config {
namespace {

namespace pb = google::protobuf;

struct Segment {
  std::string name;
  int index = -1;  // -1: no [i]
};

std::vector<Segment> split_path(const Override& override_) {
  std::vector<Segment> segments;
  std::string_view rest = override_.path;
  while (!rest.empty()) {
    const size_t dot = rest.find('.');
    std::string_view part = rest.substr(0, dot);
    rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
    Segment segment;
    if (const size_t open = part.find('['); open != std::string_view::npos) {
      if (part.back() != ']' || open + 2 > part.size() - 1) {
        throw ConfigError("malformed index in path '" + override_.path + "'",
                          "--set " + override_.argument);
      }
      const std::string digits(part.substr(open + 1, part.size() - open - 2));
      if (digits.find_first_not_of("0123456789") != std::string::npos) {
        throw ConfigError(
            "index '" + digits + "' in path '" + override_.path + "' is not a non-negative integer",
            "--set " + override_.argument);
      }
      const auto [end, error] =
          std::from_chars(digits.data(), digits.data() + digits.size(), segment.index);
      if (error != std::errc() || end != digits.data() + digits.size()) {
        throw ConfigError("index '" + digits + "' in path '" + override_.path + "' is too large",
                          "--set " + override_.argument);
      }
      part = part.substr(0, open);
    }
    if (part.empty()) {
      throw ConfigError("empty field name in path '" + override_.path + "'",
                        "--set " + override_.argument);
    }
    segment.name = std::string(part);
    segments.push_back(std::move(segment));
  }
  if (segments.empty()) {
    throw ConfigError("empty path", "--set " + override_.argument);
  }
  return segments;
}

std::string field_names(const pb::Descriptor* type) {
  std::string names;
  for (int i = 0; i < type->field_count(); ++i) {
    names += (i == 0 ? "" : ", ") + type->field(i)->name();
  }
  return names;
}

// Finds the field a path segment names: its exact name, or its name without the unit suffix.
// `exact` reports which, because only exact names may take bare numbers.
const pb::FieldDescriptor* find_field(const pb::Descriptor* type, const std::string& name,
                                      bool& exact) {
  if (const auto* field = type->FindFieldByName(name)) {
    exact = true;
    return field;
  }
  exact = false;
  for (int i = 0; i < type->field_count(); ++i) {
    const auto* field = type->field(i);
    const auto suffix = units::field_suffix(field->options().GetExtension(unit));
    if (suffix && field->name() == name + std::string(*suffix)) {
      return field;
    }
  }
  return nullptr;
}

bool parse_bool(std::string_view text, bool& value) {
  std::string lower;
  for (const char c : text) {
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") {
    value = true;
    return true;
  }
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") {
    value = false;
    return true;
  }
  return false;
}

class Setter {
 public:
  Setter(const Override& request, const pb::FieldDescriptor* field, bool exact)
      : request_(request), field_(field), exact_(exact) {}

  void set(pb::Message& message, const std::string& text, int index) const {
    const pb::Reflection* reflection = message.GetReflection();
    const bool repeated = index >= 0;
    switch (field_->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        repeated ? reflection->SetRepeatedString(&message, field_, index, text)
                 : reflection->SetString(&message, field_, text);
        return;
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        bool value = false;
        if (!parse_bool(text, value)) {
          fail("'" + text + "' is not a boolean (true or false)");
        }
        repeated ? reflection->SetRepeatedBool(&message, field_, index, value)
                 : reflection->SetBool(&message, field_, value);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumValueDescriptor* value = find_enum(text);
        repeated ? reflection->SetRepeatedEnum(&message, field_, index, value)
                 : reflection->SetEnum(&message, field_, value);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        const double value = number(text);
        if (field_->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
          repeated
              ? reflection->SetRepeatedFloat(&message, field_, index, static_cast<float>(value))
              : reflection->SetFloat(&message, field_, static_cast<float>(value));
        } else {
          repeated ? reflection->SetRepeatedDouble(&message, field_, index, value)
                   : reflection->SetDouble(&message, field_, value);
        }
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_INT32:
      case pb::FieldDescriptor::CPPTYPE_INT64:
      case pb::FieldDescriptor::CPPTYPE_UINT32:
      case pb::FieldDescriptor::CPPTYPE_UINT64: set_integer(message, text, index); return;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        fail("'" + field_->name() +
             "' is a message; set one of its fields: " + field_names(field_->message_type()));
    }
  }

  void append(pb::Message& message) const {
    const pb::Reflection* reflection = message.GetReflection();
    switch (field_->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING: reflection->AddString(&message, field_, ""); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: reflection->AddBool(&message, field_, false); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: reflection->AddEnumValue(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: reflection->AddDouble(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: reflection->AddFloat(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_INT32: reflection->AddInt32(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: reflection->AddInt64(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: reflection->AddUInt32(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: reflection->AddUInt64(&message, field_, 0); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: reflection->AddMessage(&message, field_); break;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(what, "--set " + request_.argument + ", field " + request_.path);
  }

  const pb::EnumValueDescriptor* find_enum(const std::string& text) const {
    const pb::EnumDescriptor* type = field_->enum_type();
    std::string upper;
    for (const char c : text) {
      upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    const pb::EnumValueDescriptor* value = type->FindValueByName(upper);
    if (value == nullptr || value->number() == 0) {
      std::string allowed;
      for (int i = 1; i < type->value_count(); ++i) {
        allowed += (i == 1 ? "" : ", ") + type->value(i)->name();
      }
      fail("'" + text + "' is not one of " + allowed);
    }
    return value;
  }

  double number(const std::string& text) const {
    std::string unit_symbol = field_->options().GetExtension(unit);
    if (unit_symbol.empty()) {
      unit_symbol = "1";
    }
    return units::convert(text, unit_symbol, exact_,
                          "--set " + request_.argument + ", field " + request_.path);
  }

  // Plain digits (with a sign for signed fields) into a 64-bit field, read exactly: through a
  // double, integers past 2^53 would be rounded. nullopt for any other text.
  [[nodiscard]] std::optional<std::string> exact_digits(const std::string& text) const {
    const bool is64 = field_->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64 ||
                      field_->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT64;
    const std::size_t first = !text.empty() && text.front() == '-' ? 1 : 0;
    if (!is64 || !exact_ || text.size() == first ||
        text.find_first_not_of("0123456789", first) != std::string::npos) {
      return std::nullopt;
    }
    return text;
  }

  void set_exact_integer(pb::Message& message, const std::string& digits, int index) const {
    const pb::Reflection* reflection = message.GetReflection();
    const bool repeated = index >= 0;
    const char* end = digits.data() + digits.size();
    if (field_->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      std::int64_t v = 0;
      const auto parsed = std::from_chars(digits.data(), end, v);
      if (parsed.ec != std::errc() || parsed.ptr != end) {
        fail("'" + digits + "' does not fit field type int64");
      }
      repeated ? reflection->SetRepeatedInt64(&message, field_, index, v)
               : reflection->SetInt64(&message, field_, v);
      return;
    }
    std::uint64_t v = 0;
    const auto parsed = std::from_chars(digits.data(), end, v);
    if (digits.front() == '-' || parsed.ec != std::errc() || parsed.ptr != end) {
      fail("'" + digits + "' does not fit field type uint64");
    }
    repeated ? reflection->SetRepeatedUInt64(&message, field_, index, v)
             : reflection->SetUInt64(&message, field_, v);
  }

  void set_integer(pb::Message& message, const std::string& text, int index) const {
    if (const auto digits = exact_digits(text)) {
      set_exact_integer(message, *digits, index);
      return;
    }
    const double value = number(text);
    if (std::floor(value) != value) {
      fail("'" + text + "' is not a whole number");
    }
    const pb::Reflection* reflection = message.GetReflection();
    const bool repeated = index >= 0;
    auto check = [&](double low, double high) {
      if (high == 0x1p53 && std::fabs(value) > high && std::fabs(value) < 0x1p64) {
        fail("'" + text + "' is past 2^53, where a unit or exponent is not exact: write the " +
             "number in plain digits");
      }
      if (value < low || value > high) {
        fail("'" + text + "' does not fit field type " + std::string(field_->cpp_type_name()));
      }
    };
    switch (field_->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: {
        check(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
        const auto v = static_cast<int32_t>(value);
        repeated ? reflection->SetRepeatedInt32(&message, field_, index, v)
                 : reflection->SetInt32(&message, field_, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        check(-0x1p53, 0x1p53);
        const auto v = static_cast<int64_t>(value);
        repeated ? reflection->SetRepeatedInt64(&message, field_, index, v)
                 : reflection->SetInt64(&message, field_, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32: {
        check(0, std::numeric_limits<uint32_t>::max());
        const auto v = static_cast<uint32_t>(value);
        repeated ? reflection->SetRepeatedUInt32(&message, field_, index, v)
                 : reflection->SetUInt32(&message, field_, v);
        break;
      }
      default: {
        // Plain digits were read exactly above; a unit or an exponent comes through a double,
        // whose whole numbers are exact up to 2^53.
        check(0, 0x1p53);
        const auto v = static_cast<uint64_t>(value);
        repeated ? reflection->SetRepeatedUInt64(&message, field_, index, v)
                 : reflection->SetUInt64(&message, field_, v);
        break;
      }
    }
  }

  const Override& request_;
  const pb::FieldDescriptor* field_;
  bool exact_;
};

}  // namespace

Override parse_override(std::string_view argument) {
  const size_t equals = argument.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw ConfigError("expected PATH=VALUE", "--set " + std::string(argument));
  }
  return Override{std::string(argument.substr(0, equals)), std::string(argument.substr(equals + 1)),
                  std::string(argument)};
}

void apply_override(pb::Message& root, const Override& override_, LocationMap& locations) {
  const std::vector<Segment> segments = split_path(override_);
  const std::string where = "--set " + override_.argument;
  const bool removing = override_.value == kRemoveField;
  pb::Message* message = &root;
  // A preset's values are expanded into its message before these overrides where a file is
  // loaded, and again at each sweep point that names another preset: a value removed from
  // under it could come back, so nothing under a preset is removed.
  const auto refuse_under_preset = [&](const pb::Message& holder, const std::string& at) {
    const pb::FieldDescriptor* preset = holder.GetDescriptor()->FindFieldByName("preset");
    if (preset != nullptr && holder.GetReflection()->HasField(holder, preset)) {
      throw ConfigError("nothing under a preset can be removed (" + join_path(at, "preset") +
                            " names one); write that part without the preset instead",
                        where + ", field " + override_.path);
    }
  };
  std::string canonical;
  std::string parent_canonical;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& segment = segments[i];
    // Removing a preset's name itself has its own refusal, below.
    if (removing && (i + 1 < segments.size() || segment.name != "preset")) {
      refuse_under_preset(*message, canonical);
    }
    const pb::Descriptor* type = message->GetDescriptor();
    bool exact = false;
    const pb::FieldDescriptor* field = find_field(type, segment.name, exact);
    if (field == nullptr) {
      throw ConfigError("'" + segment.name + "' is not a field of " + type->name() +
                            " (fields: " + field_names(type) + ")",
                        where + ", field " + override_.path);
    }
    const pb::Reflection* reflection = message->GetReflection();
    std::string name = field->name();
    if (segment.index >= 0) {
      if (!field->is_repeated()) {
        throw ConfigError("'" + field->name() + "' is not a list; drop the [" +
                              std::to_string(segment.index) + "]",
                          where + ", field " + override_.path);
      }
      const int size = reflection->FieldSize(*message, field);
      if (segment.index > size) {
        throw ConfigError("index " + std::to_string(segment.index) + " is past the end of '" +
                              field->name() + "' (" + std::to_string(size) + " entries; index " +
                              std::to_string(size) + " appends one)",
                          where + ", field " + override_.path);
      }
      if (removing && i + 1 == segments.size()) {
        throw ConfigError("'" + std::string(kRemoveField) + "' removes a whole field; name '" +
                              field->name() + "' without the [" + std::to_string(segment.index) +
                              "]",
                          where + ", field " + override_.path);
      }
      if (segment.index == size) {
        if (removing) {
          return;  // nothing there to remove from
        }
        Setter(override_, field, exact).append(*message);
      }
      name += "[" + std::to_string(segment.index) + "]";
    }
    parent_canonical = canonical;
    canonical = join_path(canonical, name);
    const bool last = i + 1 == segments.size();
    if (!last) {
      if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        throw ConfigError("'" + field->name() + "' is a value, not a message with fields",
                          where + ", field " + override_.path);
      }
      if (field->is_repeated() && segment.index < 0) {
        throw ConfigError(
            "'" + field->name() + "' is a list; name an entry, e.g. " + field->name() + "[0]",
            where + ", field " + override_.path);
      }
      if (removing && !field->is_repeated() && !reflection->HasField(*message, field)) {
        return;  // not there: nothing under it to remove, and nothing made to hold it
      }
      message = field->is_repeated()
                    ? reflection->MutableRepeatedMessage(message, field, segment.index)
                    : reflection->MutableMessage(message, field);
      continue;
    }
    if (removing) {
      if (field->name() == "preset") {
        // Its values were expanded into the message already where a sweep's base is resolved,
        // and not yet where a file is loaded: removing the name would mean two things.
        throw ConfigError("a preset cannot be removed; name another preset instead",
                          where + ", field " + override_.path);
      }
      reflection->ClearField(message, field);
      break;  // its position: this --set, which a "missing field" names
    }
    const Setter setter(override_, field, exact);
    if (field->is_repeated() && segment.index < 0) {
      // A whole list: comma-separated values replace it.
      reflection->ClearField(message, field);
      std::string_view rest = override_.value;
      while (true) {
        const size_t comma = rest.find(',');
        setter.append(*message);
        setter.set(*message, std::string(rest.substr(0, comma)),
                   reflection->FieldSize(*message, field) - 1);
        if (comma == std::string_view::npos) {
          break;
        }
        rest = rest.substr(comma + 1);
      }
    } else {
      if (field->name() == "preset") {
        // A new preset replaces the whole message; other overrides are applied after it.
        message->Clear();
        locations.erase_under(parent_canonical);
      }
      setter.set(*message, override_.value, segment.index);
    }
  }
  locations.erase_under(canonical);
  locations.set(canonical, SourcePosition{where, 0, 0});
}

}  // namespace kvtier::config
