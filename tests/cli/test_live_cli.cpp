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
#include <tuple>

#include "kernels/device_info.hpp"
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
  // The CPU backend's arenas: T0 grown to its peak, staging at least its peak use.
  const auto bytes = [&](const char* group, const char* key) {
    return std::stoull(json[group][key].get<std::string>());
  };
  CHECK(bytes("device_memory", "t0_arena_bytes") >= bytes("tiers", "t0_peak_bytes"));
  CHECK(bytes("device_memory", "staging_bytes") >= bytes("tiers", "staging_peak_bytes"));
  CHECK(bytes("device_memory", "weights_bytes") == 0);
  CHECK(bytes("device_memory", "used_peak_bytes") == 0);
  // No eviction, no compression: exactly the full cache.
  CHECK(json["divergence"]["measured"] == true);
  CHECK(json["divergence"]["greedy_agreement_tokens"] == "120");
  CHECK(json["divergence"]["mean_kl_nats"].get<double>() == 0.0);
  CHECK(json["divergence"]["identical_logit_steps"] == "120");
  CHECK(json["sampling"]["temperature"].get<double>() == 0.0);  // greedy
  CHECK_FALSE(json.contains("staging_lookahead_layers"));       // a CUDA backend's only
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));
}

TEST_CASE("kvtier live samples with --temperature, --top-p and --seed, and records them",
          "[cli][live]") {
  const fs::path file = scratch_dir() / "sampled.json";
  const std::string policy = "--policy tiered:hbm=0.5,evict=0.5,delta=8,recent=16,sinks=4 ";
  const Result result = run(live(policy +
                                 "--max-new-tokens 150 --temperature 0.8 --top-p 0.9 "
                                 "--seed 7 --measure " +
                                 quoted(file)));
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("agreement") && !Catch::Contains("greedy agreement"));
  const nlohmann::json json = nlohmann::json::parse(slurp(file));
  CHECK(json["sampling"]["temperature"].get<double>() == Approx(0.8));
  CHECK(json["sampling"]["top_p"].get<double>() == Approx(0.9));
  CHECK(json["sampling"]["seed"] == "7");
  // Same seed, same tokens; the greedy run's are others.
  const fs::path again = scratch_dir() / "sampled-again.json";
  REQUIRE(run(live(policy +
                   "--max-new-tokens 150 --temperature 0.8 --top-p 0.9 --seed 7 "
                   "--measure " +
                   quoted(again)))
              .exit_code == 0);
  const fs::path greedy = scratch_dir() / "greedy.json";
  REQUIRE(run(live(policy + "--max-new-tokens 150 --measure " + quoted(greedy))).exit_code == 0);
  const auto tokens = [](const fs::path& path) {
    return nlohmann::json::parse(slurp(path))["generated_tokens"];
  };
  CHECK(tokens(file) == tokens(again));
  CHECK(tokens(file) != tokens(greedy));
  expect_one_line_error(run(live("--policy full --temperature -1")), 2, "temperature");
  expect_one_line_error(run(live("--policy full --temperature 0.8 --top-p 0")), 2, "top_p");
}

TEST_CASE("kvtier live --recode-threads recodes the same tokens and records the count",
          "[cli][live]") {
  const std::string policy = "--policy tiered:hbm=0.3,evict=0.1,compress=0.5,delta=8,recent=16 ";
  const auto measure = [&](const std::string& threads) {
    const fs::path file = scratch_dir() / ("recode-" + threads + ".json");
    const Result result = run(live(policy + "--max-new-tokens 120 --recode-threads " + threads +
                                   " --measure " + quoted(file)));
    INFO("stderr: " << result.err);
    REQUIRE(result.exit_code == 0);
    return nlohmann::json::parse(slurp(file));
  };
  const nlohmann::json one = measure("1");
  const nlohmann::json three = measure("3");
  CHECK(std::stoull(one["host_recode"]["bytes"].get<std::string>()) > 0);
  CHECK(three["host_recode"]["bytes"] == one["host_recode"]["bytes"]);
  CHECK(three["host_recode"]["token_layers"] == one["host_recode"]["token_layers"]);
  CHECK(three["generated_tokens"] == one["generated_tokens"]);
  CHECK(three["divergence"]["mean_kl_nats"] == one["divergence"]["mean_kl_nats"]);
  // One thread, as before the option, is not named.
  CHECK_THAT(three["provenance"]["device_detail"].get<std::string>(),
             Catch::EndsWith(", 3 recode threads"));
  CHECK_THAT(one["provenance"]["device_detail"].get<std::string>(),
             !Catch::Contains("recode threads"));
  // The count, for kvtier validate's simulation of the host's recodes.
  CHECK(one["recode_threads"] == 1);
  CHECK(three["recode_threads"] == 3);
  // And how the threads shared them: the pool's chunk and one-thread threshold
  // (kernels/impl/host_recode.hpp), whatever the count.
  for (const nlohmann::json* file : {&one, &three}) {
    CHECK((*file)["recode_chunk_token_layers"] == 4);
    CHECK((*file)["recode_parallel_min_values"] == "65536");
  }
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
  expect_one_line_error(run(live("--policy full --compute-dtype fp16 --measure " + quoted(file))),
                        2, "--device cuda");
  expect_one_line_error(run(live("--policy full --device tpu --measure " + quoted(file))), 2,
                        "tpu");
  // The CUDA engine's and cache's choices: only with --device cuda, and a bad value is checked
  // before the device, so these fail alike with or without a GPU.
  for (const auto& [option, good, bad, expected] :
       {std::tuple{"--cuda-attention", "split-keys", "flash", "one of split-keys, per-head"},
        std::tuple{"--cuda-gemm", "warp-rows", "cutlass", "one of warp-rows, cublas"},
        std::tuple{"--cuda-fusion", "on", "yes", "one of off, on"},
        std::tuple{"--cuda-copies", "copy-engines", "dma", "one of kernels, copy-engines"}}) {
    CAPTURE(option);
    expect_one_line_error(run(live(std::string("--policy full ") + option + " " + good +
                                   " --measure " + quoted(file))),
                          2, std::string(option) + " applies to --device cuda");
    expect_one_line_error(run(live(std::string("--policy full --device cuda ") + option + " " +
                                   bad + " --measure " + quoted(file))),
                          2, std::string(expected) + ", not '" + bad + "'");
  }
  expect_one_line_error(run(live("--policy nosuch --measure " + quoted(file))), 2, "nosuch");
  expect_one_line_error(run(live("--policy snapkv --measure " + quoted(file))), 2,
                        "cannot run on the live cache");
  expect_one_line_error(run(live("--policy tiered:hbm=2 --measure " + quoted(file))), 2, "hbm");
  expect_one_line_error(run(live("--policy full --max-new-tokens 0")), 2, "--max-new-tokens");
  expect_one_line_error(run(live("--policy full --max-new-tokens 600")), 2,
                        "max_position_embeddings");
  expect_one_line_error(run(live("--policy full --t0-budget 1KiB --measure " + quoted(file))), 2,
                        "T0 budget");
  // 1e30 bytes was converted past the integer's range and ran with the default budget.
  expect_one_line_error(run(live("--policy full --t0-budget 1e30B --measure " + quoted(file))), 2,
                        "--t0-budget must be from one byte to 4 EiB");
  expect_one_line_error(run(live("--policy full --threads 0 --measure " + quoted(file))), 2,
                        "--threads 0");
  // The CUDA cache's lookahead: only with --device cuda, its range checked before the device.
  expect_one_line_error(run(live("--policy full --cuda-lookahead 2 --measure " + quoted(file))), 2,
                        "--cuda-lookahead applies to --device cuda");
  expect_one_line_error(
      run(live("--policy full --device cuda --cuda-lookahead 17 --measure " + quoted(file))), 2,
      "--cuda-lookahead 17: from 0 to 16 layers");
  expect_one_line_error(run(live("--policy full --recode-threads 0 --measure " + quoted(file))), 2,
                        "--recode-threads 0: from 1 to 1024");
  expect_one_line_error(run(live("--policy full --recode-threads 1025 --measure " + quoted(file))),
                        2, "--recode-threads 1025: from 1 to 1024");
  // Checked before the device too: this fails alike with or without a GPU.
  expect_one_line_error(
      run(live("--policy full --device cuda --recode-threads 0 --measure " + quoted(file))), 2,
      "--recode-threads 0: from 1 to 1024");
  // A tokenizer.bin cut at a token boundary reads as a smaller vocabulary.
  const fs::path truncated = scratch_dir() / "truncated_tok.bin";
  {
    const std::string bytes = slurp(stories_dir() / "tok512.bin");
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, 100);
  }
  expect_one_line_error(
      run(live("--policy full --tokenizer " + quoted(truncated) + " --measure " + quoted(file))), 3,
      "the tokenizer holds 7 tokens where the model has 512");
  expect_one_line_error(
      run("live --model " + quoted(scratch_dir() / "missing.bin") + " --policy full --prompt x"), 3,
      "missing.bin");
  expect_one_line_error(run("live --model " + quoted(stories_dir() / "stories260K.bin") +
                            " --policy full --prompt-file " + quoted(scratch_dir() / "none.txt")),
                        3, "prompt file");
  CHECK_FALSE(fs::exists(file));
}

// (A test name must not start with "--": CTest passes it to Catch as an argument.)
TEST_CASE("live on --device cuda runs with a CUDA build and a GPU, else fails with one line",
          "[cli][live]") {
  const fs::path file = scratch_dir() / "cuda.json";
  const Result result =
      run(live("--policy tiered:hbm=0.5,evict=0 --max-new-tokens 20 --device "
               "cuda --compute-dtype fp32 --measure " +
               quoted(file)));
  // The kvtier binary is of this build, so it sees the same devices as this test.
  std::string status;
  const bool built = kvtier::kernels::built_with_cuda();
  if (built && !kvtier::kernels::cuda_devices(status).empty()) {
    INFO("stderr: " << result.err);
    REQUIRE(result.exit_code == 0);
    const nlohmann::json json = nlohmann::json::parse(slurp(file));
    CHECK(json["provenance"]["device"] == "cuda");
    CHECK_THAT(json["provenance"]["device_detail"].get<std::string>(), Catch::EndsWith(", fp32"));
    // No eviction, no T2: the full cache's logits, on the device as on the CPU.
    CHECK(json["divergence"]["identical_logit_steps"] == "20");
    return;
  }
  INFO("CUDA build: " << built << ", devices: " << status);
  expect_one_line_error(result, 2,
                        built ? "the CUDA engine is not available: "
                              : "the CUDA engine is not available in this build");
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
  // Relative to the measurement file's folder, as kvtier validate reads it.
  CHECK(json["follow_trace"] == "follow.h5");
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
  // Each step's copy busy time beside its bytes.
  for (const nlohmann::json& step : json["steps"]) {
    CHECK(step.contains("h2d_busy_ms"));
    CHECK((step["h2d_bytes"] == "0") == (step["h2d_busy_ms"].get<double>() == 0.0));
    CHECK((step["d2h_bytes"] == "0") == (step["d2h_busy_ms"].get<double>() == 0.0));
  }
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
  expect_one_line_error(run("live --model " + quoted(stories_dir() / "stories260K.bin") +
                            " --policy full --temperature 0.8 --follow-trace " + quoted(trace) +
                            " --measure " + quoted(bad)),
                        2, "tokens are forced");
  CHECK_FALSE(fs::exists(bad));
}

// The simulator's copy volumes against the live cache's measured ones, on the same trace and
// policy: the simulator is given the replay's demand of the trace (tiering.traces), the live cache
// follows that trace (--follow-trace), and stories260K's KV is float32 in both. Both step as the
// live cache does (docs/SIMULATION.md, "An iteration with tiers"): after the prefill the policy
// places the prompt and its offloads are made; decode step t stages the placement in force before
// its policy step, then the step's moves are made. The live run decodes every one of the trace's
// N steps; a simulated request decodes N of them when it has N + 1 output tokens, its first token
// coming from the prefill. The parameters below make the last step move tokens (tiered re-tiers
// at every 9th step of 99; monarch pages a page out as its window moves past it, every 5 steps
// from step 18 to step 98), and monarch's start pages part of the prompt out, so both ends of
// the run count.
namespace {

constexpr int kVolumeSteps = 99;
// 32 tokens: longer than monarch's window and hot pages, so that its start places some in T2.
constexpr const char* kVolumePrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

fs::path volumes_trace() {
  const fs::path trace = scratch_dir() / "volumes.h5";
  const Result capture = run("trace capture --model " + quoted(stories_dir() / "stories260K.bin") +
                             " --prompt '" + kVolumePrompt + "' --max-new-tokens " +
                             std::to_string(kVolumeSteps) + " --no-stop --out " + quoted(trace));
  INFO("stderr: " << capture.err);
  REQUIRE(capture.exit_code == 0);
  return trace;
}

struct CopyVolumes {
  nlohmann::json measured;  // the live cache's measurement file
  std::int64_t simulated_h2d = 0;
  std::int64_t simulated_d2h = 0;

  [[nodiscard]] std::int64_t measured_bytes(const char* field) const {
    return std::stoll(measured[field]["bytes"].get<std::string>());
  }
  [[nodiscard]] std::int64_t measured_token_layers(const char* field) const {
    return std::stoll(measured[field]["token_layers"].get<std::string>());
  }
  [[nodiscard]] std::int64_t measured_runs(const char* field) const {
    return std::stoll(measured[field]["runs"].get<std::string>());
  }
  // What the live run's last decode step copied out (its offloads).
  [[nodiscard]] std::int64_t last_step_d2h() const {
    return std::stoll(measured["steps"].back()["d2h_bytes"].get<std::string>());
  }
  // D2H of the decode steps; the rest of the run's D2H is the start placement's offloads.
  [[nodiscard]] std::int64_t steps_d2h() const {
    std::int64_t bytes = 0;
    for (const nlohmann::json& step : measured["steps"]) {
      bytes += std::stoll(step["d2h_bytes"].get<std::string>());
    }
    return bytes;
  }
};

// `policy` run live over `trace` and simulated as one request of the trace's prompt and
// kVolumeSteps + 1 output tokens.
CopyVolumes copy_volumes(const fs::path& trace, const std::string& policy,
                         const std::string& label) {
  CopyVolumes volumes;
  const fs::path measured = scratch_dir() / ("volumes-" + label + ".json");
  const Result live =
      run("live --model " + quoted(stories_dir() / "stories260K.bin") + " --policy " + policy +
          " --follow-trace " + quoted(trace) + " --no-reference --measure " + quoted(measured));
  INFO("stderr: " << live.err);
  REQUIRE(live.exit_code == 0);
  volumes.measured = nlohmann::json::parse(slurp(measured));
  REQUIRE(volumes.measured["new_tokens"] == std::to_string(kVolumeSteps));
  REQUIRE(volumes.measured["steps"].size() == kVolumeSteps);

  const fs::path spec = scratch_dir() / ("volumes-" + label + ".textproto");
  {
    std::ofstream out(spec);
    out << "name: \"volumes\"\n"
           "hardware { node { preset: \"hgx-h100-8\" } num_nodes: 1 }\n"
           "model { preset: \"stories260K\" }\n"
           "tensor_parallel_degree: 1\n"
           "workload { closed_loop { concurrency: 1 num_requests: 1\n"
           "  prompt_tokens { fixed_tokens: "
        << volumes.measured["prompt_tokens"].get<std::string>()
        << " } output_tokens { fixed_tokens: " << kVolumeSteps + 1
        << " } }\n"
           "  max_batch_size: 1 prefill_chunk_tokens: 2048 }\n"
           "policy { name: \"full\" }\n"
           "tiering { traces: \""
        << trace.string() << "\" prefetch_lookahead_layers: 1 host_allocation: PINNED "
        << "copy_method: COPY_ENGINES }\n"
           "memory { runtime_reserve_gib: 0 activation_workspace_gib: 0 }\n"
           "engine { iteration_overhead_us: 0 }\nseed: 1\n";
  }
  const Result sim = run("sim " + quoted(spec) + " --policy " + policy + " --format json");
  INFO("sim stderr: " << sim.err);
  REQUIRE(sim.exit_code == 0);
  const nlohmann::json metrics = nlohmann::json::parse(sim.out)["policies"][0]["metrics"];
  const auto bytes = [](double gigabytes) { return std::llround(gigabytes * 1e9); };
  volumes.simulated_h2d = bytes(metrics["pcie_h2d_gb"].get<double>());
  volumes.simulated_d2h = bytes(metrics["pcie_d2h_gb"].get<double>());
  return volumes;
}

}  // namespace

TEST_CASE("the simulator's PCIe volumes equal the live cache's measured copies",
          "[cli][live][follow][validation]") {
  const fs::path trace = volumes_trace();
  for (const std::string prefetch : {"full", "differential"}) {
    CAPTURE(prefetch);
    const CopyVolumes volumes = copy_volumes(
        trace, "tiered:hbm=0.3,evict=0.2,delta=9,recent=16,prefetch=" + prefetch, prefetch);
    // Staging of T1 (full: all of it every step; differential: what is new), promotions into
    // T0, and the offloads.
    CHECK(volumes.measured_bytes("h2d_prefetch") > 0);
    CHECK(volumes.measured_bytes("h2d_promote") > 0);
    CHECK(volumes.measured_bytes("h2d_compressed") == 0);
    // The last step re-tiers: it moves tokens, which the simulated request must count too.
    CHECK(volumes.last_step_d2h() > 0);
    CHECK(volumes.simulated_h2d ==
          volumes.measured_bytes("h2d_prefetch") + volumes.measured_bytes("h2d_promote"));
    CHECK(volumes.simulated_d2h == volumes.measured_bytes("d2h"));
  }
}

// With T2: the compressed token-layer is int8 codes plus a float32 scale per KV head for K and
// for V in both (stories260K, 4 KV heads of 8: 64 + 32 = 96 bytes); promotions out of T2 and
// offloads into it cross as compressed bytes; T1 <-> T2 recodes stay in host memory.
TEST_CASE("the simulator's PCIe volumes equal the live cache's measured copies with T2",
          "[cli][live][follow][validation]") {
  const fs::path trace = volumes_trace();
  const auto check_t2 = [](const CopyVolumes& volumes) {
    CHECK(volumes.measured_bytes("h2d_compressed") > 0);
    CHECK(volumes.measured_bytes("h2d_compressed") ==
          96 * volumes.measured_token_layers("h2d_compressed"));
    CHECK(volumes.measured_bytes("d2h") > 0);
    // The last step moves tokens out.
    CHECK(volumes.last_step_d2h() > 0);
    CHECK(volumes.simulated_h2d == volumes.measured_bytes("h2d"));
    CHECK(volumes.simulated_d2h == volumes.measured_bytes("d2h"));
    // Each kind's contiguous pieces: one or more token-layers each.
    for (const char* field :
         {"h2d_prefetch", "h2d_compressed", "h2d_promote", "d2h", "host_recode"}) {
      CAPTURE(field);
      CHECK(volumes.measured_runs(field) <= volumes.measured_token_layers(field));
      CHECK((volumes.measured_runs(field) > 0) == (volumes.measured_token_layers(field) > 0));
    }
    CHECK(volumes.measured_runs("h2d") == volumes.measured_runs("h2d_prefetch") +
                                              volumes.measured_runs("h2d_compressed") +
                                              volumes.measured_runs("h2d_promote"));
  };
  for (const std::string prefetch : {"full", "differential"}) {
    CAPTURE(prefetch);
    const CopyVolumes volumes = copy_volumes(
        trace, "tiered:hbm=0.3,evict=0.2,compress=0.5,delta=9,recent=16,prefetch=" + prefetch,
        "t2-" + prefetch);
    CHECK(volumes.measured_bytes("h2d_prefetch") > 0);
    // Re-tiering moved tokens between T1 and T2 (host memory only: in neither volume).
    CHECK(volumes.measured_bytes("host_recode") > 0);
    check_t2(volumes);
  }
  // Monarch pages cold tokens to T2 and back, never to T1, so every promotion comes out of T2;
  // compression=int8 is the format the live cache stores. Its start pages out the prompt's pages
  // before the window (its sticky tokens do not fit beside it): offloads after the prefill,
  // before any step.
  const CopyVolumes monarch = copy_volumes(
      trace, "monarch:attend=all,compression=int8,window=18,max_hot=25,page=5", "monarch");
  CHECK(monarch.measured_bytes("h2d_prefetch") == 0);
  CHECK(monarch.measured_bytes("h2d_promote") > 0);
  CHECK(monarch.measured_bytes("d2h") > monarch.steps_d2h());
  check_t2(monarch);
}
