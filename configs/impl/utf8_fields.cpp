// String fields made valid UTF-8 (configs/utf8_fields.hpp).
#include "configs/utf8_fields.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <string>
#include <vector>

#include "common/utf8.hpp"

namespace kvtier::config {

void make_strings_valid_utf8(google::protobuf::Message& message) {
  namespace pb = google::protobuf;
  const pb::Reflection& reflection = *message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    if (field->type() == pb::FieldDescriptor::TYPE_STRING) {
      if (field->is_repeated()) {
        std::string scratch;
        for (int i = 0; i < reflection.FieldSize(message, field); ++i) {
          const std::string& text =
              reflection.GetRepeatedStringReference(message, field, i, &scratch);
          if (!is_valid_utf8(text)) {
            reflection.SetRepeatedString(&message, field, i, valid_utf8(text));
          }
        }
      } else {
        const std::string text = reflection.GetString(message, field);
        if (!is_valid_utf8(text)) {
          reflection.SetString(&message, field, valid_utf8(text));
        }
      }
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection.FieldSize(message, field); ++i) {
          make_strings_valid_utf8(*reflection.MutableRepeatedMessage(&message, field, i));
        }
      } else {
        make_strings_valid_utf8(*reflection.MutableMessage(&message, field));
      }
    }
  }
}

}  // namespace kvtier::config
