#include "report/html_page.hpp"

#include "common/utf8.hpp"

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier::report {
namespace {

// Without '<' or '&', so the page stays well-formed XML.
constexpr std::string_view kStyle = R"(
body { font-family: sans-serif; margin: 24px auto; max-width: 1100px; color: #1a1a1a;
       line-height: 1.4; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
nav ul { columns: 2; padding-left: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; }
th { background: #f2f2f2; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 0.85em; }
details { margin: 0.8em 0; }
svg.chart { display: block; margin: 0.8em 0; max-width: 100%; height: auto; }
svg.chart text { font-family: sans-serif; font-size: 12px; fill: #1a1a1a; }
svg.chart text.title { font-size: 14px; font-weight: bold; }
svg.chart text.value, svg.chart text.note { font-size: 10px; fill: #444; }
svg.chart .grid { stroke: #e3e3e3; stroke-width: 1; }
svg.chart .frame { fill: none; stroke: #888; stroke-width: 1; }
svg.chart g.series polyline { fill: none; stroke-width: 1.75; }
svg.chart g.series circle { stroke: none; }
.scroll { overflow-x: auto; }
)";

}  // namespace

std::string html_escape(std::string_view text) {
  // XML 1.0 allows no other control characters, not even as references, nor invalid UTF-8.
  static const std::string kReplacement = utf8_of(U'\uFFFD');
  std::string escaped;
  escaped.reserve(text.size());
  for (const char c : valid_utf8(text)) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      case '\t':
      case '\n':
      case '\r': escaped += c; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == '\x7f') {
          escaped += kReplacement;
        } else {
          escaped += c;
        }
    }
  }
  return escaped;
}

HtmlPage::HtmlPage(std::string title) : title_(std::move(title)) {}

void HtmlPage::heading(int level, std::string_view text, std::string_view id) {
  if (level != 2 && level != 3) {
    throw std::invalid_argument("HtmlPage::heading: level 2 or 3");
  }
  const std::string tag = "h" + std::to_string(level);
  body_ += "<" + tag;
  if (!id.empty()) {
    body_ += " id=\"" + html_escape(id) + "\"";
    if (level == 2) {
      contents_.emplace_back(std::string(id), std::string(text));
    }
  }
  body_ += ">" + html_escape(text) + "</" + tag + ">\n";
}

void HtmlPage::paragraph(std::string_view text) {
  body_ += "<p>" + html_escape(text) + "</p>\n";
}

void HtmlPage::labelled(std::string_view label, std::string_view text) {
  body_ += "<p><b>" + html_escape(label) + "</b> " + html_escape(text) + "</p>\n";
}

void HtmlPage::list(const std::vector<std::string>& items) {
  if (items.empty()) {
    return;
  }
  body_ += "<ul>\n";
  for (const std::string& item : items) {
    body_ += "<li>" + html_escape(item) + "</li>\n";
  }
  body_ += "</ul>\n";
}

void HtmlPage::table(const std::vector<std::string>& header,
                     const std::vector<std::vector<std::string>>& rows,
                     const std::vector<bool>& right_aligned) {
  const auto numeric = [&right_aligned](std::size_t column) {
    return column < right_aligned.size() && right_aligned[column];
  };
  body_ += "<div class=\"scroll\"><table>\n<tr>";
  for (const std::string& cell : header) {
    body_ += "<th>" + html_escape(cell) + "</th>";
  }
  body_ += "</tr>\n";
  for (const std::vector<std::string>& row : rows) {
    body_ += "<tr>";
    for (std::size_t c = 0; c < row.size(); ++c) {
      body_ += std::string(numeric(c) ? "<td class=\"number\">" : "<td>") + html_escape(row[c]) +
               "</td>";
    }
    body_ += "</tr>\n";
  }
  body_ += "</table></div>\n";
}

void HtmlPage::add_raw(std::string_view trusted_markup) {
  body_ += trusted_markup;
}

void HtmlPage::details(std::string_view summary, std::string_view text) {
  body_ += "<details><summary>" + html_escape(summary) + "</summary><pre>" + html_escape(text) +
           "</pre></details>\n";
}

std::string HtmlPage::str() const {
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n";
  page += "<title>" + html_escape(title_) + "</title>\n<style>" + std::string(kStyle) +
          "</style>\n</head>\n<body>\n<h1>" + html_escape(title_) + "</h1>\n";
  if (!contents_.empty()) {
    page += "<nav><ul>\n";
    for (const auto& [id, text] : contents_) {
      page += "<li><a href=\"#" + html_escape(id) + "\">" + html_escape(text) + "</a></li>\n";
    }
    page += "</ul></nav>\n";
  }
  return page + body_ + "</body>\n</html>\n";
}

}  // namespace kvtier::report
