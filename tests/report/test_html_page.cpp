#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "report/html_page.hpp"
#include "report/svg_chart.hpp"
#include "tests/support/xml_reader.hpp"

namespace kvtier::report {
namespace {

using testing::attribute;
using testing::elements;
using testing::parse_xml;
using testing::text_of;

TEST_CASE("html_escape replaces the five characters markup gives meaning to", "[report]") {
  CHECK(html_escape("a<b>&\"c\"'d'") == "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;");
  CHECK(html_escape("µs × 2") == "µs × 2");
  // Control characters and bytes of no UTF-8 sequence, which XML allows in no form, become
  // U+FFFD; tab and line ends stay.
  CHECK(html_escape("a\x01"
                    "b\x1b[31m\tc\n") ==
        "a\uFFFD"
        "b\uFFFD[31m\tc\n");
  CHECK(html_escape("x\xffy") == "x\uFFFDy");
  HtmlPage page("run \x01 with a bell \x07");
  CHECK_NOTHROW(parse_xml(page.str()));
}

TEST_CASE("a page is well-formed, escapes its text and lists its sections", "[report]") {
  HtmlPage page("kvtier sim: <quickstart> & more");
  page.labelled("Workload:", "32 requests, 2k < 4k");
  page.heading(2, "Policies", "policies");
  page.list({"tiered:hbm=0.5 & evict=0.1", "full"});
  page.heading(3, "Details");
  page.table({"metric", "full"}, {{"ttft_p99_ms", "12.5"}, {"<odd>", "1"}}, {false, true});
  LineChart chart;
  chart.title = "a chart";
  chart.series.push_back({"s", {0, 1}, {0, 1}});
  page.add_raw(line_chart_svg(chart));
  page.heading(2, "Config", "config");
  page.details("The resolved run", "name: \"a & b\"\nseed: 1\n");
  const std::string text = page.str();
  const auto html = parse_xml(text);

  CHECK(text.rfind("<!DOCTYPE html>\n", 0) == 0);
  CHECK(text_of(html.get_child("html.head.title")) == "kvtier sim: <quickstart> & more");
  CHECK(text_of(html.get_child("html.body.h1")) == "kvtier sim: <quickstart> & more");
  // The contents list names the level-2 headings in order and points at them.
  const auto links = elements(html, "a");
  REQUIRE(links.size() == 2);
  CHECK(attribute(*links[0], "href") == "#policies");
  CHECK(text_of(*links[1]) == "Config");
  CHECK(elements(html, "li").size() == 4);  // two contents entries, two list items
  const auto cells = elements(html, "td");
  REQUIRE(cells.size() == 4);
  CHECK(text_of(*cells[2]) == "<odd>");
  CHECK(attribute(*cells[1], "class") == "number");
  CHECK(attribute(*cells[0], "class").empty());
  CHECK(elements(html, "svg").size() == 1);
  REQUIRE(elements(html, "pre").size() == 1);
  CHECK(text_of(*elements(html, "pre")[0]) == "name: \"a & b\"\nseed: 1\n");
  CHECK(text == page.str());
}

TEST_CASE("only section headings of level 2 or 3 exist", "[report]") {
  HtmlPage page("t");
  CHECK_THROWS_AS(page.heading(1, "x"), std::invalid_argument);
  CHECK_THROWS_AS(page.heading(4, "x"), std::invalid_argument);
}

}  // namespace
}  // namespace kvtier::report
