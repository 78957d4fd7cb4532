#include "configs/loader.hpp"

#include <google/protobuf/descriptor.h>

#include <array>
#include <filesystem>

#include "common/errors.hpp"
#include "configs/parse.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "configs/schema/options.pb.h"
#include "configs/schema/policy.pb.h"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"
#include "configs/schema/workload.pb.h"
#include "configs/validate.hpp"

namespace kvtier::config {
namespace {

namespace pb = google::protobuf;

constexpr int kMaxPresetDepth = 8;

constexpr std::array<std::string_view, 10> kConfigKinds = {
    "run", "sweep", "hardware", "node", "gpu", "host", "link", "model", "workload", "policy"};

bool overrides_preset(const Override& override_) {
  return override_.path == "preset" ||
         (override_.path.size() > 7 &&
          override_.path.compare(override_.path.size() - 7, 7, ".preset") == 0);
}

std::string indexed(const pb::FieldDescriptor* field, int index) {
  return field->is_repeated() ? field->name() + "[" + std::to_string(index) + "]" : field->name();
}

// Copies one field's value (a list whole) from `from` to `to`, replacing what `to` had.
void copy_field(const pb::Message& from, pb::Message& to, const pb::FieldDescriptor* field) {
  const pb::Reflection* source = from.GetReflection();
  const pb::Reflection* target = to.GetReflection();
  target->ClearField(&to, field);
  if (!field->is_repeated()) {
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        target->SetInt32(&to, field, source->GetInt32(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        target->SetInt64(&to, field, source->GetInt64(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        target->SetUInt32(&to, field, source->GetUInt32(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        target->SetUInt64(&to, field, source->GetUInt64(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        target->SetDouble(&to, field, source->GetDouble(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        target->SetFloat(&to, field, source->GetFloat(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        target->SetBool(&to, field, source->GetBool(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        target->SetEnumValue(&to, field, source->GetEnumValue(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        target->SetString(&to, field, source->GetString(from, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        target->MutableMessage(&to, field)->CopyFrom(source->GetMessage(from, field));
        break;
    }
    return;
  }
  const int count = source->FieldSize(from, field);
  for (int i = 0; i < count; ++i) {
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        target->AddInt32(&to, field, source->GetRepeatedInt32(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        target->AddInt64(&to, field, source->GetRepeatedInt64(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        target->AddUInt32(&to, field, source->GetRepeatedUInt32(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        target->AddUInt64(&to, field, source->GetRepeatedUInt64(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        target->AddDouble(&to, field, source->GetRepeatedDouble(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        target->AddFloat(&to, field, source->GetRepeatedFloat(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        target->AddBool(&to, field, source->GetRepeatedBool(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        target->AddEnumValue(&to, field, source->GetRepeatedEnumValue(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        target->AddString(&to, field, source->GetRepeatedString(from, field, i));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        target->AddMessage(&to, field)->CopyFrom(source->GetRepeatedMessage(from, field, i));
        break;
    }
  }
}

// Lays `top` over `base`: values present in `top` win; a list present in `top` replaces the
// base's list whole; a sub-message that names a preset of its own replaces the base's whole.
// Positions recorded for replaced values are dropped from `base_locations`.
void overlay(pb::Message& base, const pb::Message& top, const std::string& prefix,
             LocationMap& base_locations) {
  const pb::Reflection* reflection = top.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(top, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = join_path(prefix, field->name());
    if (!field->is_repeated() && field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      const pb::Message& child = reflection->GetMessage(top, field);
      const pb::FieldDescriptor* preset_field = child.GetDescriptor()->FindFieldByName("preset");
      const bool names_preset =
          preset_field != nullptr && child.GetReflection()->HasField(child, preset_field);
      if (!names_preset) {
        overlay(*base.GetReflection()->MutableMessage(&base, field), child, path, base_locations);
        continue;
      }
    }
    base_locations.erase_under(path);
    copy_field(top, base, field);
  }
}

}  // namespace

std::span<const std::string_view> config_kinds() {
  return kConfigKinds;
}

template <typename Spec>
std::unique_ptr<pb::Message> make() {
  return std::make_unique<Spec>();
}

std::unique_ptr<pb::Message> new_config_message(std::string_view kind) {
  using Factory = std::unique_ptr<pb::Message> (*)();
  static constexpr std::array<std::pair<std::string_view, Factory>, kConfigKinds.size()>
      kFactories = {{
          {"run", &make<RunSpec>},
          {"sweep", &make<SweepSpec>},
          {"hardware", &make<HardwareSpec>},
          {"node", &make<NodeSpec>},
          {"gpu", &make<GpuSpec>},
          {"host", &make<HostSpec>},
          {"link", &make<LinkSpec>},
          {"model", &make<ModelSpec>},
          {"workload", &make<WorkloadSpec>},
          {"policy", &make<PolicySpec>},
      }};
  for (const auto& [name, factory] : kFactories) {
    if (name == kind) {
      return factory();
    }
  }
  std::string known;
  for (const auto name : kConfigKinds) {
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw ConfigError("unknown config kind '" + std::string(kind) + "' (kinds: " + known + ")");
}

std::string declared_kind(std::string_view text) {
  constexpr std::string_view kMarker = "# proto-message:";
  const size_t found = text.find(kMarker);
  if (found == std::string_view::npos || (found != 0 && text[found - 1] != '\n')) {
    return {};
  }
  size_t start = found + kMarker.size();
  const size_t end = text.find('\n', start);
  std::string name(text.substr(start, end == std::string_view::npos ? end : end - start));
  name.erase(0, name.find_first_not_of(" \t"));
  name.erase(name.find_last_not_of(" \t\r") + 1);
  if (const size_t dot = name.rfind('.'); dot != std::string::npos) {
    name.erase(0, dot + 1);  // a full name such as kvtier.config.RunSpec
  }
  for (const auto kind : kConfigKinds) {
    if (new_config_message(kind)->GetDescriptor()->name() == name) {
      return std::string(kind);
    }
  }
  throw ConfigError("'# proto-message: " + name + "' names no config message type");
}

void ConfigLoader::resolve(pb::Message& message, LocationMap& locations, const std::string& prefix,
                           int depth) const {
  if (depth > kMaxPresetDepth) {
    throw ConfigError("presets refer to each other more than " + std::to_string(kMaxPresetDepth) +
                          " levels deep (a cycle?)",
                      describe(locations.nearest(prefix)) + ", field " + prefix);
  }
  const pb::Reflection* reflection = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      continue;
    }
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      pb::Message* child = field->is_repeated()
                               ? reflection->MutableRepeatedMessage(&message, field, i)
                               : reflection->MutableMessage(&message, field);
      resolve(*child, locations, join_path(prefix, indexed(field, i)), depth);
    }
  }
  const pb::Descriptor* type = message.GetDescriptor();
  const std::string& kind = type->options().GetExtension(preset_kind);
  const pb::FieldDescriptor* preset_field = type->FindFieldByName("preset");
  if (kind.empty() || preset_field == nullptr || !reflection->HasField(message, preset_field)) {
    return;
  }
  const std::string name = reflection->GetString(message, preset_field);
  const PresetFile* preset = presets_.find(kind, name);
  const std::string preset_path = join_path(prefix, "preset");
  if (preset == nullptr) {
    throw ConfigError(presets_.unknown_message(kind, name),
                      describe(locations.nearest(preset_path)) + ", field " + preset_path);
  }
  std::unique_ptr<pb::Message> base(message.New());
  LocationMap base_locations(std::string(preset->path));
  parse_config(preset->text, std::string(preset->path), *base, base_locations);
  resolve(*base, base_locations, "", depth + 1);
  overlay(*base, message, "", base_locations);
  base->GetReflection()->SetString(base.get(), base->GetDescriptor()->FindFieldByName("preset"),
                                   std::string(preset->name));
  message.CopyFrom(*base);
  // Positions: the preset's values, then what the referring config wrote over them.
  LocationMap written;
  for (const auto& [path, position] : locations.entries()) {
    if (path.rfind(prefix, 0) == 0) {
      written.set(path, position);
    }
  }
  locations.erase_under(prefix);
  LocationMap rebuilt;
  rebuilt.insert_under(prefix, base_locations);
  for (const auto& [path, position] : rebuilt.entries()) {
    locations.set(path, position);
  }
  for (const auto& [path, position] : written.entries()) {
    locations.set(path, position);
  }
}

LocationMap ConfigLoader::resolve_text(std::string_view text, const std::string& file_name,
                                       pb::Message& message,
                                       std::span<const Override> overrides) const {
  LocationMap locations(file_name);
  parse_config(text, file_name, message, locations);
  apply_and_resolve(message, locations, overrides);
  return locations;
}

void ConfigLoader::apply_and_resolve(pb::Message& message, LocationMap& locations,
                                     std::span<const Override> overrides) const {
  for (const Override& override_ : overrides) {
    if (overrides_preset(override_)) {
      apply_override(message, override_, locations);
    }
  }
  resolve(message, locations, "", 0);
  for (const Override& override_ : overrides) {
    if (!overrides_preset(override_)) {
      apply_override(message, override_, locations);
    }
  }
}

LocationMap ConfigLoader::load_text(std::string_view text, const std::string& file_name,
                                    pb::Message& message,
                                    std::span<const Override> overrides) const {
  LocationMap locations = resolve_text(text, file_name, message, overrides);
  const std::vector<Problem> problems = validate(message, *this, locations);
  if (!problems.empty()) {
    throw InvalidConfig(problems, locations);
  }
  return locations;
}

LocationMap ConfigLoader::load_file(const std::string& path, pb::Message& message,
                                    std::span<const Override> overrides) const {
  return load_text(read_config_file(path), path, message, overrides);
}

LocationMap ConfigLoader::resolve_file(const std::string& path, pb::Message& message,
                                       std::span<const Override> overrides) const {
  return resolve_text(read_config_file(path), path, message, overrides);
}

LocationMap ConfigLoader::load_preset(const PresetFile& preset, pb::Message& message,
                                      std::span<const Override> overrides) const {
  return load_text(preset.text, std::string(preset.path), message, overrides);
}

void resolve_run_paths(RunSpec& run, const std::string& config_file, bool traces) {
  const std::filesystem::path folder = std::filesystem::path(config_file).parent_path();
  const auto resolved = [&folder](const std::string& named) {
    const std::filesystem::path path = named;
    return path.is_relative() ? (folder / path).lexically_normal().string() : named;
  };
  if (run.workload().has_request_file()) {
    auto& request_file = *run.mutable_workload()->mutable_request_file();
    request_file.set_path(resolved(request_file.path()));
  }
  if (run.has_outputs() && run.outputs().has_directory() && !run.outputs().directory().empty()) {
    run.mutable_outputs()->set_directory(resolved(run.outputs().directory()));
  }
  // mutable_tiering() would add an (invalid, empty) block to a run that has none.
  if (traces && run.has_tiering()) {
    for (std::string& trace : *run.mutable_tiering()->mutable_traces()) {
      trace = resolved(trace);
    }
  }
}

}  // namespace kvtier::config
