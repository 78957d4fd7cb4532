// kvtier validate times a live run's host recodes where the simulated node's host has recode
// rates (validation/live.hpp): the committed CPU-backend T2 run, relabelled as an H200's, on an
// HGX H200 node whose host preset is given rates here (no shipped host has measured ones yet).

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"
#include "validation/live.hpp"

namespace {

namespace fs = std::filesystem;
using kvtier::validation::ReferenceCheck;

const fs::path kMeasurements = fs::path(kvtier::test::source_dir()) / "validation" / "measurements";

// The built-in presets, the HGX H200's host with `rates` appended (empty: as shipped).
std::vector<kvtier::config::PresetFile> presets_with_host_rates(const std::string& rates,
                                                                std::string& storage) {
  std::vector<kvtier::config::PresetFile> files(kvtier::config::builtin_preset_files().begin(),
                                                kvtier::config::builtin_preset_files().end());
  for (kvtier::config::PresetFile& file : files) {
    if (file.kind == "host" && file.name == "DDR5-4800-12ch") {
      storage = std::string(file.text) + "\n" + rates + "\n";
      file.text = storage;
    }
  }
  return files;
}

// The stories260K T2 run (CPU backend) as a CUDA run on an H200 with `recode_threads`, whose
// pool handed out `chunk` token-layers at a time and ran steps of under `min_values` values on
// one thread.
fs::path relabelled_run(int recode_threads, int chunk = 1, int min_values = 0) {
  nlohmann::json run = nlohmann::json::parse(
      kvtier::test::slurp(kMeasurements / "stories260K-tiered-t2-differential-cpu.json"));
  run["provenance"]["device"] = "cuda";
  run["provenance"]["device_name"] = "NVIDIA H200";
  run["provenance"]["device_detail"] = "sm_90, 132 SMs, fp32, split-keys attention";
  run["follow_trace"] = (kMeasurements / "traces" / "stories260K-60.h5").string();
  run["recode_threads"] = recode_threads;
  run["recode_chunk_token_layers"] = chunk;
  run["recode_parallel_min_values"] = std::to_string(min_values);
  const fs::path path = kvtier::test::scratch_dir() /
                        ("t2-h200-" + std::to_string(recode_threads) + "-" + std::to_string(chunk) +
                         "-" + std::to_string(min_values) + ".json");
  std::ofstream(path) << run.dump();
  return path;
}

const ReferenceCheck& figure(const std::vector<ReferenceCheck>& checks, const std::string& metric) {
  for (const ReferenceCheck& check : checks) {
    if (check.metric == metric) {
      return check;
    }
  }
  FAIL("no figure " << metric);
  return checks.front();
}

}  // namespace

TEST_CASE("validate times a live run's host recodes at its host's rates, on its threads",
          "[validation][live]") {
  // The run recoded 20 token-layers: 5 T1 -> T2 (reading 256 full bytes each: 2 x 4 KV heads x
  // 8 FP32 values) and 15 T2 -> T1 (reading 96 compressed bytes: 64 codes and 8 scales).
  const fs::path one_thread = relabelled_run(1);
  const nlohmann::json measured = nlohmann::json::parse(kvtier::test::slurp(one_thread));
  REQUIRE(std::stoull(measured["host_recode"]["bytes"].get<std::string>()) == 5 * 256 + 15 * 96);

  std::string text;
  const auto files = presets_with_host_rates(
      "kv_recode { to_compressed_ns_per_value: 100 to_full_ns_per_value: 10 "
      "source: \"a test's figures\" }",
      text);
  const kvtier::config::PresetRegistry registry(files);
  const kvtier::config::ConfigLoader loader(registry);
  const auto timed = kvtier::validation::check_measurement_files({one_thread.string()}, loader);
  // 64 values a token-layer: (5 x 64 x 100 + 15 x 64 x 10) ns on one thread.
  const ReferenceCheck& busy = figure(timed, "host_recode_busy_s");
  CHECK_FALSE(busy.skipped());
  CHECK(busy.projected == Approx(41.6e-6).epsilon(1e-6));
  CHECK(busy.measured == measured["host_recode"]["seconds"].get<double>());
  CHECK(figure(timed, "host_recode_bytes").projected == 5 * 256 + 15 * 96);
  // Four threads share them, token-layer by token-layer: a step's few may leave threads idle.
  const auto four =
      kvtier::validation::check_measurement_files({relabelled_run(4).string()}, loader);
  const double shared = figure(four, "host_recode_busy_s").projected;
  CHECK(shared >= 41.6e-6 / 4 * (1 - 1e-6));
  CHECK(shared < 41.6e-6 / 2);
  // A pool like the live cache's (chunks of 4, one thread under 65,536 values) runs this tiny
  // model's steps, 64 values a token-layer, on one thread whatever the count.
  const auto small_steps =
      kvtier::validation::check_measurement_files({relabelled_run(4, 4, 65536).string()}, loader);
  CHECK(figure(small_steps, "host_recode_busy_s").projected == Approx(41.6e-6).epsilon(1e-6));
  // A chunk as large as the run, without the threshold: one chunk a step, one thread busy.
  const auto one_chunk =
      kvtier::validation::check_measurement_files({relabelled_run(4, 1024, 0).string()}, loader);
  CHECK(figure(one_chunk, "host_recode_busy_s").projected == Approx(41.6e-6).epsilon(1e-6));

  // On the step's path: the time per token grows by the recodes over the run's 60 steps.
  const kvtier::config::PresetRegistry builtin(kvtier::config::builtin_preset_files());
  const kvtier::config::ConfigLoader shipped(builtin);
  const auto untimed = kvtier::validation::check_measurement_files({one_thread.string()}, shipped);
  CHECK(figure(untimed, "host_recode_busy_s").skipped_because ==
        "not timed: node hgx-h200-8's host declares no kv_recode rates");
  CHECK(figure(timed, "tpot_mean_ms").projected - figure(untimed, "tpot_mean_ms").projected ==
        Approx(41.6e-3 / 60).epsilon(1e-4));
}
