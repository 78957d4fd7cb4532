#pragma once
// A self-contained HTML page for people: headings, paragraphs, lists, tables, charts (inline
// SVG from report/svg_chart.hpp) and folded blocks of preformatted text, with its style sheet
// inline. The page is also well-formed XML (every element closed, only XML's five entities),
// so tests and tools can read it with an XML parser. Text is escaped here; SVG and HTML given
// to add_raw are trusted as they are.

#include <string>
#include <string_view>
#include <vector>

namespace kvtier::report {

// & < > " and ' as entities; control characters other than tab and line ends, and bytes of no
// valid UTF-8 sequence, as U+FFFD (XML 1.0 allows them in no form).
[[nodiscard]] std::string html_escape(std::string_view text);

class HtmlPage {
 public:
  // `title` heads the page and names its tab.
  explicit HtmlPage(std::string title);

  // A section heading (level 2 or 3); `id` makes it a target of the contents list (level 2).
  void heading(int level, std::string_view text, std::string_view id = {});
  void paragraph(std::string_view text);
  // A paragraph with a leading bold phrase ("Workload: 32 requests ...").
  void labelled(std::string_view label, std::string_view text);
  void list(const std::vector<std::string>& items);
  // `right_aligned[i]` marks a column of numbers; missing entries are left aligned.
  void table(const std::vector<std::string>& header,
             const std::vector<std::vector<std::string>>& rows,
             const std::vector<bool>& right_aligned = {});
  // A figure: inline SVG from svg_chart.hpp.
  void add_raw(std::string_view trusted_markup);
  // A folded block of preformatted text ("Resolved config").
  void details(std::string_view summary, std::string_view text);

  // The whole page; level-2 headings with ids listed as contents under the title.
  [[nodiscard]] std::string str() const;

 private:
  std::string title_;
  std::vector<std::pair<std::string, std::string>> contents_;  // id, heading
  std::string body_;
};

}  // namespace kvtier::report
