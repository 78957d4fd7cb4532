// `kvtier live` driven as a user would, on the stories260K fixture: the measurement file holds
// what the schema says (configs/schema/measurement.proto), tiering without eviction matches the
// full cache, and bad requests fail with one line and the documented exit code, leaving no file.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::expect_one_line_error;
using kvtier::test::quoted;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;
using kvtier::test::stories_dir;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

std::string live(const std::string& args) {
  return "live --model " + quoted(stories_dir() / "stories260K.bin") +
         " --prompt 'Once upon a time' " + args;
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

TEST_CASE("kvtier live --follow-trace runs the trace's tokens and makes the replay's moves",
          "[cli][live][follow]") {
  const fs::path trace = scratch_dir() / "follow.h5";
  const Result capture =
      run("trace capture --model " + quoted(stories_dir() / "stories260K.bin") +
          " --prompt 'Once upon a time' --max-new-tokens 90 --no-stop --out " + quoted(trace));
  INFO("stderr: " << capture.err);
  REQUIRE(capture.exit_code == 0);
  const std::string policy = "tiered:hbm=0.3,evict=0.2,delta=8,recent=16";
  const Result replayed =
      run("replay run --trace " + quoted(trace) + " --policy " + policy + " --format json");
  REQUIRE(replayed.exit_code == 0);
  const nlohmann::json replay = nlohmann::json::parse(replayed.out)["policies"][0];

  const fs::path file = scratch_dir() / "follow.json";
  // No prompt and no --max-new-tokens: the trace's prompt and all of its steps.
  const Result result =
      run("live --model " + quoted(stories_dir() / "stories260K.bin") + " --policy " + policy +
          " --follow-trace " + quoted(trace) + " --measure " + quoted(file));
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("followed"));
  const nlohmann::json json = nlohmann::json::parse(slurp(file));
  CHECK(json["follow_trace"] == trace.string());
  CHECK(json["new_tokens"] == "90");
  CHECK(json["steps"].size() == 90);
  CHECK(json["mean_kept_mass"].get<double>() ==
        Approx(replay["mean_kept_mass"].get<double>()).epsilon(1e-12));
  CHECK(json["mean_kept_mass"].get<double>() < 1.0);
  // The trace's own tokens were run (a captured trace: the model's greedy tokens).
  const nlohmann::json last = json["steps"][89];
  std::uint64_t evicted = std::stoull(last["tier_token_layers"][3].get<std::string>());
  CHECK(evicted == std::stoull(json["tiers"]["final_tier_token_layers"][3].get<std::string>()));
  CHECK(evicted > 0);
  // The followed trace was captured on this model: the same tokens as a plain live run of the
  // same prompt, as long as the tiered cache's greedy choice agrees with the full cache's.
  const fs::path plain = scratch_dir() / "plain.json";
  REQUIRE(run(live("--policy full --max-new-tokens 90 --no-reference --measure " + quoted(plain)))
              .exit_code == 0);
  CHECK(nlohmann::json::parse(slurp(plain))["generated_tokens"] == json["generated_tokens"]);

  const fs::path bad = scratch_dir() / "follow-bad.json";
  expect_one_line_error(
      run(live("--policy full --follow-trace " + quoted(trace) + " --measure " + quoted(bad))), 2,
      "exactly one of --prompt");
  expect_one_line_error(run("live --model " + quoted(stories_dir() / "stories260K.bin") +
                            " --policy full --max-new-tokens 91 --follow-trace " + quoted(trace) +
                            " --measure " + quoted(bad)),
                        2, "90 decode steps");
  expect_one_line_error(run("live --model " + quoted(stories_dir() / "stories260K.bin") +
                            " --policy full --follow-trace " +
                            quoted(scratch_dir() / "no-such.h5") + " --measure " + quoted(bad)),
                        3, "no-such.h5");
  CHECK_FALSE(fs::exists(bad));
}

// The simulator's copy volumes against the live cache's measured ones, on the same trace and
// policy: the simulator is given the replay's demand of the trace (tiering.traces), the live
// cache follows that trace (--follow-trace), and stories260K's KV is float32 in both.
TEST_CASE("the simulator's PCIe volumes equal the live cache's measured copies",
          "[cli][live][follow][validation]") {
  const fs::path trace = scratch_dir() / "volumes.h5";
  REQUIRE(run("trace capture --model " + quoted(stories_dir() / "stories260K.bin") +
              " --prompt 'Once upon a time' --max-new-tokens 100 --no-stop --out " + quoted(trace))
              .exit_code == 0);
  for (const std::string prefetch : {"full", "differential"}) {
    CAPTURE(prefetch);
    const std::string policy = "tiered:hbm=0.3,evict=0.2,delta=8,recent=16,prefetch=" + prefetch;
    const fs::path measured = scratch_dir() / ("volumes-" + prefetch + ".json");
    const Result live =
        run("live --model " + quoted(stories_dir() / "stories260K.bin") + " --policy " + policy +
            " --follow-trace " + quoted(trace) + " --no-reference --measure " + quoted(measured));
    INFO("stderr: " << live.err);
    REQUIRE(live.exit_code == 0);
    const nlohmann::json cache = nlohmann::json::parse(slurp(measured));

    const fs::path spec = scratch_dir() / ("volumes-" + prefetch + ".textproto");
    {
      std::ofstream out(spec);
      out << "name: \"volumes\"\n"
             "hardware { node { preset: \"hgx-h100-8\" } num_nodes: 1 }\n"
             "model { preset: \"stories260K\" }\n"
             "tensor_parallel_degree: 1\n"
             "workload { closed_loop { concurrency: 1 num_requests: 1\n"
             "  prompt_tokens { fixed_tokens: "
          << cache["prompt_tokens"].get<std::string>()
          << " } output_tokens { fixed_tokens: 100 } }\n"
             "  max_batch_size: 1 prefill_chunk_tokens: 2048 }\n"
             "policy { name: \"tiered\" param { name: \"hbm\" number: 0.3 }\n"
             "  param { name: \"evict\" number: 0.2 } param { name: \"delta\" number: 8 }\n"
             "  param { name: \"recent\" number: 16 } param { name: \"prefetch\" text: \""
          << prefetch
          << "\" } }\n"
             "tiering { traces: "
          << "\"" << trace.string()
          << "\" prefetch_lookahead_layers: 1 host_allocation: PINNED }\n"
             "memory { runtime_reserve_gib: 0 activation_workspace_gib: 0 }\n"
             "engine { iteration_overhead_us: 0 }\nseed: 1\n";
    }
    const Result sim = run("sim " + quoted(spec) + " --format json");
    INFO("sim stderr: " << sim.err);
    REQUIRE(sim.exit_code == 0);
    const nlohmann::json metrics = nlohmann::json::parse(sim.out)["policies"][0]["metrics"];
    const auto bytes = [](double gigabytes) { return std::llround(gigabytes * 1e9); };
    const auto measured_bytes = [&](const char* field) {
      return std::stoll(cache[field]["bytes"].get<std::string>());
    };
    // Staging of T1 (full: all of it every step; differential: what is new), promotions into
    // T0, and the offloads.
    CHECK(measured_bytes("h2d_prefetch") > 0);
    CHECK(measured_bytes("h2d_promote") > 0);
    CHECK(bytes(metrics["pcie_h2d_gb"].get<double>()) ==
          measured_bytes("h2d_prefetch") + measured_bytes("h2d_promote"));
    CHECK(bytes(metrics["pcie_d2h_gb"].get<double>()) == measured_bytes("d2h"));
  }
}
