#pragma once
// Every string field of a message made valid UTF-8 before it is serialised (common/utf8.hpp):
// protobuf refuses to parse a string field that is not, so a trace's /meta or a measurement
// file would otherwise be written but never read back.

#include <google/protobuf/message.h>

namespace kvtier::config {

// Replaces invalid bytes with U+FFFD in every string (not bytes) field, nested messages included.
void make_strings_valid_utf8(google::protobuf::Message& message);

}  // namespace kvtier::config
