// `kvtier trace capture` driven as a user would, on the stories260K fixture: the trace's tokens
// are the golden greedy text, the file validates, stop tokens end it, the same command gives
// the same bytes, and bad requests fail with one line and the documented exit code, leaving no
// file behind.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>

#include "kernels/device_info.hpp"
#include "kernels/tokenizer.hpp"
#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"
#include "traces/reader.hpp"

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

// `trace capture --model stories260K.bin` (its tok512.bin is found beside it) + `args`.
std::string capture(const std::string& args) {
  return "trace capture --model " + quoted(stories_dir() / "stories260K.bin") + " " + args;
}

// No trace and no temporary file of one in the scratch folder for `name`.
void expect_no_output(const std::string& name) {
  CHECK_FALSE(fs::exists(scratch_dir() / name));
  for (const auto& entry : fs::directory_iterator(scratch_dir())) {
    CHECK(entry.path().filename().string().rfind(name + ".tmp.", 0) != 0);
  }
}

}  // namespace

TEST_CASE("kvtier trace capture help", "[cli][trace][capture]") {
  const Result help = run("trace capture --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: kvtier trace capture") &&
                           Catch::Contains("--granularity") && Catch::Contains("--no-stop"));
  CHECK_THAT(run("trace --help").out, Catch::Contains("trace capture"));
}

TEST_CASE("a capture from BOS holds the golden greedy tokens and validates",
          "[cli][trace][capture]") {
  const fs::path out = scratch_dir() / "golden.h5";
  // The golden text is 60 greedy tokens after BOS; run.c's stop tokens do not come before.
  const Result made =
      run(capture("--prompt '' --max-new-tokens 60 --granularity mean,topk:8 "
                  "--granularity heads --window 1 --key-norms --out " +
                  quoted(out)));
  INFO("stderr: " << made.err);
  REQUIRE(made.exit_code == 0);
  CHECK(made.out == "wrote " + out.string() + " (1 prompt tokens, 60 decode steps)\n");
  CHECK(made.err.empty());  // no progress line: stderr is not a terminal
  {
    const kvtier::traces::TraceReader reader(out);
    const std::vector<std::int32_t> tokens = reader.read_tokens();
    REQUIRE(tokens.size() == 61);
    CHECK(tokens.front() == 1);  // BOS
    const auto tokenizer = kvtier::kernels::load_tokenizer(stories_dir() / "tok512.bin");
    const std::string text =
        tokenizer->decode(std::span<const std::int32_t>(tokens).subspan(1)) + "\n";
    CHECK(text == slurp(stories_dir() / "golden_t0_n60.txt"));
    const kvtier::config::TraceMeta& meta = reader.meta();
    CHECK(meta.source().kind() == kvtier::config::SOURCE_CAPTURED);
    CHECK_THAT(meta.source().tool(),
               Catch::StartsWith("kvtier ") && Catch::EndsWith(" trace capture"));
    CHECK_THAT(meta.source().description(), Catch::Contains("--max-new-tokens 60") &&
                                                Catch::Contains("prompt: 1 tokens from --prompt") &&
                                                !Catch::Contains(out.string()));
    CHECK(meta.model().name() == "stories260K");
    CHECK(meta.sampling().temperature() == 0.0);
    CHECK(meta.sampling().seed() == 1);
    CHECK(meta.top_k() == 8);
    CHECK(meta.prefill_window() == 1);
  }
  const Result valid = run("trace validate " + quoted(out));
  CHECK(valid.exit_code == 0);
  CHECK_THAT(valid.out, Catch::Contains("valid"));
  const Result info = run("trace info " + quoted(out));
  CHECK(info.exit_code == 0);
  CHECK_THAT(info.out, Catch::Contains("SOURCE_CAPTURED") &&
                           Catch::Contains("mean, heads, topk (k=8), prefill_window (w=1), "
                                           "key_norms"));
}

TEST_CASE("a stop token ends the capture, --no-stop runs every step", "[cli][trace][capture]") {
  const fs::path stopped = scratch_dir() / "stopped.h5";
  const std::string prompt = "--prompt 'Once upon a time' --max-new-tokens 500 ";
  const Result made = run(capture(prompt + "--out " + quoted(stopped)));
  REQUIRE(made.exit_code == 0);
  CHECK_THAT(made.out, Catch::EndsWith("decode steps, ended by a stop token)\n"));
  {
    const kvtier::traces::TraceReader reader(stopped);
    const std::vector<std::int32_t> tokens = reader.read_tokens();
    CHECK(reader.shape().steps < 500);
    CHECK(tokens.size() == reader.shape().prompt_tokens + reader.shape().steps);
    // The stop token (llama2.c models end a story with BOS) is the last step's token.
    CHECK((tokens.back() == 1 || tokens.back() == 2));
    CHECK(std::count_if(tokens.begin() + 1, tokens.end() - 1,
                        [](std::int32_t t) { return t == 1 || t == 2; }) == 0);
  }
  CHECK(run("trace validate " + quoted(stopped)).exit_code == 0);

  const fs::path all = scratch_dir() / "all_steps.h5";
  const Result full = run(capture(prompt + "--no-stop --out " + quoted(all)));
  REQUIRE(full.exit_code == 0);
  CHECK(full.out == "wrote " + all.string() + " (5 prompt tokens, 500 decode steps)\n");
  CHECK(run("trace validate " + quoted(all)).exit_code == 0);
}

TEST_CASE("the same capture gives the same bytes", "[cli][trace][capture]") {
  const std::string args =
      "--prompt 'The cat' --max-new-tokens 40 --temperature 0.8 --top-p 0.9 "
      "--seed 7 --granularity topk:4 --key-norms --out ";
  const fs::path a = scratch_dir() / "same_a.h5";
  const fs::path b = scratch_dir() / "same_b.h5";
  REQUIRE(run(capture(args + quoted(a)), "SOURCE_DATE_EPOCH=0").exit_code == 0);
  REQUIRE(run(capture(args + quoted(b)), "SOURCE_DATE_EPOCH=0").exit_code == 0);
  CHECK(slurp(a) == slurp(b));
  const fs::path c = scratch_dir() / "same_c.h5";
  REQUIRE(run(capture("--prompt 'The cat' --max-new-tokens 40 --temperature 0.8 --top-p 0.9 "
                      "--seed 8 --granularity topk:4 --key-norms --out " +
                      quoted(c)),
              "SOURCE_DATE_EPOCH=0")
              .exit_code == 0);
  CHECK(slurp(a) != slurp(c));  // another seed samples other tokens
  // More engine threads: the same file, byte for byte (/meta's command line leaves --threads
  // out, as it leaves out --out), so demand caches keyed by its content hash are shared.
  const fs::path threaded = scratch_dir() / "same_threads.h5";
  REQUIRE(run(capture("--threads 3 " + args + quoted(threaded)), "SOURCE_DATE_EPOCH=0").exit_code ==
          0);
  CHECK(slurp(a) == slurp(threaded));
  const kvtier::traces::TraceReader one(a);
  const kvtier::traces::TraceReader three(threaded);
  CHECK(one.read_tokens() == three.read_tokens());
  for (std::uint32_t layer = 0; layer < 5; ++layer) {
    CHECK(one.read_key_norms(layer) == three.read_key_norms(layer));
  }
}

TEST_CASE("the tokenizer beside a checkpoint, or --tokenizer", "[cli][trace][capture]") {
  // A checkpoint alone in a folder: no tokenizer to find.
  const fs::path folder = scratch_dir() / "lonely";
  fs::create_directories(folder);
  const fs::path model = folder / "model.bin";
  if (!fs::exists(model)) {
    fs::create_symlink(fs::absolute(stories_dir() / "stories260K.bin"), model);
  }
  const std::string base = "trace capture --model " + quoted(model) + " --prompt 'Hi' ";
  expect_one_line_error(run(base + "--out " + quoted(scratch_dir() / "lonely.h5")), 2,
                        "--tokenizer");
  expect_no_output("lonely.h5");
  const Result named = run(base + "--tokenizer " + quoted(stories_dir() / "tok512.bin") +
                           " --max-new-tokens 3 --out " + quoted(scratch_dir() / "named.h5"));
  CHECK(named.exit_code == 0);
}

TEST_CASE("bad capture requests: one line, the documented exit code, no file",
          "[cli][trace][capture]") {
  const std::string out = " --out " + quoted(scratch_dir() / "bad.h5");
  // A prompt of more tokens than the model has positions (512).
  const fs::path long_prompt = scratch_dir() / "long_prompt.txt";
  {
    std::ofstream text(long_prompt);
    for (int i = 0; i < 300; ++i) {
      text << "Once upon a time ";
    }
  }
  struct Case {
    std::string args;
    int exit_code;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"trace capture --model /nonexistent/model.bin --prompt x" + out, 3, "no model checkpoint"},
      {capture("--prompt-file " + quoted(long_prompt) + out), 3, "no position for a decode step"},
      {capture("--prompt-file /nonexistent/prompt.txt" + out), 3, "cannot read the prompt file"},
      {capture("--prompt x --max-new-tokens 600" + out), 2, "at most 509 fit"},
      {capture("--prompt x --max-new-tokens 0" + out), 2, "--max-new-tokens"},
      {capture("--prompt x --granularity mean,foo" + out), 2, "unknown --granularity 'foo'"},
      {capture("--prompt x --granularity topk:x" + out), 2, "topk:K"},
      {capture("--prompt x --granularity topk:4,topk:8" + out), 2, "two different top-k"},
      {capture("--prompt x --granularity heads" + out), 2, "mean or top-k rows"},
      {capture("--prompt x --window 9" + out), 2, "longer than the 3-token prompt"},
      {capture("--prompt x --device tpu" + out), 2, "unknown --device 'tpu'"},
      {capture("--prompt x --cuda-attention split-keys" + out), 2, "applies to --device cuda"},
      {capture("--prompt x --device cuda --cuda-attention flash" + out), 2,
       "one of split-keys, per-head, not 'flash'"},
      {capture("--prompt x --cuda-gemm warp-rows" + out), 2, "applies to --device cuda"},
      {capture("--prompt x --device cuda --cuda-gemm cutlass" + out), 2,
       "one of warp-rows, cublas, not 'cutlass'"},
      {capture("--prompt x --cuda-fusion on" + out), 2, "applies to --device cuda"},
      {capture("--prompt x --device cuda --cuda-fusion yes" + out), 2, "one of off, on, not 'yes'"},
      {capture("--prompt x --dtype fp8" + out), 2, "--dtype"},
      {capture("--prompt x --temperature -1" + out), 2, "temperature"},
      {capture("--prompt x --top-p 0" + out), 2, "top_p"},
      {capture("--prompt x --prompt-file " + quoted(long_prompt) + out), 2, "exactly one"},
      {capture(out), 2, "exactly one"},
      {capture("--prompt x"), 2, "--out"},
      {capture("--prompt x --deflate 12" + out), 2, "--deflate"},
      {capture("--prompt x --granularity topk:2000000" + out), 2, "at most 1048576"},
      {capture("--prompt x --threads 0" + out), 2, "--threads 0: from 1 to 1024"},
      {capture("--prompt x --device cuda --threads 2" + out), 2, "applies to --device cpu"},
      {capture("--prompt-file " + quoted(scratch_dir()) + out), 3, "names a folder"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    expect_one_line_error(run(c.args), c.exit_code, c.text);
  }
  expect_no_output("bad.h5");
}

// (A test name must not start with "--": CTest passes it to Catch as an argument.)
TEST_CASE("capture on --device cuda runs with a CUDA build and a GPU, else fails with one line",
          "[cli][trace][capture]") {
  const fs::path out = scratch_dir() / "cuda.h5";
  const Result result =
      run(capture("--prompt x --max-new-tokens 8 --device cuda --out " + quoted(out)));
  // The kvtier binary is of this build, so it sees the same devices as this test.
  std::string status;
  const bool built = kvtier::kernels::built_with_cuda();
  if (built && !kvtier::kernels::cuda_devices(status).empty()) {
    INFO("stderr: " << result.err);
    REQUIRE(result.exit_code == 0);
    CHECK_THAT(result.out, Catch::StartsWith("wrote " + out.string()));
    CHECK(run("trace validate " + quoted(out)).exit_code == 0);
    return;
  }
  INFO("CUDA build: " << built << ", devices: " << status);
  // apps/cmd_trace.cpp and docs/ENGINE.md: refused before the model is loaded, exit 2.
  expect_one_line_error(result, 2,
                        built ? "the CUDA engine is not available: "
                              : "the CUDA engine is not available in this build");
  CHECK_THAT(result.err, Catch::Contains("use --device cpu"));
  expect_no_output("cuda.h5");
}

TEST_CASE("progress goes to a terminal only", "[cli][trace][capture]") {
  // script(1) gives the command a terminal; without it there is nothing to check here.
  if (!fs::exists("/usr/bin/script")) {
    WARN("script(1) not found: progress on a terminal not checked");
    return;
  }
  const fs::path out = scratch_dir() / "progress.h5";
  const fs::path log = scratch_dir() / "terminal.txt";
  const std::string command =
      std::string(kvtier::test::kvtier_binary()) + " " +
      capture("--prompt 'Once upon a time' --max-new-tokens 100 --out " + quoted(out));
  // script runs `command` through a shell: quote it once more for that.
  std::string escaped;
  for (const char c : command) {
    escaped += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  const std::string line =
      "script -qec '" + escaped + "' /dev/null > " + quoted(log) + " 2>&1 </dev/null";
  REQUIRE(std::system(line.c_str()) == 0);
  const std::string terminal = slurp(log);
  CHECK_THAT(terminal, Catch::Contains("kvtier: generating ") &&
                           Catch::Contains("kvtier: tracing ") && Catch::Contains("tokens/s") &&
                           Catch::Contains("MiB") && Catch::Contains("wrote "));
  // The progress line is ended before the result is printed.
  CHECK(terminal.find("\nwrote ") != std::string::npos);
}
