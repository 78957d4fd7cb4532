// Protobuf text format with positions. Protobuf's own parser does the parsing; on failure its
// message is extended with the field path, which it does not report, by re-scanning the text up
// to the error with the schema in hand.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "common/utf8.hpp"
#include "configs/parse.hpp"

namespace kvtier::config {
namespace {

namespace pb = google::protobuf;

struct FirstError {
  int line = -1;
  int column = -1;
  std::string message;
};

class CollectFirstError : public pb::io::ErrorCollector {
 public:
  explicit CollectFirstError(FirstError& first) : first_(first) {}
  void AddError(int line, int column, const std::string& message) override {
    if (first_.line < 0) {
      first_ = FirstError{line, column, message};
    }
  }
  void AddWarning(int /*line*/, int /*column*/, const std::string& /*message*/) override {}

 private:
  FirstError& first_;
};

// The field path at (line, column) (0-based), found by following field names and braces with
// the schema, so repeated fields get their index. Best effort: it only names the error's place.
std::string path_at(std::string_view text, int line, int column, const pb::Descriptor* root) {
  struct Frame {
    const pb::Descriptor* type;
    std::string path;
    std::map<std::string, int> seen;
  };
  std::vector<Frame> stack{{root, "", {}}};
  std::string pending_field;  // last field name seen in the current message
  std::string pending_path;
  const pb::FieldDescriptor* pending_descriptor = nullptr;
  int at_line = 0;
  int at_column = 0;
  for (size_t i = 0; i < text.size();) {
    if (at_line > line || (at_line == line && at_column >= column)) {
      break;
    }
    const char c = text[i];
    auto advance = [&](size_t count) {
      for (size_t k = 0; k < count && i < text.size(); ++k, ++i) {
        if (text[i] == '\n') {
          ++at_line;
          at_column = 0;
        } else {
          ++at_column;
        }
      }
    };
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') {
        advance(1);
      }
    } else if (c == '"' || c == '\'') {
      advance(1);
      while (i < text.size() && text[i] != c && text[i] != '\n') {
        advance(text[i] == '\\' ? 2 : 1);
      }
      advance(1);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = i;
      while (end < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
        ++end;
      }
      const std::string word(text.substr(i, end - i));
      Frame& frame = stack.back();
      size_t next = end;
      while (next < text.size() && (text[next] == ' ' || text[next] == '\t')) {
        ++next;
      }
      const bool names_field =
          next < text.size() && (text[next] == ':' || text[next] == '{' || text[next] == '<');
      if (frame.type != nullptr && names_field && frame.type->FindFieldByName(word) == nullptr) {
        pending_descriptor = nullptr;  // an unknown field: the error is about it
        pending_path = join_path(frame.path, word);
      } else if (frame.type != nullptr) {
        if (const auto* field = frame.type->FindFieldByName(word)) {
          pending_field = word;
          pending_descriptor = field;
          std::string name = word;
          if (field->is_repeated()) {
            name += "[" + std::to_string(frame.seen[word]++) + "]";
          }
          pending_path = join_path(frame.path, name);
        }
      }
      advance(end - i);
    } else if (c == '{' || c == '<') {
      const pb::Descriptor* type =
          pending_descriptor != nullptr &&
                  pending_descriptor->type() == pb::FieldDescriptor::TYPE_MESSAGE
              ? pending_descriptor->message_type()
              : nullptr;
      stack.push_back(Frame{type, pending_path, {}});
      pending_descriptor = nullptr;
      pending_path.clear();
      advance(1);
    } else if (c == '}' || c == '>') {
      if (stack.size() > 1) {
        pending_path = stack.back().path;
        stack.pop_back();
      }
      pending_descriptor = nullptr;
      advance(1);
    } else {
      advance(1);
    }
  }
  return pending_path.empty() ? stack.back().path : pending_path;
}

// Protobuf's parser records one position for a list written in brackets (`values: ["a", "b"]`),
// its field name's, where the entries written one by one get one each. This finds where each
// element of such a list starts, so that a diagnostic about values[2] points at that value.
class BracketedLists {
 public:
  explicit BracketedLists(std::string_view text) : text_(text) {}

  // The starts (0-based line and column, counted as protobuf counts them) of the elements of
  // the bracketed list whose field name is at `name`; just `name` when no list starts there.
  std::vector<pb::TextFormat::ParseLocation> elements(pb::TextFormat::ParseLocation name) {
    const std::vector<Token>& tokens = all_tokens();
    auto at = std::lower_bound(tokens.begin(), tokens.end(), name, [](const Token& token, auto l) {
      return token.line < l.line || (token.line == l.line && token.column < l.column);
    });
    if (at == tokens.end() || at->line != name.line || at->column != name.column) {
      return {name};
    }
    ++at;
    if (at != tokens.end() && at->symbol == ':') {
      ++at;
    }
    if (at == tokens.end() || at->symbol != '[') {
      return {name};
    }
    std::vector<pb::TextFormat::ParseLocation> starts;
    bool element_starts = true;
    int depth = 0;
    for (++at; at != tokens.end(); ++at) {
      if (depth == 0 && at->symbol == ']') {
        break;
      }
      if (element_starts) {
        starts.emplace_back(at->line, at->column);
        element_starts = false;
      }
      if (at->symbol == '{' || at->symbol == '<' || at->symbol == '[') {
        ++depth;
      } else if (at->symbol == '}' || at->symbol == '>' || at->symbol == ']') {
        --depth;
      } else if (depth == 0 && at->symbol == ',') {
        element_starts = true;
      }
    }
    return starts;
  }

 private:
  struct Token {
    int line = 0;
    int column = 0;
    char symbol = 0;  // a one-character symbol token, else 0
  };

  class IgnoreErrors : public pb::io::ErrorCollector {
    void AddError(int /*line*/, int /*column*/, const std::string& /*message*/) override {}
  };

  // The text is tokenized once, as protobuf's text parser does, and only when a list needs it.
  const std::vector<Token>& all_tokens() {
    if (tokens_) {
      return *tokens_;
    }
    tokens_.emplace();
    if (text_.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return *tokens_;
    }
    pb::io::ArrayInputStream input(text_.data(), static_cast<int>(text_.size()));
    IgnoreErrors ignore;
    pb::io::Tokenizer tokenizer(&input, &ignore);
    tokenizer.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
    tokenizer.set_allow_f_after_float(true);
    tokenizer.set_require_space_after_number(false);
    tokenizer.set_allow_multiline_strings(true);
    while (tokenizer.Next()) {
      const pb::io::Tokenizer::Token& token = tokenizer.current();
      const bool symbol = token.type == pb::io::Tokenizer::TYPE_SYMBOL && token.text.size() == 1;
      tokens_->push_back(Token{token.line, token.column, symbol ? token.text[0] : char{0}});
    }
    return *tokens_;
  }

  std::string_view text_;
  std::optional<std::vector<Token>> tokens_;
};

// Records the position of every field present in `message`, using the parser's info tree.
void record_positions(const pb::Message& message, const pb::TextFormat::ParseInfoTree& tree,
                      const std::string& prefix, const std::string& file, BracketedLists& lists,
                      LocationMap& locations) {
  std::vector<const pb::FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  const pb::Reflection* reflection = message.GetReflection();
  for (const pb::FieldDescriptor* field : fields) {
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    // A repeated field's recorded positions, one per entry or bracketed list, in order.
    std::vector<pb::TextFormat::ParseLocation> starts;
    if (field->is_repeated()) {
      for (int recorded = 0; static_cast<int>(starts.size()) < count; ++recorded) {
        const auto location = tree.GetLocation(field, recorded);
        if (location.line < 0) {
          break;
        }
        for (const auto& start : lists.elements(location)) {
          starts.push_back(start);
        }
      }
    } else {
      starts.push_back(tree.GetLocation(field, -1));
    }
    for (int index = 0; index < count; ++index) {
      const int tree_index = field->is_repeated() ? index : -1;
      std::string path = join_path(prefix, field->name());
      if (field->is_repeated()) {
        path += "[" + std::to_string(index) + "]";
      }
      if (index < static_cast<int>(starts.size()) && starts[index].line >= 0) {
        locations.set(path, SourcePosition{file, starts[index].line + 1, starts[index].column + 1});
      }
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        const pb::TextFormat::ParseInfoTree* nested = tree.GetTreeForNested(field, tree_index);
        if (nested != nullptr) {
          const pb::Message& child = field->is_repeated()
                                         ? reflection->GetRepeatedMessage(message, field, index)
                                         : reflection->GetMessage(message, field);
          record_positions(child, *nested, path, file, lists, locations);
        }
      }
    }
  }
}

// Protobuf says 'Message type "kvtier.config.ModelSpec" has no field named "foo".'; say
// which fields there are instead.
std::string explain(const std::string& message, const pb::Descriptor* root) {
  if (message.empty()) {
    return "not a valid text-format config";
  }
  const std::string twice = "is specified multiple times";
  if (message.find(twice) != std::string::npos && message.find('"') != std::string::npos) {
    const size_t open = message.find('"');
    const std::string field = message.substr(open + 1, message.find('"', open + 1) - open - 1);
    return "field '" + field +
           "' is given more than once (write it once; lists use repeated entries)";
  }
  const std::string marker = "has no field named \"";
  const size_t found = message.find(marker);
  const size_t type_start = message.find('"');
  if (found == std::string::npos || type_start == std::string::npos) {
    return message;
  }
  const size_t type_end = message.find('"', type_start + 1);
  const std::string type_name = message.substr(type_start + 1, type_end - type_start - 1);
  const size_t name_start = found + marker.size();
  const std::string field = message.substr(name_start, message.find('"', name_start) - name_start);
  const pb::Descriptor* type = root->file()->pool()->FindMessageTypeByName(type_name);
  std::string explained = "unknown field '" + field + "'";
  if (type != nullptr) {
    explained += " in " + type->name() + " (fields:";
    for (int i = 0; i < type->field_count(); ++i) {
      explained += " " + type->field(i)->name();
    }
    explained += ")";
  }
  return explained;
}

}  // namespace

namespace detail {

void parse_text_format(std::string_view text, const std::string& file_name, pb::Message& message,
                       LocationMap& locations) {
  FirstError first;
  CollectFirstError collector(first);
  pb::TextFormat::ParseInfoTree tree;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&collector);
  parser.WriteLocationsTo(&tree);
  message.Clear();
  if (!parser.ParseFromString(std::string(text), &message)) {
    const std::string path = first.line >= 0
                                 ? path_at(text, first.line, first.column, message.GetDescriptor())
                                 : std::string();
    int column = first.column;
    // Protobuf points just past an unknown field's name; point at the name itself.
    if (const size_t dot = path.find_last_of('.');
        !path.empty() && first.message.find("has no field named") != std::string::npos) {
      const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
      size_t line_start = 0;
      for (int line = 0; line < first.line && line_start != std::string_view::npos; ++line) {
        line_start = text.find('\n', line_start);
        line_start = line_start == std::string_view::npos ? line_start : line_start + 1;
      }
      if (line_start != std::string_view::npos) {
        const std::string_view line_text =
            text.substr(line_start, static_cast<size_t>(first.column));
        if (const size_t at = line_text.rfind(name); at != std::string_view::npos) {
          column = static_cast<int>(at);
        }
      }
    }
    std::string where = describe(SourcePosition{file_name, first.line + 1, column + 1});
    if (!path.empty()) {
      where += ", field " + path;
    }
    throw ConfigError(explain(first.message, message.GetDescriptor()), where);
  }
  BracketedLists lists(text);
  record_positions(message, tree, "", file_name, lists, locations);
}

}  // namespace detail

bool looks_like_json(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') {
        ++i;
      }
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else {
      return c == '{';
    }
  }
  return false;
}

std::optional<NonTextByte> find_non_text_byte(std::string_view text, const std::string& file_name) {
  std::size_t line_start = 0;
  int line = 1;
  char quote = 0;        // the open string's quote, or 0
  bool escaped = false;  // the string's previous character was a backslash
  bool comment = false;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    std::size_t length = 1;
    if (c == '\0' || !comment) {
      length = c == '\0' ? 0 : kvtier::detail::utf8_sequence_length(text.substr(i));
    }
    if (length == 0) {
      return NonTextByte{
          i, file_name + ":" + std::to_string(line) + ":" + std::to_string(i - line_start + 1)};
    }
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      comment = false;
      quote = 0;  // strings do not span lines
      escaped = false;
    } else if (quote != 0) {
      if (escaped) {
        escaped = false;  // an escaped character, whole, ends no string
      } else if (c == '\\') {
        escaped = true;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (!comment) {
      comment = c == '#';
      quote = c == '"' || c == '\'' ? c : 0;
    }
    i += length;
  }
  return std::nullopt;
}

void parse_config(std::string_view text, const std::string& file_name, pb::Message& message,
                  LocationMap& locations) {
  // A UTF-8 byte order mark, as some editors write, is not part of the config (positions on the
  // first line then count from after it).
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  if (text.substr(0, kByteOrderMark.size()) == kByteOrderMark) {
    text.remove_prefix(kByteOrderMark.size());
  }
  // Refused before a parser reports the first odd byte as a character.
  if (const std::optional<NonTextByte> odd = find_non_text_byte(text, file_name)) {
    throw ConfigError(
        "not a text or JSON config: byte " + std::to_string(odd->offset) + " is not UTF-8 text",
        odd->place);
  }
  if (looks_like_json(text)) {
    detail::parse_json(text, file_name, message, locations);
  } else {
    detail::parse_text_format(text, file_name, message, locations);
  }
}

std::string read_config_file(const std::string& path) {
  InputText input = read_input_file(path, kTextInputLimitBytes);
  switch (input.status) {
    case InputText::Status::kRead: break;
    case InputText::Status::kFolder: throw ConfigError("a folder, not a config file", path);
    case InputText::Status::kCannotOpen: throw ConfigError("cannot open config file", path);
    case InputText::Status::kTooLarge:
      throw ConfigError(
          "larger than " + input_limit_text(kTextInputLimitBytes) + ": not a config file", path);
    case InputText::Status::kReadError: throw ConfigError("cannot read config file", path);
  }
  return std::move(input.text);
}

}  // namespace kvtier::config
