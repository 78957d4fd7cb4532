#pragma once
// Reading configs: protobuf text format or JSON, into a message plus the position of every value.

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

#include "configs/locations.hpp"

namespace kvtier::config {

// JSON when the first character that is not blank or part of a '#' comment is '{'.
[[nodiscard]] bool looks_like_json(std::string_view text);

// Parses `text` into `message` (cleared first) and records where each field was written.
// Throws ConfigError naming `file_name`, line:column, the field path and what was expected.
void parse_config(std::string_view text, const std::string& file_name,
                  google::protobuf::Message& message, LocationMap& locations);

// The whole file; ConfigError (naming the file) when it cannot be read.
[[nodiscard]] std::string read_config_file(const std::string& path);

namespace detail {
void parse_text_format(std::string_view text, const std::string& file_name,
                       google::protobuf::Message& message, LocationMap& locations);
void parse_json(std::string_view text, const std::string& file_name,
                google::protobuf::Message& message, LocationMap& locations);
}  // namespace detail

}  // namespace kvtier::config
