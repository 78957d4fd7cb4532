// `kvtier live` driven as a user would, on the stories260K fixture: the measurement file holds
// what the schema says (configs/schema/measurement.proto), tiering without eviction matches the
// full cache, and bad requests fail with one line and the documented exit code, leaving no file.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/support/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

fs::path stories_dir() {
  return fs::path(KVTIER_SOURCE_DIR) / ".." / "shared" / "fixtures" / "stories260K";
}

std::string quoted(const fs::path& path) {
  return "'" + path.string() + "'";
}

std::string live(const std::string& args) {
  return "live --model " + quoted(stories_dir() / "stories260K.bin") +
         " --prompt 'Once upon a time' " + args;
}

void expect_one_line_error(const Result& result, int exit_code, const std::string& text) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == exit_code);
  CHECK(result.out.empty());
  CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(text));
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("kvtier live help", "[cli][live]") {
  const Result help = run("live --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("--policy") && Catch::Contains("--measure"));
}

TEST_CASE("kvtier live writes a measurement file", "[cli][live]") {
  const fs::path file = scratch_dir() / "tiered.json";
  const Result result =
      run(live("--policy tiered:hbm=0.3,evict=0,delta=8,recent=16 "
               "--max-new-tokens 120 --measure " +
               quoted(file)));
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("tokens/s") && Catch::Contains("greedy agreement"));
  const nlohmann::json json = nlohmann::json::parse(slurp(file));
  CHECK(json["format_version"] == 1);
  CHECK_THAT(json["provenance"]["tool"].get<std::string>(), Catch::StartsWith("kvtier "));
  CHECK(json["provenance"]["device"] == "cpu");
  CHECK_FALSE(json["provenance"]["cpu_model"].get<std::string>().empty());
  CHECK(json["provenance"]["date_utc"].get<std::string>().size() == 20);
  CHECK_THAT(json["policy"].get<std::string>(),
             Catch::StartsWith("tiered:hbm=0.3,evict=0,delta=8,compress=0,recent=16"));
  CHECK(json["prefetch"] == "full");
  CHECK(json["new_tokens"] == "120");  // 64-bit integers are strings in proto3 JSON
  CHECK(json["generated_tokens"].size() == 120);
  CHECK(json["tokens_per_s"].get<double>() > 0.0);
  for (const char* key : {"p50_ms", "p90_ms", "p99_ms", "mean_ms"}) {
    CHECK(json["step_latency"][key].get<double>() > 0.0);
  }
  CHECK(std::stoull(json["tiers"]["t0_peak_bytes"].get<std::string>()) <=
        std::stoull(json["tiers"]["t0_budget_bytes"].get<std::string>()));
  CHECK(std::stoull(json["tiers"]["t1_peak_bytes"].get<std::string>()) > 0);
  CHECK(std::stoull(json["h2d"]["bytes"].get<std::string>()) > 0);
  CHECK(std::stoull(json["d2h"]["bytes"].get<std::string>()) > 0);
  // No eviction, no compression: exactly the full cache.
  CHECK(json["divergence"]["measured"] == true);
  CHECK(json["divergence"]["greedy_agreement_tokens"] == "120");
  CHECK(json["divergence"]["mean_kl_nats"].get<double>() == 0.0);
  CHECK(json["divergence"]["identical_logit_steps"] == "120");
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));
}

TEST_CASE("kvtier live with eviction reports divergence", "[cli][live]") {
  const fs::path file = scratch_dir() / "h2o.json";
  const Result result =
      run(live("--policy h2o:budget=16 --max-new-tokens 100 --measure " + quoted(file)));
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  const nlohmann::json json = nlohmann::json::parse(slurp(file));
  CHECK(json["divergence"]["mean_kl_nats"].get<double>() > 0.0);
  CHECK(json["h2d"]["bytes"] == "0");
}

TEST_CASE("kvtier live errors", "[cli][live]") {
  const fs::path file = scratch_dir() / "bad.json";
  expect_one_line_error(run(live("--policy full --device cuda --measure " + quoted(file))), 2,
                        "CPU engine only");
  expect_one_line_error(run(live("--policy nosuch --measure " + quoted(file))), 2, "nosuch");
  expect_one_line_error(run(live("--policy snapkv --measure " + quoted(file))), 2,
                        "cannot run on the live cache");
  expect_one_line_error(run(live("--policy tiered:hbm=2 --measure " + quoted(file))), 2, "hbm");
  expect_one_line_error(run(live("--policy full --max-new-tokens 0")), 2, "--max-new-tokens");
  expect_one_line_error(run(live("--policy full --max-new-tokens 600")), 2,
                        "max_position_embeddings");
  expect_one_line_error(run(live("--policy full --t0-budget 1KiB --measure " + quoted(file))), 2,
                        "T0 budget");
  expect_one_line_error(
      run("live --model " + quoted(scratch_dir() / "missing.bin") + " --policy full --prompt x"), 3,
      "missing.bin");
  expect_one_line_error(run("live --model " + quoted(stories_dir() / "stories260K.bin") +
                            " --policy full --prompt-file " + quoted(scratch_dir() / "none.txt")),
                        3, "prompt file");
  CHECK_FALSE(fs::exists(file));
}
