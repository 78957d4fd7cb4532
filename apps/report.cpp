#include "apps/report.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include "common/text_output.hpp"
#include "configs/schema/options.pb.h"

namespace kvtier::app {
namespace {

namespace pb = google::protobuf;

std::string scalar_text(const pb::Message& message, const pb::FieldDescriptor* field, int index,
                        bool& quoted) {
  const pb::Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  quoted = false;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(rep ? r->GetRepeatedInt32(message, field, index)
                                : r->GetInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(rep ? r->GetRepeatedInt64(message, field, index)
                                : r->GetInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(rep ? r->GetRepeatedUInt32(message, field, index)
                                : r->GetUInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(rep ? r->GetRepeatedUInt64(message, field, index)
                                : r->GetUInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return format_double(rep ? r->GetRepeatedDouble(message, field, index)
                               : r->GetDouble(message, field));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return format_double(rep ? r->GetRepeatedFloat(message, field, index)
                               : r->GetFloat(message, field));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                 ? "true"
                 : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      quoted = true;
      return (rep ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field))->name();
    case pb::FieldDescriptor::CPPTYPE_STRING:
      quoted = true;
      return rep ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: break;
  }
  return {};
}

void flatten(const pb::Message& message, const std::string& prefix, std::vector<Row>& rows) {
  std::vector<const pb::FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = prefix.empty() ? field->name() : prefix + "." + field->name();
    const int count = field->is_repeated() ? message.GetReflection()->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const int index = field->is_repeated() ? i : -1;
      const std::string item = field->is_repeated() ? path + "[" + std::to_string(i) + "]" : path;
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        const pb::Message& child =
            field->is_repeated() ? message.GetReflection()->GetRepeatedMessage(message, field, i)
                                 : message.GetReflection()->GetMessage(message, field);
        flatten(child, item, rows);
        continue;
      }
      bool quoted = false;
      const std::string text = scalar_text(message, field, index, quoted);
      std::string unit_symbol = field->options().GetExtension(config::unit);
      if (unit_symbol == "1") {
        unit_symbol.clear();
      }
      rows.push_back(Row{item, text, quoted ? json_escape(text) : text, unit_symbol});
    }
  }
}

}  // namespace

std::vector<Row> spec_rows(const pb::Message& message) {
  std::vector<Row> rows;
  flatten(message, "", rows);
  return rows;
}

Row integer_row(std::string name, uint64_t value, std::string unit) {
  return Row{std::move(name), std::to_string(value), std::to_string(value), std::move(unit)};
}

Row number_row(std::string name, double value, std::string unit, int decimals) {
  return Row{std::move(name), format_fixed(value, decimals), format_double(value), std::move(unit)};
}

Row text_row(std::string name, std::string value, std::string unit) {
  std::string json = json_escape(value);
  return Row{std::move(name), std::move(value), std::move(json), std::move(unit)};
}

void print_rows(std::ostream& out, const std::vector<Row>& rows, const std::string& first_header,
                bool numeric) {
  TextTable table({first_header, "value", "unit"}, {false, numeric, false});
  for (const Row& row : rows) {
    table.add_row({row.name, row.text, row.unit});
  }
  table.render(out);
}

std::string rows_json(const std::vector<Row>& rows) {
  std::string json = "{";
  for (size_t i = 0; i < rows.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(rows[i].name) + ": " + rows[i].json;
  }
  return json + "}";
}

std::string message_json(const pb::Message& message) {
  std::string json;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  const auto status = pb::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return "null";
  }
  return json;
}

}  // namespace kvtier::app
