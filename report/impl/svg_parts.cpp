#include "report/impl/svg_parts.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"

namespace kvtier::report::detail {
namespace {

// `text` broken after commas, colons and spaces into lines of at most `width` characters
// (a part longer than that stays whole, on a line of its own).
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> parts;
  std::string part;
  for (const char c : text) {
    if (c == ' ') {
      parts.push_back(part);
      part.clear();
      continue;
    }
    part += c;
    if (c == ',' || c == ':') {
      parts.push_back(part);
      part.clear();
    }
  }
  parts.push_back(part);
  std::vector<std::string> lines;
  for (const std::string& each : parts) {
    if (each.empty()) {
      continue;
    }
    if (!lines.empty() && lines.back().size() + each.size() <= width) {
      const char last = lines.back().back();
      lines.back() += (last == ',' || last == ':' ? "" : " ") + each;
    } else {
      lines.push_back(each);
    }
  }
  return lines;
}

}  // namespace

// A coordinate at a tenth of a unit, never "-0.0".
std::string coordinate(double value) {
  double rounded = std::round(value * 10.0) / 10.0;
  if (rounded == 0.0) {
    rounded = 0.0;
  }
  return format_fixed(rounded, 1);
}

bool finite(double value) {
  return std::isfinite(value);
}

// `text` cut to `length` bytes with an ellipsis, never inside a UTF-8 sequence.
std::string shortened(const std::string& text, std::size_t length) {
  if (text.size() <= length) {
    return text;
  }
  std::size_t cut = length - 1;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return text.substr(0, cut) + "\u2026";
}

// The SVG element's opening tag and title; `height` includes the legend.
std::string open_svg(const std::string& title, double height) {
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" +
                    coordinate(kChartWidth) + "\" height=\"" + coordinate(height) +
                    "\" viewBox=\"0 0 " + coordinate(kChartWidth) + " " + coordinate(height) +
                    "\" role=\"img\" aria-label=\"" + html_escape(title) + "\">\n";
  svg += "<text class=\"title\" x=\"" + coordinate(kPlotLeft) + "\" y=\"20\">" +
         html_escape(title) + "</text>\n";
  return svg;
}

// Labels along x at their positions: on one line when they fit beside each other, else broken
// into lines, else turned and shortened (the whole text in a <title>). Returns the band's
// height.
double x_labels(std::string& svg, const std::vector<std::pair<double, std::string>>& labels) {
  const double spacing =
      labels.size() < 2 ? kPlotWidth : kPlotWidth / static_cast<double>(labels.size());
  const auto fit = static_cast<std::size_t>(std::max(1.0, (spacing - 6.0) / kCharWidth));
  std::vector<std::vector<std::string>> wrapped;
  std::size_t most_lines = 1;
  bool fits = true;
  for (const auto& [position, text] : labels) {
    wrapped.push_back(text.size() <= fit ? std::vector<std::string>{text} : wrap(text, fit));
    most_lines = std::max(most_lines, wrapped.back().size());
    for (const std::string& line : wrapped.back()) {
      fits = fits && line.size() <= fit;
    }
  }
  constexpr std::size_t kMostLines = 4;
  if (fits && most_lines <= kMostLines) {
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const std::string x = coordinate(labels[i].first);
      svg += "<text class=\"tick\" x=\"" + x + "\" y=\"" + coordinate(kPlotBottom + 16.0) +
             "\" text-anchor=\"middle\">";
      for (std::size_t line = 0; line < wrapped[i].size(); ++line) {
        svg += "<tspan x=\"" + x + "\" dy=\"" + (line == 0 ? "0" : "14") + "\">" +
               html_escape(wrapped[i][line]) + "</tspan>";
      }
      svg += "</text>\n";
    }
    return 8.0 + 14.0 * static_cast<double>(most_lines);
  }
  std::size_t longest = 0;
  for (const auto& [position, text] : labels) {
    const std::string shown = shortened(text, kTurnedLabelChars);
    longest = std::max(longest, std::min(text.size(), kTurnedLabelChars));
    svg += "<text class=\"tick\" text-anchor=\"end\" transform=\"translate(" +
           coordinate(position + 4.0) + "," + coordinate(kPlotBottom + 12.0) +
           ") rotate(-35)\"><title>" + html_escape(text) + "</title>" + html_escape(shown) +
           "</text>\n";
  }
  return 18.0 + static_cast<double>(longest) * kCharWidth * 0.58;
}

double on_grid(double value) {
  return std::round(value * 10.0) / 10.0;
}

}  // namespace kvtier::report::detail
