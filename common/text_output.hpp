#pragma once
// Output for people (aligned tables) and for machines (JSON), with number formatting that is
// the same on every run and platform.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// Shortest text that reads back as the same double ("0.1", "989", "1.5e-06").
inline std::string format_double(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// A JSON number, or null where JSON has none (infinities, NaN): a figure that could not be
// measured.
inline std::string json_number_or_null(double value) {
  return std::isfinite(value) ? format_double(value) : "null";
}

// Fixed decimals for tables ("79.56").
inline std::string format_fixed(double value, int decimals) {
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed, decimals);
  return std::string(buffer, result.ptr);
}

inline std::string json_escape(std::string_view text) {
  std::string escaped = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': escaped += "\\\""; break;
      case '\\': escaped += "\\\\"; break;
      case '\n': escaped += "\\n"; break;
      case '\t': escaped += "\\t"; break;
      case '\r': escaped += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          const auto result =
              std::to_chars(buffer, buffer + sizeof(buffer),
                            static_cast<unsigned>(static_cast<unsigned char>(c)), 16);
          escaped += "\\u00";
          if (result.ptr - buffer == 1) {
            escaped += '0';
          }
          escaped.append(buffer, result.ptr);
        } else {
          escaped += c;
        }
    }
  }
  escaped += '"';
  return escaped;
}

// Columns padded to their widest cell; columns listed in `right_aligned` hold numbers.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header, std::vector<bool> right_aligned = {})
      : header_(std::move(header)), right_(std::move(right_aligned)) {
    right_.resize(header_.size(), false);
  }

  void add_row(std::vector<std::string> cells) {
    cells.resize(header_.size());
    rows_.push_back(std::move(cells));
  }

  void render(std::ostream& out) const {
    std::vector<size_t> widths(header_.size(), 0);
    auto measure = [&](const std::vector<std::string>& row) {
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], display_width(row[i]));
      }
    };
    measure(header_);
    for (const auto& row : rows_) {
      measure(row);
    }
    auto print = [&](const std::vector<std::string>& row) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        const size_t pad = widths[i] - display_width(row[i]);
        const bool last = i + 1 == row.size();
        if (right_[i]) {
          line.append(pad, ' ');
          line += row[i];
        } else {
          line += row[i];
          if (!last) {
            line.append(pad, ' ');
          }
        }
        if (!last) {
          line += "  ";
        }
      }
      while (!line.empty() && line.back() == ' ') {
        line.pop_back();
      }
      out << line << '\n';
    };
    print(header_);
    for (const auto& row : rows_) {
      print(row);
    }
  }

 private:
  // UTF-8 aware enough for the µ and × the tables print.
  static size_t display_width(const std::string& text) {
    size_t width = 0;
    for (const char c : text) {
      if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
        ++width;
      }
    }
    return width;
  }

  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace kvtier
