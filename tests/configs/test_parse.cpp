// Parsing text format and JSON: values, positions, and errors that name file, line:column and
// field path.

#include <catch2/catch.hpp>

#include "common/errors.hpp"
#include "configs/parse.hpp"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"

using kvtier::ConfigError;
using kvtier::config::LocationMap;
using kvtier::config::parse_config;

namespace {

std::string parse_error(const std::string& text, const std::string& file) {
  kvtier::config::RunSpec run;
  LocationMap locations(file);
  try {
    parse_config(text, file, run, locations);
  } catch (const ConfigError& error) {
    return std::string(error.what()) + " @ " + error.where();
  }
  return "no error";
}

}  // namespace

TEST_CASE("text format records the line and column of nested values", "[parse]") {
  kvtier::config::RunSpec run;
  LocationMap locations("run.textproto");
  parse_config("seed: 3\nmodel {\n  hidden_size: 64\n}\n", "run.textproto", run, locations);
  CHECK(run.seed() == 3);
  CHECK(run.model().hidden_size() == 64);
  const auto position = locations.nearest("model.hidden_size");
  CHECK(position.file == "run.textproto");
  CHECK(position.line == 3);
  CHECK(position.column == 3);
  // A path with no value of its own falls back to its closest ancestor.
  CHECK(locations.nearest("model.vocab_size").line == 2);
}

TEST_CASE("each element of a bracketed list has its own position", "[parse]") {
  kvtier::config::SweepSpec sweep;
  LocationMap locations("sweep.textproto");
  parse_config(
      "name: \"s\"\n"
      "axis {\n"
      "  path: \"seed\"\n"
      "  values: [\"1\",\n"
      "           \"22\", \"333\"]  # a comma, ] or [ in a comment is no separator\n"
      "  values: \"4\"\n"
      "  values: []\n"
      "  values: [\"5\"]\n"
      "}\n"
      "axis [{ path: \"a\" values: \"x,y\" }, { path: \"b\" values: [ \"x\", \"]\"] }]\n",
      "sweep.textproto", sweep, locations);
  REQUIRE(sweep.axis_size() == 3);
  REQUIRE(sweep.axis(0).values_size() == 5);
  auto at = [&](const std::string& path) {
    const auto position = locations.nearest(path);
    return std::to_string(position.line) + ":" + std::to_string(position.column);
  };
  CHECK(at("axis[0].values[0]") == "4:12");
  CHECK(at("axis[0].values[1]") == "5:12");
  CHECK(at("axis[0].values[2]") == "5:18");
  CHECK(at("axis[0].values[3]") == "6:3");  // written on its own: its field name
  CHECK(at("axis[0].values[4]") == "8:12");
  CHECK(at("axis[1]") == "10:7");
  CHECK(at("axis[1].values[0]") == "10:19");
  CHECK(at("axis[2]") == "10:36");
  CHECK(at("axis[2].path") == "10:38");
  CHECK(at("axis[2].values[0]") == "10:58");
  CHECK(at("axis[2].values[1]") == "10:63");
}

TEST_CASE("text format errors name the file, line:column and field path", "[parse]") {
  const std::string unknown =
      parse_error("model {\n  hidden_size: 64\n  foo: 1\n}\n", "a.textproto");
  CHECK_THAT(unknown, Catch::Contains("unknown field 'foo' in ModelSpec"));
  CHECK_THAT(unknown, Catch::Contains("a.textproto:3:"));
  CHECK_THAT(unknown, Catch::Contains("field model.foo"));

  const std::string wrong_type =
      parse_error("model {\n  hidden_size: \"wide\"\n}\n", "b.textproto");
  CHECK_THAT(wrong_type, Catch::Contains("Expected integer"));
  CHECK_THAT(wrong_type, Catch::Contains("b.textproto:2:"));
  CHECK_THAT(wrong_type, Catch::Contains("field model.hidden_size"));

  const std::string repeated_index = parse_error(
      "hardware { node { gpu {\n compute { dtype: BF16 }\n compute { dense_tflops: x }\n}}}\n",
      "c.textproto");
  CHECK_THAT(repeated_index, Catch::Contains("hardware.node.gpu.compute[1].dense_tflops"));

  const std::string bad_enum = parse_error("model { kv_dtype: BF17 }\n", "d.textproto");
  CHECK_THAT(bad_enum, Catch::Contains("BF17"));
  CHECK_THAT(bad_enum, Catch::Contains("d.textproto:1:"));

  const std::string twice = parse_error("seed: 1\nseed: 2\n", "e.textproto");
  CHECK_THAT(twice, Catch::Contains("e.textproto:2:"));
}

TEST_CASE("JSON configs parse, with lowerCamelCase or field names", "[parse]") {
  kvtier::config::RunSpec run;
  LocationMap locations("run.json");
  parse_config(
      "# a comment line\n{\"seed\": 5,\n \"model\": {\"hiddenSize\": 64, \"kv_dtype\": "
      "\"FP8_E4M3\"}}",
      "run.json", run, locations);
  CHECK(run.seed() == 5);
  CHECK(run.model().hidden_size() == 64);
  CHECK(run.model().kv_dtype() == kvtier::config::FP8_E4M3);
  CHECK(locations.nearest("model.hidden_size").line == 3);
}

TEST_CASE("JSON errors name the file, line:column and field path", "[parse]") {
  const std::string unknown = parse_error("{\n \"model\": {\n  \"bar\": 1}}", "a.json");
  CHECK_THAT(unknown, Catch::Contains("unknown field 'bar'") && Catch::Contains("a.json:3:3") &&
                          Catch::Contains("field model.bar"));
  const std::string wrong = parse_error("{\"model\": {\n\"hidden_size\": \"x\"}}", "b.json");
  CHECK_THAT(wrong, Catch::Contains("b.json:2:1") && Catch::Contains("field model.hidden_size"));
  const std::string syntax = parse_error("{\"model\": {\"hidden_size\": 3\n \"x\": 1}}", "c.json");
  CHECK_THAT(syntax, Catch::Contains("expected '}'") && Catch::Contains("c.json:2:2"));
  CHECK_THAT(parse_error("{\"seed\": 1", "d.json"), Catch::Contains("d.json:1:"));
  CHECK_THAT(parse_error("{\"name\": \"abc\n\"}", "e.json"),
             Catch::Contains("unterminated string"));
  // Protobuf's parser would merge these, the last value winning.
  const std::string twice = parse_error(
      "{\"memory\": {\"runtime_reserve_gib\": 2},\n \"memory\": {\"runtime_reserve_gib\": 30}}",
      "f.json");
  CHECK_THAT(twice, Catch::Contains("field 'memory' is given more than once") &&
                        Catch::Contains("f.json:2:2") && Catch::Contains("field memory"));
  CHECK_THAT(parse_error("{\"model\": {\"hiddenSize\": 64, \"hidden_size\": 32}}", "g.json"),
             Catch::Contains("field 'hidden_size' is given more than once") &&
                 Catch::Contains("field model.hidden_size"));
}

TEST_CASE("JSON keys compare with their escapes decoded, as protobuf's parser reads them",
          "[parse]") {
  // "\u0073eed" is "seed": protobuf would merge the two, the last value winning.
  CHECK_THAT(
      parse_error("{\"seed\": 1,\n \"\\u0073eed\": 2}", "h.json"),
      Catch::Contains("field 'seed' is given more than once") && Catch::Contains("h.json:2:2"));
  CHECK_THAT(parse_error("{\"model\": {\"hidden\\u005fsize\": 64, \"hiddenSize\": 32}}", "i.json"),
             Catch::Contains("field 'hidden_size' is given more than once"));
  // An escaped key alone is the field it spells.
  kvtier::config::RunSpec run;
  LocationMap locations("j.json");
  parse_config("{\"s\\u0065ed\": 7}", "j.json", run, locations);
  CHECK(run.seed() == 7);
  // Malformed escapes are refused where they are.
  CHECK_THAT(parse_error("{\"seed\\x\": 1}", "k.json"),
             Catch::Contains("invalid escape '\\x'") && Catch::Contains("k.json:1:"));
  CHECK_THAT(parse_error("{\"se\\u00g5ed\": 1}", "l.json"),
             Catch::Contains("four hexadecimal digits"));
  CHECK_THAT(parse_error("{\"name\": \"\\ud800x\"}", "m.json"),
             Catch::Contains("without its low surrogate"));
  CHECK_THAT(parse_error("{\"name\": \"\\udc00\"}", "n.json"),
             Catch::Contains("without its high surrogate"));
}

TEST_CASE("a file that starts with '{' is JSON, anything else text format", "[parse]") {
  CHECK(kvtier::config::looks_like_json("  # note\n {\"a\": 1}"));
  CHECK_FALSE(kvtier::config::looks_like_json("seed: 1"));
  CHECK_FALSE(kvtier::config::looks_like_json(""));
}

TEST_CASE("an unreadable file is a config error naming it", "[parse]") {
  try {
    (void)kvtier::config::read_config_file("/nonexistent/kvtier.textproto");
    FAIL("expected an error");
  } catch (const ConfigError& error) {
    CHECK(error.where() == "/nonexistent/kvtier.textproto");
    CHECK(error.exit_code() == kvtier::ExitCode::kUsageOrConfig);
  }
}
