// `kvtier validate` on live measurement files (validation/live.hpp, docs/VALIDATION.md "Live
// measurement files"), driven as a user would on the stories260K fixture: a run that followed a
// trace validates with the simulator's byte volumes equal to its own, a changed figure is
// OUTSIDE (exit 1) unless the file's tolerance allows it, what cannot be compared is listed as
// skipped with the reason, and broken files fail with one line naming file and field (exit 3).

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::expect_one_line_error;
using kvtier::test::quoted;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;
using kvtier::test::stories_dir;

constexpr const char* kPolicy = "tiered:hbm=0.3,evict=0.2,delta=8,recent=16";

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

fs::path model() {
  return stories_dir() / "stories260K.bin";
}

// A 60-step capture of the fixture (made once per test process) in its own folder.
const fs::path& trace() {
  static const fs::path path = [] {
    fs::create_directories(scratch_dir() / "traces");
    const fs::path file = scratch_dir() / "traces" / "followed.h5";
    const Result capture = run("trace capture --model " + quoted(model()) +
                               " --prompt 'Once upon a time' --max-new-tokens 60 --no-stop "
                               "--dtype fp16 --out " +
                               quoted(file));
    INFO("stderr: " << capture.err);
    REQUIRE(capture.exit_code == 0);
    return file;
  }();
  return path;
}

// `kvtier live` following trace() with kPolicy; its measurement file as JSON.
const nlohmann::json& followed_run() {
  static const nlohmann::json json = [] {
    const fs::path file = scratch_dir() / "followed.json";
    const Result live =
        run("live --model " + quoted(model()) + " --policy " + kPolicy + " --follow-trace " +
            quoted(trace()) + " --no-reference --measure " + quoted(file));
    INFO("stderr: " << live.err);
    REQUIRE(live.exit_code == 0);
    return nlohmann::json::parse(slurp(file));
  }();
  return json;
}

fs::path write_json(const std::string& name, const nlohmann::json& json) {
  const fs::path path = scratch_dir() / name;
  std::ofstream(path) << json.dump(2) << "\n";
  return path;
}

fs::path write_text(const std::string& name, const std::string& text) {
  const fs::path path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::uint64_t bytes(const nlohmann::json& json, const char* direction) {
  return std::stoull(json[direction]["bytes"].get<std::string>());
}

// The JSON rows of `validate --format json` for one figure.
nlohmann::json figure(const Result& result, const std::string& metric) {
  const nlohmann::json json = nlohmann::json::parse(result.out);
  for (const auto& row : json["references"]) {
    if (row["metric"] == metric) {
      return row;
    }
  }
  FAIL("no row for " << metric << " in " << result.out);
  return {};
}

// The text table's line for a metric.
std::string row_of(const std::string& table, const std::string& metric) {
  const auto at = table.find(" " + metric + " ");
  if (at == std::string::npos) {
    return {};
  }
  const auto begin = table.rfind('\n', at) + 1;
  return table.substr(begin, table.find('\n', at) - begin);
}

}  // namespace

TEST_CASE("validate --help describes live measurement files", "[cli][validate][live]") {
  const Result help = run("validate --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("kvtier live --measure") &&
                           Catch::Contains("follow_trace") && Catch::Contains("tolerances"));
}

TEST_CASE("every committed measurement file validates (validation/measurements/)",
          "[cli][validate][live]") {
  // CI's gate: the references and the live files, each within its tolerance.
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(kvtier::test::source_dir()) /
                                                  "validation" / "measurements")) {
    if (entry.is_regular_file()) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string args = "validate";
  std::size_t live_files = 0;
  for (const fs::path& file : files) {
    args += " " + quoted(file);
    live_files += file.extension() == ".json" ? 1 : 0;
  }
  REQUIRE(live_files >= 1);
  const Result result = run(args);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains(" 0 outside tolerance"));
  // The committed live file's volumes were compared, not skipped.
  CHECK_THAT(row_of(result.out, "pcie_h2d_bytes"), Catch::EndsWith(" ok"));
  CHECK_THAT(row_of(result.out, "pcie_d2h_bytes"), Catch::EndsWith(" ok"));
}

TEST_CASE("validate: a CPU live run that followed a trace has the simulator's byte volumes",
          "[cli][validate][live]") {
  const nlohmann::json& measured = followed_run();
  REQUIRE(bytes(measured, "h2d") > 0);
  REQUIRE(bytes(measured, "d2h") > 0);
  const fs::path file = write_json("cpu-run.json", measured);
  const Result table = run("validate " + quoted(file));
  INFO("stderr: " << table.err);
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("3 figures, 0 outside tolerance, 4 skipped"));
  CHECK_THAT(row_of(table.out, "tpot_mean_ms"),
             Catch::Contains("skipped: not comparable (cpu backend)"));

  const Result json = run("validate " + quoted(file) + " --format json");
  REQUIRE(json.exit_code == 0);
  for (const char* metric : {"pcie_h2d_bytes", "pcie_d2h_bytes", "host_recode_bytes"}) {
    CAPTURE(metric);
    const nlohmann::json row = figure(json, metric);
    CHECK(row["id"] == "cpu-run");
    CHECK(row["policy"].get<std::string>().rfind("tiered:hbm=0.3,evict=0.2", 0) == 0);
    CHECK(row["projected"] == row["measured"]);
    CHECK(row["tolerance"] == 0);
    CHECK(row["within"] == true);
  }
  CHECK(figure(json, "pcie_h2d_bytes")["measured"] == bytes(measured, "h2d"));
  CHECK(figure(json, "pcie_h2d_busy_s")["skipped"].get<std::string>().rfind(
            "not comparable (cpu backend)", 0) == 0);

  // A relative follow_trace is found from the file's folder, whatever the working directory.
  nlohmann::json relative = measured;
  relative["follow_trace"] = "traces/followed.h5";
  const fs::path moved = write_json("relative.json", relative);
  const Result elsewhere = run("validate " + quoted(moved));
  INFO("stderr: " << elsewhere.err);
  CHECK(elsewhere.exit_code == 0);
}

TEST_CASE("validate: a live figure off by a byte is outside its tolerance",
          "[cli][validate][live]") {
  nlohmann::json tampered = followed_run();
  tampered["d2h"]["bytes"] = std::to_string(bytes(tampered, "d2h") + 1);
  const Result result = run("validate " + quoted(write_json("tampered.json", tampered)));
  CHECK(result.exit_code == 1);
  CHECK_THAT(row_of(result.out, "pcie_d2h_bytes"), Catch::EndsWith("OUTSIDE"));
  CHECK_THAT(row_of(result.out, "pcie_h2d_bytes"), Catch::EndsWith(" ok"));
  CHECK_THAT(result.err, Catch::Contains("1 of 3 figures outside their tolerance"));
}

TEST_CASE("validate: a live file's tolerances replace the defaults", "[cli][validate][live]") {
  nlohmann::json tampered = followed_run();
  const std::uint64_t h2d = bytes(tampered, "h2d");
  tampered["h2d"]["bytes"] = std::to_string(h2d + h2d / 100);  // 1% more than was copied
  tampered["tolerances"] = {{{"metric", "pcie_h2d_bytes"}, {"relative", 0.02}}};
  const Result allowed =
      run("validate " + quoted(write_json("tolerant.json", tampered)) + " --format json");
  INFO("stderr: " << allowed.err);
  CHECK(allowed.exit_code == 0);
  CHECK(figure(allowed, "pcie_h2d_bytes")["tolerance"] == 0.02);
  CHECK(figure(allowed, "pcie_d2h_bytes")["tolerance"] == 0);

  tampered["tolerances"][0]["relative"] = 0.005;
  CHECK(run("validate " + quoted(write_json("strict.json", tampered))).exit_code == 1);

  tampered["tolerances"][0]["metric"] = "speed";
  expect_one_line_error(run("validate " + quoted(write_json("bad-tolerance.json", tampered))), 3,
                        "tolerances[0].metric");
  tampered["tolerances"][0] = {{"metric", "pcie_h2d_bytes"}, {"relative", -1}};
  expect_one_line_error(run("validate " + quoted(write_json("negative.json", tampered))), 3,
                        "tolerances[0].relative");
}

TEST_CASE("validate: broken live files fail with one line naming the file and field",
          "[cli][validate][live]") {
  const fs::path truncated = write_text("truncated.json", "{\"format_version\": 1,\n");
  expect_one_line_error(run("validate " + quoted(truncated)), 3, "truncated.json");

  const fs::path report = write_text("report.json", "{\"policies\": []}\n");
  expect_one_line_error(run("validate " + quoted(report)), 3, "unknown field 'policies'");

  const fs::path binary = write_text("trace.bin", std::string("\x89HDF\r\n\x1a\n\0\0", 10));
  expect_one_line_error(run("validate " + quoted(binary)), 3, "trace.bin");
  // Binary without a NUL (a PNG's signature): neither kind either, placed at its first odd byte.
  const fs::path image = write_text("figure.png", "\x89PNG\r\n\x1a\n");
  const Result image_run = run("validate " + quoted(image));
  expect_one_line_error(image_run, 3, "figure.png:1:1");
  CHECK_THAT(image_run.err, Catch::Contains("neither a live measurement"));
  // A comment may hold any byte but NUL, as in configs: this one is a reference, and its error
  // (no configuration named) is a configuration error.
  const fs::path latin1 = write_text("latin1.textproto", "# caf\xe9\nname: \"x\"\n");
  CHECK(run("validate " + quoted(latin1)).exit_code == 2);

  nlohmann::json missing = followed_run();
  missing["follow_trace"] = "no-such-trace.h5";
  const Result no_trace = run("validate " + quoted(write_json("missing-trace.json", missing)));
  expect_one_line_error(no_trace, 3, "missing-trace.json");
  CHECK_THAT(no_trace.err,
             Catch::Contains("field follow_trace") && Catch::Contains("no-such-trace.h5"));

  nlohmann::json version = followed_run();
  version["format_version"] = 2;
  expect_one_line_error(run("validate " + quoted(write_json("version.json", version))), 3,
                        "field format_version");

  // Several recode threads need how they shared the recodes; a chunk holds something.
  nlohmann::json pool = followed_run();
  pool["recode_threads"] = 8;
  pool.erase("recode_chunk_token_layers");
  expect_one_line_error(run("validate " + quoted(write_json("pool.json", pool))), 3,
                        "field recode_chunk_token_layers");
  pool["recode_chunk_token_layers"] = 0;
  expect_one_line_error(run("validate " + quoted(write_json("pool.json", pool))), 3,
                        "a chunk holds 1 token-layer or more");

  // Counts past the run's 32-bit fields: the file's error (exit 3), not a --set nobody gave.
  nlohmann::json huge = followed_run();
  huge["new_tokens"] = "4294967295";
  expect_one_line_error(run("validate " + quoted(write_json("huge.json", huge))), 3,
                        "new_tokens 4294967295 is more than a run holds (");
  huge["new_tokens"] = followed_run()["new_tokens"];
  huge["prompt_tokens"] = "1000000000000";
  const Result huge_prompt = run("validate " + quoted(write_json("huge-prompt.json", huge)));
  expect_one_line_error(huge_prompt, 3, "huge-prompt.json");
  CHECK_THAT(huge_prompt.err, Catch::Contains("field prompt_tokens"));

  expect_one_line_error(run("validate " + quoted(scratch_dir() / "absent.json")), 2, "absent.json");
  expect_one_line_error(run("validate " + quoted(trace().parent_path())), 2, "a folder");
}

TEST_CASE("validate: live figures that cannot be simulated are skipped with the reason",
          "[cli][validate][live]") {
  // A free-running run: no trace to simulate it from.
  const fs::path file = scratch_dir() / "free.json";
  const Result live = run("live --model " + quoted(model()) + " --policy " + kPolicy +
                          " --prompt 'Once upon a time' --max-new-tokens 20 --no-reference "
                          "--measure " +
                          quoted(file));
  INFO("stderr: " << live.err);
  REQUIRE(live.exit_code == 0);
  const Result free = run("validate " + quoted(file));
  INFO("stderr: " << free.err);
  CHECK(free.exit_code == 0);
  CHECK_THAT(row_of(free.out, "pcie_h2d_bytes"), Catch::Contains("skipped: free-running run"));
  CHECK_THAT(free.out, Catch::Contains("0 figures, 0 outside tolerance, 7 skipped"));

  // A model that is no preset (a checkpoint of another name).
  nlohmann::json other = followed_run();
  other["provenance"]["model"] = "stories15M";
  const Result unknown = run("validate " + quoted(write_json("other-model.json", other)));
  CHECK(unknown.exit_code == 0);
  CHECK_THAT(row_of(unknown.out, "pcie_d2h_bytes"),
             Catch::Contains("skipped: model stories15M is not a model preset"));
}

TEST_CASE("validate: a CUDA run's engine is calibrated on its full-cache twin",
          "[cli][validate][live]") {
  // Both runs of the fixture relabelled as an H100's: the full cache's time per step fixes the
  // engine's cost beyond the model; the tiered run of the same engine is projected with it.
  const fs::path full_file = scratch_dir() / "twin-full-cpu.json";
  const Result live = run("live --model " + quoted(model()) + " --policy full --follow-trace " +
                          quoted(trace()) + " --no-reference --measure " + quoted(full_file));
  REQUIRE(live.exit_code == 0);
  const auto as_cuda = [](nlohmann::json json) {
    json["provenance"]["device"] = "cuda";
    json["provenance"]["device_name"] = "NVIDIA H100 80GB HBM3";
    json["provenance"]["device_detail"] = "sm_90, 132 SMs, driver 13.0, fp32, split-keys attention";
    return json;
  };
  nlohmann::json full_json = as_cuda(nlohmann::json::parse(slurp(full_file)));
  // A slow engine: 10 ms a step (the fixture's CPU steps beat the simulator's H100).
  full_json["decode_seconds"] = 0.01 * std::stod(full_json["new_tokens"].get<std::string>());
  const fs::path full = write_json("twin-full.json", full_json);
  nlohmann::json tiered_json = as_cuda(followed_run());
  const fs::path tiered = write_json("twin-tiered.json", tiered_json);
  const auto tpot = [](const Result& result, const std::string& id) {
    const nlohmann::json rows = nlohmann::json::parse(result.out)["references"];
    for (const auto& row : rows) {
      if (row["id"] == id && row["metric"] == "tpot_mean_ms") {
        return row;
      }
    }
    FAIL("no tpot_mean_ms row of " << id << " in " << result.out);
    return nlohmann::json{};
  };

  const Result alone = run("validate --format json " + quoted(tiered));
  const nlohmann::json uncalibrated = tpot(alone, "twin-tiered");
  CHECK_FALSE(uncalibrated.contains("note"));
  CHECK(uncalibrated["calibrated"] == false);

  const Result paired = run("validate --format json " + quoted(full) + " " + quoted(tiered));
  INFO("stderr: " << paired.err);
  const nlohmann::json twin = tpot(paired, "twin-full");
  CHECK(twin["calibrated"] == true);
  CHECK(twin["projected"].get<double>() == Approx(twin["measured"].get<double>()).epsilon(1e-3));
  CHECK_THAT(twin["note"].get<std::string>(), Catch::Contains("from twin-full"));
  const nlohmann::json calibrated = tpot(paired, "twin-tiered");
  CHECK(calibrated["calibrated"] == false);
  CHECK_THAT(calibrated["note"].get<std::string>(), Catch::Contains("from twin-full"));
  // The calibration adds the twin's gap, "engine +X ms per step", to every step (the fixture's
  // CPU steps are slower than an H100's, so the gap is positive).
  const std::string note = twin["note"];
  const double gap_ms = std::stod(note.substr(note.find('+') + 1));
  CHECK(gap_ms > 0.0);
  CHECK(calibrated["projected"].get<double>() ==
        Approx(uncalibrated["projected"].get<double>() + gap_ms).margin(1e-3));

  // A run whose cache copied with the copy engines: the same engine, so the same twin, and
  // its copies simulated beside compute rather than taking turns with it.
  nlohmann::json engines_json = tiered_json;
  engines_json["provenance"]["device_detail"] =
      tiered_json["provenance"]["device_detail"].get<std::string>() + ", copy-engines copies";
  const fs::path engines = write_json("twin-engines.json", engines_json);
  const Result both =
      run("validate --format json " + quoted(full) + " " + quoted(tiered) + " " + quoted(engines));
  const nlohmann::json on_engines = tpot(both, "twin-engines");
  CHECK_THAT(on_engines["note"].get<std::string>(), Catch::Contains("from twin-full"));
  CHECK(on_engines["projected"].get<double>() <
        tpot(both, "twin-tiered")["projected"].get<double>());

  // The layers the cache staged ahead (--cuda-lookahead) are the simulator's lookahead: on the
  // copy engines, none ahead leaves each layer waiting for its copy; files before the field
  // staged one, as the base run does.
  const auto with_lookahead = [&](int layers) {
    nlohmann::json json = engines_json;
    json["staging_lookahead_layers"] = layers;
    const std::string name = "twin-lookahead-" + std::to_string(layers);
    const Result result = run("validate --format json " + quoted(full) + " " +
                              quoted(write_json(name + ".json", json)));
    return tpot(result, name)["projected"].get<double>();
  };
  CHECK(with_lookahead(1) == on_engines["projected"].get<double>());
  CHECK(with_lookahead(0) > with_lookahead(1));
  CHECK(with_lookahead(4) <= with_lookahead(1));
  nlohmann::json too_far = engines_json;
  too_far["staging_lookahead_layers"] = 17;
  expect_one_line_error(run("validate " + quoted(write_json("twin-lookahead-17.json", too_far))), 3,
                        "prefetch_lookahead_layers");

  // A run whose cache recoded on several host threads: the same engine, so the same twin, and
  // the same projection (the simulator prices no host recode).
  nlohmann::json recoded_json = tiered_json;
  recoded_json["provenance"]["device_detail"] =
      tiered_json["provenance"]["device_detail"].get<std::string>() + ", 8 recode threads";
  const fs::path recoded = write_json("twin-recoded.json", recoded_json);
  const Result with_recodes = run("validate --format json " + quoted(full) + " " + quoted(recoded));
  const nlohmann::json on_threads = tpot(with_recodes, "twin-recoded");
  CHECK_THAT(on_threads["note"].get<std::string>(), Catch::Contains("from twin-full"));
  CHECK(on_threads["projected"] == calibrated["projected"]);

  // The twin may come after the runs it calibrates.
  const Result after = run("validate --format json " + quoted(tiered) + " " + quoted(full));
  CHECK(tpot(after, "twin-tiered")["projected"] == calibrated["projected"]);

  // The same trace found from a file given by a relative path, or through a link, is the
  // same twin as the full run's trace, found from its file's absolute path.
  REQUIRE(fs::path(tiered_json["follow_trace"].get<std::string>()).is_relative());
  const fs::path relative =
      fs::relative(write_json("twin-relative.json", tiered_json), fs::current_path());
  REQUIRE(relative.is_relative());
  const fs::path link = scratch_dir() / "traces" / "followed-link.h5";
  fs::remove(link);
  fs::create_symlink(fs::absolute(trace()), link);
  nlohmann::json linked_json = tiered_json;
  linked_json["follow_trace"] = "traces/followed-link.h5";
  const fs::path linked = write_json("twin-linked.json", linked_json);
  const Result spelt =
      run("validate --format json " + quoted(full) + " " + quoted(relative) + " " + quoted(linked));
  CHECK(tpot(spelt, "twin-relative")["projected"] == calibrated["projected"]);
  CHECK(tpot(spelt, "twin-linked")["projected"] == calibrated["projected"]);

  // A second full run of the engine, of the same name in another folder, is calibrated on the
  // first rather than calibrating.
  nlohmann::json copy_json = full_json;
  copy_json["decode_seconds"] = 2 * full_json["decode_seconds"].get<double>();
  copy_json["follow_trace"] = "../" + full_json["follow_trace"].get<std::string>();
  fs::create_directories(scratch_dir() / "elsewhere");
  const fs::path copy = write_json("elsewhere/twin-full.json", copy_json);
  const nlohmann::json rows = nlohmann::json::parse(
      run("validate --format json " + quoted(full) + " " + quoted(copy)).out)["references"];
  std::vector<bool> marked;
  for (const auto& row : rows) {
    if (row["metric"] == "tpot_mean_ms") {
      marked.push_back(row["calibrated"].get<bool>());
    }
  }
  CHECK(marked == std::vector<bool>{true, false});

  // An engine faster than the model is not calibrated (no negative time per step), and the
  // first full run of an engine decides, whatever full runs follow it.
  full_json["decode_seconds"] = 1e-9;
  const fs::path fast = write_json("twin-fast.json", full_json);
  const Result faster =
      run("validate --format json " + quoted(fast) + " " + quoted(tiered) + " " + quoted(full));
  CHECK_FALSE(tpot(faster, "twin-fast").contains("note"));
  CHECK_FALSE(tpot(faster, "twin-tiered").contains("note"));
  CHECK_FALSE(tpot(faster, "twin-full").contains("note"));

  // A time that is no time is the file's error, named; of several bad files, the first one's
  // error is reported, though live files are all read first.
  full_json["decode_seconds"] = -1.0;
  const fs::path negative = write_json("twin-negative.json", full_json);
  expect_one_line_error(run("validate " + quoted(negative)), 3, "decode_seconds");
  const fs::path bad_reference = write_text("bad-reference.textproto", "no_such_field: 1\n");
  expect_one_line_error(run("validate " + quoted(bad_reference) + " " + quoted(negative)), 2,
                        "no_such_field");

  // Another engine (another attention kernel here) is not calibrated on it.
  tiered_json["provenance"]["device_detail"] =
      "sm_90, 132 SMs, driver 13.0, fp32, per-head attention";
  const fs::path other = write_json("twin-other.json", tiered_json);
  const Result unpaired = run("validate --format json " + quoted(full) + " " + quoted(other));
  CHECK_FALSE(tpot(unpaired, "twin-other").contains("note"));
}

TEST_CASE("validate: a CUDA live file is simulated in its KV dtype on its GPU's node",
          "[cli][validate][live]") {
  // The CPU run relabelled as a GPU's: the KV dtype comes from device_detail's last item.
  nlohmann::json cuda = followed_run();
  cuda["provenance"]["device"] = "cuda";
  cuda["provenance"]["device_name"] = "NVIDIA H100 80GB HBM3";
  cuda["provenance"]["device_detail"] = "compute 9.0, 132 SMs, fp32";
  const Result fp32 =
      run("validate " + quoted(write_json("cuda-fp32.json", cuda)) + " --format json");
  INFO("stderr: " << fp32.err);
  CHECK(figure(fp32, "pcie_h2d_bytes")["within"] == true);
  // Times are compared (CPU times against an H100's: far apart, so exit 1), at 10%.
  for (const char* metric : {"tpot_mean_ms", "pcie_h2d_busy_s", "pcie_d2h_busy_s"}) {
    CAPTURE(metric);
    const nlohmann::json row = figure(fp32, metric);
    CHECK_FALSE(row.contains("skipped"));
    CHECK(row["tolerance"] == 0.1);
    CHECK(row["projected"].get<double>() > 0.0);
  }

  // The dtype is an item of device_detail wherever it stands (kvtier live writes the attention
  // kernel after it).
  cuda["provenance"]["device_detail"] = "sm_90, 132 SMs, driver 13.0, fp32, split-keys attention";
  const Result fp32_attention =
      run("validate " + quoted(write_json("cuda-fp32-split.json", cuda)) + " --format json");
  CHECK(figure(fp32_attention, "pcie_h2d_bytes")["within"] == true);

  // bf16 (named, or assumed when device_detail names no dtype): half the float32 bytes.
  for (const char* detail : {"compute 9.0, 132 SMs, bf16", "compute 9.0, 132 SMs",
                             "sm_90, 132 SMs, driver 13.0, bf16, per-head attention"}) {
    CAPTURE(detail);
    cuda["provenance"]["device_detail"] = detail;
    const Result bf16 =
        run("validate " + quoted(write_json("cuda-bf16.json", cuda)) + " --format json");
    CHECK(bf16.exit_code == 1);
    const nlohmann::json row = figure(bf16, "pcie_h2d_bytes");
    CHECK(row["projected"].get<double>() * 2 == row["measured"].get<double>());
  }

  // A GPU no node preset holds: bytes compared, times skipped.
  cuda["provenance"]["device_detail"] = "compute 9.0, 114 SMs, fp32";
  cuda["provenance"]["device_name"] = "NVIDIA H100 PCIe";
  const Result pcie = run("validate " + quoted(write_json("cuda-pcie.json", cuda)));
  CHECK(pcie.exit_code == 0);
  CHECK_THAT(row_of(pcie.out, "tpot_mean_ms"),
             Catch::Contains("skipped: no node preset for GPU NVIDIA H100 PCIe"));
  CHECK_THAT(row_of(pcie.out, "pcie_h2d_bytes"), Catch::EndsWith(" ok"));
}

// The T2 run's recode time, which the simulator does not time on an H200 node yet: its host
// preset has no kv_recode rates (docs/VALIDATION.md). Its recoded bytes are compared.
bool untimed_recodes(const nlohmann::json& row) {
  if (row["metric"] != "host_recode_busy_s" || !row.contains("skipped")) {
    return false;
  }
  CHECK(row["id"].get<std::string>().ends_with("-t2"));
  CHECK(row["skipped"] == "not timed: node hgx-h200-8's host declares no kv_recode rates");
  return true;
}

// The live files committed in validation/measurements/FOLDER, copied into a scratch folder
// beside the trace they followed (made again from its seed), through `validate --format json`:
// its rows, and where the trace is.
struct CommittedLive {
  nlohmann::json rows;
  fs::path trace;
  std::string err;  // validate's stderr
};
CommittedLive validate_committed_live(const std::string& name) {
  const fs::path committed =
      fs::path(kvtier::test::source_dir()) / "validation" / "measurements" / name;
  const fs::path folder = scratch_dir() / name;
  fs::create_directories(folder);
  std::string files;
  for (const auto& entry : fs::directory_iterator(committed)) {
    if (entry.path().extension() == ".json") {
      fs::copy_file(entry.path(), folder / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
      files += " " + quoted(folder / entry.path().filename());
    }
  }
  REQUIRE_FALSE(files.empty());
  const fs::path trace = folder / "live-llama2-7b-reasoning.h5";
  const Result synth =
      run("trace synth --model Llama-2-7B --prompt-tokens 1024 --steps 512 --pattern reasoning "
          "--seed 1 --out " +
          quoted(trace));
  REQUIRE(synth.exit_code == 0);
  const Result result = run("validate --format json" + files);
  INFO("stderr: " << result.err);
  // 1: a figure outside its tolerance, which the callers look at row by row.
  REQUIRE((result.exit_code == 0 || result.exit_code == 1));
  REQUIRE(nlohmann::json::accept(result.out));
  return {nlohmann::json::parse(result.out)["references"], trace, result.err};
}

// The live runs of scripts/gpu-validate.sh on an H200 (docs/VALIDATION.md, "Live runs on an
// H200"), against the trace they followed, made again from its seed.
TEST_CASE("validate: the H200 live runs have the simulator's byte volumes, times compared",
          "[cli][validate][live]") {
  const auto [rows, trace, err] = validate_committed_live("h200-2026-11-30");
  INFO("validate's stderr: " << err);
  std::size_t byte_rows = 0;
  std::size_t moved = 0;
  for (const auto& row : rows) {
    CAPTURE(row.dump());
    if (untimed_recodes(row)) {
      continue;
    }
    REQUIRE_FALSE(row.contains("skipped"));
    const std::string metric = row["metric"];
    if (metric.ends_with("_bytes")) {
      // Byte for byte: what the GPU moved is what the replay of the trace moves.
      CHECK(row["within"] == true);
      CHECK(row["projected"] == row["measured"]);
      ++byte_rows;
      moved += row["measured"].get<double>() > 0.0 ? 1 : 0;
    } else if (metric == "tpot_mean_ms") {
      // Each run's engine calibrated on the full-cache run of the same attention kernel, the
      // simulator projects what tiering adds to a step within the 10% target.
      CHECK(row["within"] == true);
      const std::string id = row["id"];
      const std::string twin =
          id.ends_with("split-keys") ? "live-llama2-7b-full-split-keys" : "live-llama2-7b-full";
      CHECK(row["note"].get<std::string>().ends_with("from " + twin));
      const bool full = row["policy"] == "full";
      CHECK(row["calibrated"] == full);
    } else if (metric == "host_recode_busy_s") {
      CHECK(row["projected"] == 0.0);  // runs without T2 recode nothing
      CHECK(row["measured"] == 0.0);
    } else {
      // Copy times under the HGX H200's measured link (docs/VALIDATION.md): H2D within 10% for
      // the runs without T2; their offloads short by less than a quarter (the slot kernel they
      // ran stored before it loaded). T2's are reported, not yet within reach.
      const double measured_s = row["measured"].get<double>();
      const double projected_s = row["projected"].get<double>();
      CHECK(projected_s >= 0.0);
      const std::string id = row["id"];
      if (measured_s > 0.0 && !id.ends_with("-t2")) {
        if (metric == "pcie_h2d_busy_s") {
          CHECK(std::abs(projected_s / measured_s - 1.0) <= 0.10);
        } else if (metric == "pcie_d2h_busy_s") {
          CHECK(projected_s < measured_s);
          CHECK(projected_s >= 0.75 * measured_s);
        }
      }
    }
  }
  // Eight runs, two directions and the host's recodes: the six tiered runs copy both ways, the
  // T2 run also recodes (the bytes it read, equal to the simulator's); the full cache moves
  // nothing.
  CHECK(byte_rows == 24);
  CHECK(moved == 13);

  // Each run is simulated as the only engine of its node (one process on one GPU): its copies
  // have the host link to themselves, not the half of a PCIe switch two busy GPUs share.
  const fs::path spec = write_text(
      "h200-run.textproto",
      "hardware { node { preset: \"hgx-h200-8\" gpus_per_node: 1 gpus_per_pcie_switch: 1 } "
      "num_nodes: 1 }\n"
      "model { preset: \"Llama-2-7B\" kv_dtype: BF16 weight_dtype: BF16 activation_dtype: BF16 "
      "}\n"
      "tensor_parallel_degree: 1\n"
      "workload { closed_loop { concurrency: 1 num_requests: 1 prompt_tokens { fixed_tokens: 1024 "
      "} output_tokens { fixed_tokens: 513 } } max_batch_size: 1 prefill_chunk_tokens: 2048 }\n"
      "policy { name: \"full\" }\n"
      "tiering { prefetch_lookahead_layers: 1 host_allocation: PINNED copy_method: SM_KERNELS "
      "traces: \"" +
          trace.string() +
          "\" }\n"
          "memory { runtime_reserve_gib: 0 activation_workspace_gib: 0 }\n"
          "engine { iteration_overhead_us: 0 }\nseed: 1\n");
  const auto busy_h2d = [&](const std::string& extra) {
    const Result sim = run("sim " + quoted(spec) +
                           " --policy tiered:hbm=0.5,evict=0,compress=0,delta=8,recent=32 "
                           "--format json" +
                           extra);
    INFO("stderr: " << sim.err);
    REQUIRE(sim.exit_code == 0);
    const nlohmann::json metrics = nlohmann::json::parse(sim.out)["policies"][0]["metrics"];
    return metrics["pcie_h2d_utilisation"].get<double>() * metrics["duration_s"].get<double>();
  };
  double projected = 0.0;
  for (const auto& row : rows) {
    if (row["id"] == "live-llama2-7b-tiered-hbm50" && row["metric"] == "pcie_h2d_busy_s") {
      projected = row["projected"].get<double>();
    }
  }
  const double lone = busy_h2d("");
  CHECK(projected == Approx(lone).epsilon(1e-6));
  const double shared = busy_h2d(
      " --set hardware.node.gpus_per_node=8 --set "
      "hardware.node.gpus_per_pcie_switch=2");
  CHECK(shared > 1.5 * lone);
}

// The second session's live runs on the H200 (docs/VALIDATION.md, "Live runs on an H200, after
// the kernel work"): the faster split-key attention, cuBLAS and the warp-per-row GEMM, copies by
// kernels and by the copy engines. The host link's figures for copies by kernels come from the
// copy benchmark (configs/hardware/links/PCIe-Gen5-x16-H200.textproto), not from these runs:
// the runs whose copies are all slot kernels (no T2) are their out-of-sample check — staging
// every step's T1 tokens, or with differential prefetch only the new ones, its promotions and
// offloads batches of their own after each step.
TEST_CASE("validate: the second H200 live runs, their kernel copies within 10%",
          "[cli][validate][live]") {
  const auto [rows, trace, err] = validate_committed_live("h200-2026-11-30b");
  INFO("validate's stderr: " << err);
  const std::set<std::string> staged_by_kernels = {
      "live-llama2-7b-tiered-hbm75", "live-llama2-7b-tiered-hbm50", "live-llama2-7b-tiered-hbm25",
      "live-llama2-7b-tiered-hbm50-warp-rows", "live-llama2-7b-tiered-hbm50-differential"};
  std::size_t byte_rows = 0;
  std::size_t moved = 0;
  std::size_t checked_times = 0;
  for (const auto& row : rows) {
    CAPTURE(row.dump());
    if (untimed_recodes(row)) {
      continue;
    }
    REQUIRE_FALSE(row.contains("skipped"));
    const std::string metric = row["metric"];
    const std::string id = row["id"];
    if (metric.ends_with("_bytes")) {
      CHECK(row["within"] == true);
      CHECK(row["projected"] == row["measured"]);
      ++byte_rows;
      moved += row["measured"].get<double>() > 0.0 ? 1 : 0;
      continue;
    }
    CHECK(row["projected"].get<double>() >= 0.0);
    if (metric == "tpot_mean_ms") {
      // Calibrated on the full-cache run of the same GEMM (the cache's copies aside).
      const std::string twin =
          id.ends_with("warp-rows") ? "live-llama2-7b-full-warp-rows" : "live-llama2-7b-full";
      CHECK(row["note"].get<std::string>().ends_with("from " + twin));
      CHECK(row["calibrated"] == (row["policy"] == "full"));
    }
    if (staged_by_kernels.contains(id)) {
      CHECK(row["within"] == true);
      ++checked_times;
    }
  }
  CHECK(byte_rows == 30);  // ten runs, two directions and the host's recodes
  CHECK(moved == 17);      // the eight tiered runs copy both ways, the T2 run also recodes
  // Five runs: time per token, both copy times and their recodes' time (none).
  CHECK(checked_times == 20);
}
