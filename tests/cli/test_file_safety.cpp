// Files as a user can get them wrong: an input that never ends (/dev/zero), an output that is
// an input, an empty or misplaced output name, a write that fails half-way (the file size limit
// stands in for a full disk), and a command stopped by a signal. None may fill memory, destroy
// an input, crash, or leave a file behind.

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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

Result run(const std::string& args, const std::string& environment = "") {
  return kvtier::test::run_kvtier(args, environment);
}

// Every entry of `folder` whose name starts with `stem`: a final file or its temporaries.
int files_named(const fs::path& folder, const std::string& stem) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(folder)) {
    count += entry.path().filename().string().rfind(stem, 0) == 0 ? 1 : 0;
  }
  return count;
}

fs::path small_trace(const std::string& name, const std::string& extra = "") {
  const fs::path trace = scratch_dir() / name;
  if (!fs::exists(trace)) {
    REQUIRE(run("trace synth --model stories260K --prompt-tokens 32 --steps 64 " + extra +
                " --out " + quoted(trace))
                .exit_code == 0);
  }
  return trace;
}

std::string model() {
  return quoted(stories_dir() / "stories260K.bin");
}

}  // namespace

TEST_CASE("an input that never ends is refused after its size bound", "[cli][inputs]") {
  expect_one_line_error(run("config check /dev/zero"), 2, "larger than 256 MiB");
  expect_one_line_error(run("sim /dev/zero"), 2, "larger than 256 MiB");
  expect_one_line_error(run("validate /dev/zero"), 3, "larger than 256 MiB");
  expect_one_line_error(run("validate --published /dev/zero"), 3, "larger than 256 MiB");
  expect_one_line_error(run("live --model " + model() + " --policy full --prompt-file /dev/zero"),
                        3, "the prompt file is larger than 256 MiB");
  expect_one_line_error(run("trace info /dev/zero"), 3, "not a regular file");
}

TEST_CASE("an output that is also an input is refused before any work", "[cli][outputs]") {
  const fs::path trace = small_trace("input.h5");
  const std::string before = slurp(trace);
  // The same file under another name is the same file.
  const std::string same = quoted(scratch_dir() / "." / "input.h5");
  expect_one_line_error(
      run("replay run --trace " + quoted(trace) + " --policy h2o:budget=16 --out " + same), 2,
      "--out would overwrite the input");
  expect_one_line_error(run("trace convert " + quoted(trace) + " --out " + quoted(trace)), 2,
                        "--out would overwrite an input file");
  expect_one_line_error(run("replay search-budgets --traces " + quoted(trace) +
                            " --base-policy h2o --out " + quoted(trace)),
                        2, "--out would overwrite an input file");
  CHECK(slurp(trace) == before);

  const fs::path prompt = scratch_dir() / "prompt.txt";
  { std::ofstream(prompt) << "Once upon a time"; }
  expect_one_line_error(run("trace capture --model " + model() + " --prompt-file " +
                            quoted(prompt) + " --out " + quoted(prompt)),
                        2, "--out would overwrite an input file");
  expect_one_line_error(run("live --model " + model() + " --policy full --prompt-file " +
                            quoted(prompt) + " --max-new-tokens 2 --measure " + quoted(prompt)),
                        2, "--measure would overwrite an input file");
  expect_one_line_error(
      run("live --model " + model() + " --policy full --prompt x --measure " + model()), 2,
      "--measure would overwrite an input file");
  CHECK(slurp(prompt) == "Once upon a time");
}

TEST_CASE("the files a model is read from are inputs too, named or found", "[cli][outputs]") {
  // Copies, so that a failure destroys nothing shared.
  const fs::path folder = scratch_dir() / "model-inputs";
  fs::create_directories(folder);
  for (const char* name : {"stories260K.bin", "tok512.bin"}) {
    fs::copy_file(stories_dir() / name, folder / name, fs::copy_options::overwrite_existing);
  }
  const std::string checkpoint = quoted(folder / "stories260K.bin");
  const std::string tokenizer = slurp(folder / "tok512.bin");
  // The tokenizer found beside the checkpoint.
  expect_one_line_error(
      run("trace capture --model " + checkpoint + " --prompt x --max-new-tokens 2 --out " +
          quoted(folder / "tok512.bin")),
      2, "--out would overwrite an input file");
  expect_one_line_error(
      run("live --model " + checkpoint + " --policy full --prompt x --max-new-tokens 2 --measure " +
          quoted(folder / "tok512.bin")),
      2, "--measure would overwrite an input file");
  CHECK(slurp(folder / "tok512.bin") == tokenizer);
  // Any file of a model folder (refused before the model is read).
  const fs::path hf = scratch_dir() / "hf-inputs";
  fs::create_directories(hf);
  { std::ofstream(hf / "config.json") << "{}"; }
  expect_one_line_error(
      run("trace capture --model " + quoted(hf) + " --tokenizer " + quoted(folder / "tok512.bin") +
          " --prompt x --out " + quoted(hf / "config.json")),
      2, "--out would overwrite an input file");
  CHECK(slurp(hf / "config.json") == "{}");
}

TEST_CASE("an output name that is a device is refused, a link is written through",
          "[cli][outputs]") {
  const std::string synth = "trace synth --model stories260K --prompt-tokens 8 --steps 8 --out ";
  expect_one_line_error(run(synth + "/dev/null"), 2, "--out is not a regular file");
  const fs::path target = scratch_dir() / "link-target.h5";
  const fs::path link = scratch_dir() / "link.h5";
  fs::remove(target);
  fs::remove(link);
  { std::ofstream(target) << "old"; }
  fs::create_symlink(target.filename(), link);
  REQUIRE(run(synth + quoted(link)).exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(slurp(target) != "old");
  CHECK(run("trace validate " + quoted(target)).exit_code == 0);
  expect_one_line_error(run(synth + quoted(scratch_dir() / "link-target.h5" / "x.h5")), 2,
                        "is not a folder");
}

TEST_CASE("text that is not UTF-8 is recorded with replacement characters, and read back",
          "[cli][outputs]") {
  const fs::path trace = scratch_dir() / "latin1.h5";
  const fs::path measurement = scratch_dir() / "latin1.json";
  // "café" in Latin-1: the prompt is recorded in /meta's description and the measurement.
  REQUIRE(run("trace capture --model " + model() +
              " --prompt \"$(printf 'caf\\351')\" --max-new-tokens 2 --out " + quoted(trace))
              .exit_code == 0);
  const Result validated = run("trace validate " + quoted(trace));
  INFO(validated.err);
  CHECK(validated.exit_code == 0);
  CHECK_THAT(run("trace info --format json " + quoted(trace)).out,
             Catch::Contains("caf\xEF\xBF\xBD"));
  REQUIRE(run("live --model " + model() +
              " --policy full --prompt \"$(printf 'caf\\351')\" --max-new-tokens 2 --measure " +
              quoted(measurement))
              .exit_code == 0);
  CHECK_THAT(slurp(measurement), Catch::Contains("caf\xEF\xBF\xBD"));
  CHECK(run("validate " + quoted(measurement)).exit_code == 0);
}

TEST_CASE("empty and misplaced output names are refused before any work", "[cli][outputs]") {
  const fs::path folder = scratch_dir() / "a-folder";
  fs::create_directories(folder);
  const fs::path file = scratch_dir() / "a-file";
  { std::ofstream(file) << "x"; }
  const std::string synth = "trace synth --model stories260K --prompt-tokens 8 --steps 8 --out ";
  expect_one_line_error(run(synth + "''"), 2, "--out needs a file name");
  expect_one_line_error(run(synth + quoted(folder)), 2, "--out is a folder: name a file");
  expect_one_line_error(run("live --model " + model() + " --policy full --prompt x --measure ''"),
                        2, "--measure needs a file name");
  expect_one_line_error(
      run("live --model " + model() + " --policy full --prompt x --measure " + quoted(folder)), 2,
      "--measure is a folder");
  expect_one_line_error(run("sim --out ''"), 2, "--out needs a folder name");
  expect_one_line_error(run("sim --out " + quoted(file)), 2, "--out is a file: name a folder");
  expect_one_line_error(run("sim --cache-dir " + quoted(file)), 2, "--cache-dir is a file");
  CHECK(slurp(file) == "x");
}

TEST_CASE("a write that fails is one error line, not a crash, and leaves no file",
          "[cli][outputs]") {
  // A file size limit makes writes fail as a full disk does (EFBIG, the signal ignored). HDF5
  // used to crash at exit on the file whose close had failed.
  const std::string limit = "trap '' XFSZ; ulimit -f 16;";  // 8 KiB
  const fs::path trace = small_trace("heads.h5", "--heads");
  const fs::path folder = scratch_dir() / "limited";
  fs::create_directories(folder);
  const auto expect_failed_write = [&](const std::string& args, const std::string& stem) {
    const Result result = run(args, limit);
    INFO(args << "\nstderr: " << result.err);
    CHECK(result.exit_code == 1);
    CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(stem));
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(files_named(folder, stem) == 0);
  };
  expect_failed_write(
      "trace synth --model stories260K --prompt-tokens 64 --steps 400 --heads --out " +
          quoted(folder / "synth.h5"),
      "synth.h5");
  expect_failed_write(
      "trace convert " + quoted(trace) + " --deflate 0 --out " + quoted(folder / "convert.h5"),
      "convert.h5");
  expect_failed_write(
      "trace capture --model " + model() +
          " --prompt 'Once' --granularity mean,heads --max-new-tokens 200 --no-stop "
          "--out " +
          quoted(folder / "capture.h5"),
      "capture.h5");
}

TEST_CASE("a command stopped by SIGTERM or SIGHUP removes its temporary file", "[cli][outputs]") {
  for (const char* signal_name : {"TERM", "HUP"}) {
    CAPTURE(signal_name);
    const fs::path out = scratch_dir() / (std::string("stopped-") + signal_name + ".h5");
    // Waits until the trace's temporary exists (the writer has begun), then stops the command;
    // a trace this long takes minutes, so the signal comes first. The exit status is the
    // signal's, 128 + N, as without a handler.
    const fs::path script = scratch_dir() / "stop.sh";
    {
      std::ofstream(script) << "'" << kvtier::test::kvtier_binary()
                            << "' trace synth --model Llama-3.1-8B --prompt-tokens 512 --steps "
                               "50000 --heads --out '"
                            << out.string()
                            << "' >/dev/null 2>&1 &\n"
                               "pid=$!\n"
                               "for i in $(seq 600); do\n"
                               "  [ -e '"
                            << out.string()
                            << ".tmp.'$pid ] && break\n"
                               "  sleep 0.05\n"
                               "done\n"
                               "kill -"
                            << signal_name << " $pid\nwait $pid\n";
    }
    const int status = std::system(("bash " + quoted(script)).c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + (std::string(signal_name) == "TERM" ? 15 : 1));
    CHECK(files_named(scratch_dir(), out.filename().string()) == 0);
  }
}

TEST_CASE("sweep merge refuses to write into one of its inputs", "[cli][outputs][sweep]") {
  const fs::path spec =
      fs::path(kvtier::test::source_dir()) / "configs/sweeps/batch-x-model-h100.textproto";
  const fs::path shard = scratch_dir() / "merge-shard-0";
  REQUIRE(run("sweep " + quoted(spec) + " --shard 0/2 --out " + quoted(shard)).exit_code == 0);
  const std::string before = slurp(shard / "results.csv");
  expect_one_line_error(run("sweep merge " + quoted(shard) + " --out " + quoted(shard)), 2,
                        "--out is one of the folders being merged");
  CHECK(slurp(shard / "results.csv") == before);
}

TEST_CASE("a sweep removes the scratch folders of killed sweeps", "[cli][outputs][sweep]") {
  const fs::path spec =
      fs::path(kvtier::test::source_dir()) / "configs/sweeps/batch-x-model-h100.textproto";
  const fs::path out = scratch_dir() / "stale-scratch";
  // A process id above any kernel's limit is never alive.
  const fs::path stale = out / ".tmp" / "999999999-0";
  fs::create_directories(stale);
  { std::ofstream(stale / "0.csv.tmp") << "half a point"; }
  REQUIRE(run("sweep " + quoted(spec) + " --out " + quoted(out)).exit_code == 0);
  CHECK_FALSE(fs::exists(out / ".tmp"));
}
