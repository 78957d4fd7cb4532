// `kvtier trace ...` driven as a user would: outputs, one-line diagnostics, exit codes, and no
// partial output files after a failure.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/support/cli_runner.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::expect_one_line_error;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args, const std::string& environment = "") {
  return kvtier::test::run_kvtier(args, environment);
}

std::string path_of(const std::string& name) {
  return (scratch_dir() / name).string();
}

// A failure: the exit code, nothing on stdout, one line on stderr naming `place`.
// A small trace of every granularity; the output file follows.
std::string synth_command() {
  return "trace synth --model stories260K --prompt-tokens 64 --steps 200 --pattern reasoning "
         "--seed 3 --heads --top-k 8 --prefill-window 4 --key-norms --out ";
}

}  // namespace

TEST_CASE("kvtier trace help", "[cli][trace]") {
  for (const char* command : {"trace --help", "trace info --help", "trace validate --help",
                              "trace synth --help", "trace convert --help"}) {
    INFO(command);
    const Result help = run(command);
    CHECK(help.exit_code == 0);
    CHECK_THAT(help.out, Catch::Contains("usage: kvtier trace"));
  }
  CHECK_THAT(run("--help").out, Catch::Contains("trace"));
  expect_one_line_error(run("trace"), 2, "subcommand");
  expect_one_line_error(run("trace frobnicate"), 2, "frobnicate");
}

TEST_CASE("synth, info, validate", "[cli][trace]") {
  const std::string file = path_of("synth.h5");
  const Result made = run(synth_command() + "'" + file + "'");
  REQUIRE(made.exit_code == 0);
  CHECK(made.out == "wrote " + file + "\n");
  const Result info = run("trace info '" + file + "'");
  CHECK(info.exit_code == 0);
  CHECK_THAT(info.out, Catch::Contains("stories260K") && Catch::Contains("decode steps") &&
                           Catch::Contains("mean, heads, topk (k=8), prefill_window (w=4), "
                                           "key_norms") &&
                           Catch::Contains("compression") && Catch::Contains("reach p90") &&
                           Catch::Contains("pattern reasoning, seed 3"));
  const Result json = run("trace info --format json '" + file + "'");
  CHECK(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::StartsWith("{\"file\": ") && Catch::Contains("\"sink_mass\": ") &&
                           Catch::Contains("\"compression_ratio\": ") &&
                           Catch::Contains("\"pattern\":\"reasoning\""));
  const Result valid = run("trace validate '" + file + "'");
  CHECK(valid.exit_code == 0);
  CHECK_THAT(valid.out, Catch::Contains("valid"));
}

TEST_CASE("trace info --format html charts the layers and maps chosen layers' attention",
          "[cli][trace]") {
  const std::string file = path_of("html.h5");
  REQUIRE(run(synth_command() + "'" + file + "'").exit_code == 0);
  const auto map_titles = [](const std::string& html) {
    std::vector<std::string> titles;
    const kvtier::testing::XmlTree page = kvtier::testing::parse_xml(html);
    for (const auto* svg : kvtier::testing::elements(page, "svg")) {
      const std::string title = kvtier::testing::attribute(*svg, "aria-label");
      if (title.rfind("Layer ", 0) == 0) {
        titles.push_back(title.substr(0, title.find(' ', 6)));
      }
    }
    return titles;
  };
  // stories260K's five layers: the first, the middle and the last by default.
  const Result html = run("trace info --format html '" + file + "'");
  REQUIRE(html.exit_code == 0);
  CHECK(map_titles(html.out) == std::vector<std::string>{"Layer 0", "Layer 2", "Layer 4"});
  CHECK_THAT(html.out, Catch::Contains("reach p90") && Catch::Contains("stories260K"));
  const Result chosen = run("trace info --format html --map-layers 3,1,3 '" + file + "'");
  REQUIRE(chosen.exit_code == 0);
  CHECK(map_titles(chosen.out) == std::vector<std::string>{"Layer 3", "Layer 1"});
  expect_one_line_error(run("trace info --map-layers 1 '" + file + "'"), 2, "--format html");
  expect_one_line_error(run("trace info --format html --map-layers 1,x '" + file + "'"), 2,
                        "--map-layers takes layer numbers");
  expect_one_line_error(run("trace info --format html --map-layers 9 '" + file + "'"), 3,
                        "layer 9 is not in the trace");
}

TEST_CASE("synth is deterministic", "[cli][trace]") {
  const std::string a = path_of("same_a.h5");
  const std::string b = path_of("same_b.h5");
  REQUIRE(run(synth_command() + "'" + a + "'", "SOURCE_DATE_EPOCH=86400").exit_code == 0);
  REQUIRE(run(synth_command() + "'" + b + "'", "SOURCE_DATE_EPOCH=86400").exit_code == 0);
  CHECK(slurp(a) == slurp(b));
  CHECK(run("trace info --format json '" + a + "'").out.find("1970-01-02T00:00:00Z") !=
        std::string::npos);
}

TEST_CASE("convert", "[cli][trace]") {
  const std::string file = path_of("convert_in.h5");
  REQUIRE(run(synth_command() + "'" + file + "'").exit_code == 0);
  const std::string mean = path_of("convert_mean.h5");
  const Result to_mean = run("trace convert '" + file + "' --to-mean --out '" + mean + "'");
  CHECK(to_mean.exit_code == 0);
  CHECK_THAT(to_mean.out, Catch::Contains("heads -> mean"));
  CHECK(run("trace validate '" + mean + "'").exit_code == 0);
  const std::string topk = path_of("convert_topk.h5");
  const Result to_topk = run("trace convert '" + file + "' --top-k 16 --drop-dense --steps " +
                             "50:150 --layers 2:4 --deflate 9 --out '" + topk + "'");
  CHECK(to_topk.exit_code == 0);
  const Result info = run("trace info '" + topk + "'");
  CHECK_THAT(info.out, Catch::Contains("prompt tokens    114") &&
                           Catch::Contains("decode steps     100") &&
                           Catch::Contains("layers           2..3") &&
                           Catch::Contains("granularities    topk (k=16), key_norms"));
  expect_one_line_error(run("trace convert '" + file + "' --steps 10:5 --out x.h5"), 2, "--steps");
  // A single index keeps that step (or layer) alone.
  const std::string one = path_of("convert_one.h5");
  REQUIRE(run("trace convert '" + file + "' --steps 7 --layers 1 --out '" + one + "'").exit_code ==
          0);
  CHECK_THAT(run("trace info '" + one + "'").out, Catch::Contains("prompt tokens    71") &&
                                                      Catch::Contains("decode steps     1") &&
                                                      Catch::Contains("layers           1..1"));
  expect_one_line_error(
      run("trace convert '" + topk + "' --top-k 4 --out '" + path_of("never.h5") + "'"), 2,
      "dense");
  expect_one_line_error(
      run("trace convert '" + file + "' --top-k 2000000 --out '" + path_of("never.h5") + "'"), 2,
      "more than 1048576");
  // --threshold is an attention weight; NaN would have reached the JSON output as `nan`.
  for (const char* threshold : {"nan", "inf", "0", "-1", "2"}) {
    CAPTURE(threshold);
    expect_one_line_error(run("trace info --format json '" + file + "' --threshold " + threshold),
                          2, "--threshold");
  }
  CHECK_FALSE(fs::exists(path_of("never.h5")));
}

TEST_CASE("bad input: one line naming the file, exit 3, no output", "[cli][trace]") {
  const std::string text = path_of("not_hdf5.h5");
  std::ofstream(text) << "hello\n";
  expect_one_line_error(run("trace info '" + text + "'"), 3, text);
  expect_one_line_error(run("trace validate '" + text + "'"), 3, "not an HDF5 file");
  expect_one_line_error(run("trace info '" + path_of("absent.h5") + "'"), 3, "absent.h5");

  const std::string good = path_of("to_truncate.h5");
  REQUIRE(run(synth_command() + "'" + good + "'").exit_code == 0);
  const std::string truncated = path_of("truncated.h5");
  const std::string bytes = slurp(good);
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  for (const char* command : {"info", "validate"}) {
    const Result result = run(std::string("trace ") + command + " '" + truncated + "'");
    INFO(command << ": " << result.err);
    CHECK(result.exit_code == 3);
    CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(truncated));
  }
  const std::string output = path_of("from_truncated.h5");
  const Result convert = run("trace convert '" + truncated + "' --out '" + output + "'");
  CHECK(convert.exit_code == 3);
  CHECK_FALSE(fs::exists(output));
  for (const auto& entry : fs::directory_iterator(scratch_dir())) {
    CHECK(entry.path().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("bad synth arguments exit 2", "[cli][trace]") {
  const std::string out = path_of("bad_synth.h5");
  expect_one_line_error(run("trace synth --model NoSuchModel --prompt-tokens 8 --steps 8 "
                            "--out '" +
                            out + "'"),
                        2, "NoSuchModel");
  expect_one_line_error(run("trace synth --model stories260K --prompt-tokens 8 --steps 8 "
                            "--pattern poetry --out '" +
                            out + "'"),
                        2, "poetry");
  expect_one_line_error(run("trace synth --model stories260K --prompt-tokens 8 --steps 8 "
                            "--set sink_mass=0.9 --out '" +
                            out + "'"),
                        2, "cannot exceed 1");
  expect_one_line_error(run("trace synth --model stories260K --prompt-tokens 8 --steps 8 "
                            "--no-mean --out '" +
                            out + "'"),
                        2, "--top-k");
  // Usage errors, not a /meta the writer refuses (exit 3) or an HDF5 failure (exit 1).
  const std::string small = "trace synth --model stories260K --prompt-tokens 16 --steps 8 ";
  expect_one_line_error(run(small + "--prefill-window 17 --out '" + out + "'"), 2,
                        "--prefill-window 17 is longer than the prompt (16 tokens)");
  expect_one_line_error(run(small + "--top-k 4000000000 --out '" + out + "'"), 2,
                        "--top-k 4000000000 is more than 1048576");
  // A negative count was read as 2^32 - 1.
  expect_one_line_error(run(small + "--steps=-1 --out '" + out + "'"), 2,
                        "--steps -1: must not be negative");
  expect_one_line_error(run(small + "--out '" + out + "'", "SOURCE_DATE_EPOCH=yesterday"), 2,
                        "SOURCE_DATE_EPOCH 'yesterday'");
  expect_one_line_error(run(small + "--out '" + out + "'", "SOURCE_DATE_EPOCH=999999999999999"), 2,
                        "SOURCE_DATE_EPOCH");
  CHECK_FALSE(fs::exists(out));
  const Result with_set =
      run("trace synth --model stories260K --prompt-tokens 32 --steps 40 "
          "--set recency_decay_tokens=5 --set sink_tokens=2 --out '" +
          out + "'");
  CHECK(with_set.exit_code == 0);
  CHECK_THAT(run("trace info --format json '" + out + "'").out,
             Catch::Contains("\"recency_decay_tokens\":5") && Catch::Contains("\"sink_tokens\":2"));
}
