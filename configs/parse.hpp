#pragma once
// Reading configs: protobuf text format or JSON, into a message plus the position of every value.

#include <google/protobuf/message.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "configs/locations.hpp"

namespace kvtier::config {

// JSON when the first character that is not blank or part of a '#' comment is '{'.
[[nodiscard]] bool looks_like_json(std::string_view text);

// Where `text` stops being text any config could be: a NUL anywhere, or outside comments a byte
// that is not UTF-8 ('#' outside a string starts a comment, to the line's end, which may hold
// any other byte, as the text format's tokenizer skips it).
struct NonTextByte {
  std::size_t offset;  // from the text's start
  std::string place;   // "FILE:LINE:COLUMN", the column in bytes from the line's start
};
[[nodiscard]] std::optional<NonTextByte> find_non_text_byte(std::string_view text,
                                                            const std::string& file_name);

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
