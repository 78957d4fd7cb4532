// JSON configs. Protobuf's JSON parser does the conversion (and names the field path of a bad
// value, but not its line); a small syntax scanner here checks the text first and records the
// line and column of every key and array element, so errors can point at them.

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/utf8.hpp"
#include "configs/parse.hpp"

namespace kvtier::config {
namespace {

namespace pb = google::protobuf;

// JSON names may be lowerCamelCase (protobuf's json_name); positions are keyed by field name.
std::string to_snake_case(std::string_view name) {
  std::string snake;
  for (const char c : name) {
    if (std::isupper(static_cast<unsigned char>(c)) != 0) {
      snake += '_';
      snake += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      snake += c;
    }
  }
  return snake;
}

class JsonScanner {
 public:
  JsonScanner(std::string_view text, const std::string& file, LocationMap& locations)
      : text_(text), file_(file), locations_(locations) {}

  void scan() {
    skip_space();
    value("");
    skip_space();
    if (pos_ < text_.size()) {
      fail("unexpected text after the end of the JSON object", "");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& path) {
    std::string where = describe(SourcePosition{file_, line_, column_});
    if (!path.empty()) {
      where += ", field " + path;
    }
    throw ConfigError(what, where);
  }

  void advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
    ++pos_;
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      if (std::isspace(static_cast<unsigned char>(text_[pos_])) != 0) {
        advance();
      } else if (text_[pos_] == '#' && line_start()) {
        while (pos_ < text_.size() && text_[pos_] != '\n') {
          advance();
        }
      } else {
        break;
      }
    }
  }

  // A '#' comment is tolerated only as the first thing on a line (a preset's source note).
  bool line_start() const {
    size_t back = pos_;
    while (back > 0 && (text_[back - 1] == ' ' || text_[back - 1] == '\t')) {
      --back;
    }
    return back == 0 || text_[back - 1] == '\n';
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void expect(char wanted, const std::string& path) {
    skip_space();
    if (peek() != wanted) {
      fail(std::string("expected '") + wanted + "'" +
               (pos_ < text_.size() ? std::string(", found '") + peek() + "'"
                                    : ", found end of file"),
           path);
    }
    advance();
  }

  void value(const std::string& path) {
    skip_space();
    locations_.set(path, SourcePosition{file_, line_, column_});
    switch (peek()) {
      case '{': object(path); break;
      case '[': array(path); break;
      case '"': string(path); break;
      case '\0': fail("unexpected end of file, expected a value", path);
      default: scalar(path); break;
    }
  }

  void object(const std::string& path) {
    advance();
    skip_space();
    if (peek() == '}') {
      advance();
      return;
    }
    // Protobuf's JSON parser merges a repeated key into the first (the last value wins) where
    // the text format refuses it: refused here, under either spelling of the name.
    std::set<std::string> keys;
    while (true) {
      skip_space();
      if (peek() != '"') {
        fail("expected a quoted field name", path);
      }
      const int key_line = line_;
      const int key_column = column_;
      const std::string name = to_snake_case(string(path));
      const std::string child = join_path(path, name);
      if (!keys.insert(name).second) {
        throw ConfigError(
            "field '" + name + "' is given more than once (write it once; lists are arrays)",
            describe(SourcePosition{file_, key_line, key_column}) + ", field " + child);
      }
      expect(':', child);
      value(child);
      locations_.set(child, SourcePosition{file_, key_line, key_column});
      skip_space();
      if (peek() == ',') {
        advance();
        continue;
      }
      expect('}', path);
      return;
    }
  }

  void array(const std::string& path) {
    advance();
    skip_space();
    if (peek() == ']') {
      advance();
      return;
    }
    for (int index = 0;; ++index) {
      value(path + "[" + std::to_string(index) + "]");
      skip_space();
      if (peek() == ',') {
        advance();
        continue;
      }
      expect(']', path);
      return;
    }
  }

  // The string's content with its escapes decoded (UTF-8), so that a key spelled with \u
  // escapes is the key protobuf's parser will see: the duplicate check compares those.
  std::string string(const std::string& path) {
    advance();
    std::string content;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\n') {
        fail("unterminated string", path);
      }
      if (text_[pos_] == '\\') {
        escape(content, path);
        continue;
      }
      content += text_[pos_];
      advance();
    }
    if (pos_ >= text_.size()) {
      fail("unterminated string", path);
    }
    advance();
    return content;
  }

  // One escape sequence, at its backslash, appended to `content`.
  void escape(std::string& content, const std::string& path) {
    advance();
    if (pos_ >= text_.size()) {
      fail("unterminated string", path);
    }
    const char kind = text_[pos_];
    advance();
    switch (kind) {
      case '"': content += '"'; return;
      case '\\': content += '\\'; return;
      case '/': content += '/'; return;
      case 'b': content += '\b'; return;
      case 'f': content += '\f'; return;
      case 'n': content += '\n'; return;
      case 'r': content += '\r'; return;
      case 't': content += '\t'; return;
      case 'u': break;
      default: fail(std::string("invalid escape '\\") + kind + "' in a string", path);
    }
    std::uint32_t code = hex4(path);
    if (code >= 0xD800 && code <= 0xDBFF) {  // a high surrogate: its low half must follow
      if (pos_ + 1 >= text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
        fail("a \\u escape of a high surrogate without its low surrogate", path);
      }
      advance();
      advance();
      const std::uint32_t low = hex4(path);
      if (low < 0xDC00 || low > 0xDFFF) {
        fail("a \\u escape of a high surrogate without its low surrogate", path);
      }
      code = 0x10000 + ((code - 0xD800) << 10U) + (low - 0xDC00);
    } else if (code >= 0xDC00 && code <= 0xDFFF) {
      fail("a \\u escape of a low surrogate without its high surrogate", path);
    }
    content += utf8_of(static_cast<char32_t>(code));
  }

  std::uint32_t hex4(const std::string& path) {
    std::uint32_t code = 0;
    for (int digit = 0; digit < 4; ++digit) {
      const char c = pos_ < text_.size() ? text_[pos_] : '"';
      if (std::isxdigit(static_cast<unsigned char>(c)) == 0) {
        fail("a \\u escape needs four hexadecimal digits", path);
      }
      code = code * 16 + static_cast<std::uint32_t>(
                             std::isdigit(static_cast<unsigned char>(c)) != 0
                                 ? c - '0'
                                 : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
      advance();
    }
    return code;
  }

  void scalar(const std::string& path) {
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) != 0 || text_[pos_] == '.' ||
            text_[pos_] == '-' || text_[pos_] == '+')) {
      advance();
    }
    if (pos_ == start) {
      fail(std::string("unexpected character '") + peek() + "', expected a value", path);
    }
  }

  std::string_view text_;
  const std::string& file_;
  LocationMap& locations_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
};

// Protobuf reports "(a.b[1].c): message" or "(a.b) c: message"; returns the path and the rest.
std::pair<std::string, std::string> split_protobuf_error(std::string message) {
  const std::string prefix = "INVALID_ARGUMENT:";
  if (message.rfind(prefix, 0) == 0) {
    message.erase(0, prefix.size());
  }
  if (message.empty() || message.front() != '(') {
    // A top-level field: "name: message".
    const size_t colon = message.find(": ");
    if (colon != std::string::npos && message.find_first_of(" (", 0) >= colon) {
      return {message.substr(0, colon), message.substr(colon + 2)};
    }
    return {"", message};
  }
  const size_t close = message.find(')');
  if (close == std::string::npos) {
    return {"", message};
  }
  std::string path = message.substr(1, close - 1);
  std::string rest = message.substr(close + 1);
  if (!rest.empty() && rest.front() == ':') {
    rest.erase(0, 1);
  } else if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    const std::string field = rest.substr(0, colon);
    const size_t first = field.find_first_not_of(' ');
    path = join_path(path, first == std::string::npos ? field : field.substr(first));
    rest = rest.substr(colon + 1);
  }
  const size_t first = rest.find_first_not_of(' ');
  return {path, first == std::string::npos ? rest : rest.substr(first)};
}

// Drops leading '#' comment lines: protobuf's JSON parser does not accept them.
std::string strip_comment_lines(std::string_view text) {
  std::string kept;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    const std::string_view line = text.substr(start, end - start);
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string_view::npos && line[first] == '#') {
      kept.append(line.size(), ' ');  // keep columns and lines where they were
    } else {
      kept.append(line);
    }
    if (end < text.size()) {
      kept += '\n';
    }
    start = end + 1;
  }
  return kept;
}

// Protobuf reports a JSON syntax error as its message, a line break, a snippet of the parsed
// text around the error (line breaks included), another break and a caret under the error's
// offset in the snippet. The diagnostic keeps the message and, where the snippet occurs once in
// `parsed`, names the line and column the caret points at (else the file alone).
std::pair<std::string, std::string> syntax_error(const std::string& what, std::string_view parsed,
                                                 const std::string& file_name) {
  const std::size_t first_break = what.find('\n');
  const std::size_t last_break = what.rfind('\n');
  std::string where = file_name;
  if (first_break != last_break) {
    const std::string snippet = what.substr(first_break + 1, last_break - first_break - 1);
    const std::size_t caret = what.find('^', last_break);
    const std::size_t at = snippet.empty() ? std::string_view::npos : parsed.find(snippet);
    if (caret != std::string::npos && caret - last_break - 1 <= snippet.size() &&
        at != std::string_view::npos && parsed.find(snippet, at + 1) == std::string_view::npos) {
      const std::size_t offset = at + (caret - last_break - 1);
      const auto before = parsed.substr(0, offset);
      const std::size_t line =
          1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
      const std::size_t line_start = before.rfind('\n');
      const std::size_t column =
          line_start == std::string_view::npos ? offset + 1 : offset - line_start;
      where += ":" + std::to_string(line) + ":" + std::to_string(column);
    }
  }
  return {what.substr(0, first_break), where};
}

}  // namespace

namespace detail {

void parse_json(std::string_view text, const std::string& file_name, pb::Message& message,
                LocationMap& locations) {
  LocationMap scanned(locations.default_file());
  JsonScanner(text, file_name, scanned).scan();
  message.Clear();
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const std::string parsed = strip_comment_lines(text);
  const auto status = pb::util::JsonStringToMessage(parsed, &message, options);
  if (!status.ok()) {
    auto [path, what] = split_protobuf_error(std::string(status.message()));
    if (what.find('\n') != std::string::npos) {
      auto [first_line, where] = syntax_error(what, parsed, file_name);
      throw ConfigError(first_line, where);
    }
    if (what == "Cannot find field.") {
      what = "unknown field '" + path.substr(path.find_last_of('.') + 1) + "'";
    }
    std::string where = describe(scanned.nearest(path));
    if (!path.empty()) {
      where += ", field " + path;
    }
    throw ConfigError(what, where);
  }
  for (const auto& [path, position] : scanned.entries()) {
    if (!path.empty()) {
      locations.set(path, position);
    }
  }
}

}  // namespace detail
}  // namespace kvtier::config
