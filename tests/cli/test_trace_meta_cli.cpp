// `kvtier trace meta` driven as a user (or scripts/capture_hf.py) would: the JSON it prints for
// a llama2.c checkpoint and for a Hugging Face directory holding only config.json, the same
// output for the same request, and bad requests failing with one line and the documented exit
// code (2 usage or options, 3 a model that cannot be read). tests/python checks that files
// written from its output validate and hold the same /meta as `trace capture`'s.

#include <catch2/catch.hpp>

#include <algorithm>
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

Result run(const std::string& args, const std::string& environment = "") {
  return kvtier::test::run_kvtier(args, environment);
}

fs::path stories() {
  return kvtier::test::stories_dir() / "stories260K.bin";
}

// `trace meta` of the stories260K checkpoint, P = 7, N = 20, + `args`.
std::string meta(const std::string& args) {
  return "trace meta --model " + quoted(stories()) + " --prompt-tokens 7 --steps 20 " + args;
}

// A Hugging Face model directory with config.json only (no weights).
fs::path hf_directory(const std::string& name, const std::string& architecture) {
  fs::path dir = scratch_dir() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"architectures": [")" << architecture
      << R"("], "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"})";
  return dir;
}

}  // namespace

TEST_CASE("kvtier trace meta help", "[cli][trace][meta]") {
  const Result help = run("trace meta --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: kvtier trace meta") &&
                           Catch::Contains("--granularity") && Catch::Contains("--tool"));
  CHECK_THAT(run("trace --help").out, Catch::Contains("trace meta"));
}

TEST_CASE("trace meta prints /meta, the attributes, the shape and the paths",
          "[cli][trace][meta]") {
  const std::string request = meta(
      "--granularity mean,heads --granularity topk:8 --window 3 --key-norms --dtype fp32 "
      "--temperature 0.5 --top-p 0.9 --top-k 40 --seed 7 --tool 'writer 1.0' "
      "--description 'a test'");
  const Result made = run(request, "SOURCE_DATE_EPOCH=0");
  INFO("stderr: " << made.err);
  REQUIRE(made.exit_code == 0);
  CHECK(made.err.empty());
  const std::string& out = made.out;
  CHECK_THAT(out, Catch::StartsWith("{\"message_type\": \"kvtier.config.TraceMeta\""));
  CHECK_THAT(out, Catch::Contains("\"meta_base64\": \""));
  // Root attributes: the writer's, with the tool as producer and the clock's time.
  CHECK_THAT(out, Catch::Contains(R"({"name": "format", "type": "string", "value": )"
                                  R"("kvtier-attention-trace"})"));
  CHECK_THAT(out, Catch::Contains(R"({"name": "version", "type": "uint32", "value": 1})"));
  CHECK_THAT(out, Catch::Contains(R"({"name": "producer", "type": "string", "value": )"
                                  R"("writer 1.0"})"));
  CHECK_THAT(out, Catch::Contains(R"({"name": "created", "type": "string", "value": )"
                                  R"("1970-01-01T00:00:00Z"})"));
  // /meta's mirrored attributes.
  for (const char* attribute :
       {R"({"name": "encoding", "type": "string", "value": "protobuf-binary"})",
        R"({"name": "model", "type": "string", "value": "stories260K"})",
        R"({"name": "num_hidden_layers", "type": "uint32", "value": 5})",
        R"({"name": "prompt_tokens", "type": "uint32", "value": 7})",
        R"({"name": "steps", "type": "uint32", "value": 20})",
        R"({"name": "attention_dtype", "type": "string", "value": "FP32"})",
        R"({"name": "top_k", "type": "uint32", "value": 8})",
        R"({"name": "prefill_window", "type": "uint32", "value": 3})",
        R"({"name": "source", "type": "string", "value": "SOURCE_CAPTURED"})",
        R"({"name": "source_tool", "type": "string", "value": "writer 1.0"})"}) {
    CHECK_THAT(out, Catch::Contains(attribute));
  }
  CHECK_THAT(out, Catch::Contains(R"({"name": "granularities", "type": "string", "value": )"
                                  R"("mean,heads,topk,prefill_window,key_norms"})"));
  CHECK_THAT(out, Catch::Contains(R"("shape": {"prompt_tokens": 7, "steps": 20, )"
                                  R"("first_layer": 0, "num_layers": 5, "heads": 8, )"
                                  R"("kv_heads": 4, "vocab_size": 512, "top_k": 8, )"
                                  R"("prefill_window": 3, "weight_type": "float32", )"
                                  R"("has_mean": true, "has_heads": true, "has_topk": true, )"
                                  R"("has_prefill": true, "has_key_norms": true})"));
  CHECK_THAT(out, Catch::Contains(R"("row_offsets": "/attention/row_offsets")") &&
                      Catch::Contains(R"("key_norms": "/keys/norm")") &&
                      Catch::Contains(R"("topk_indices": "/attention/topk/layer_004/indices")") &&
                      Catch::Contains(R"("prefill": "/prefill/window/layer_000")"));
  // The readable record: sampling (top-k included) and provenance.
  CHECK_THAT(out, Catch::Contains(R"("top_k":40)") && Catch::Contains(R"("seed":"7")") &&
                      Catch::Contains(R"("description":"a test")"));
  // The same request, the same output.
  CHECK(run(request, "SOURCE_DATE_EPOCH=0").out == out);
}

TEST_CASE("trace meta reads only config.json of a Hugging Face directory", "[cli][trace][meta]") {
  const fs::path dir = hf_directory("config-only", "Qwen2ForCausalLM");
  const std::string base = "trace meta --model " + quoted(dir) +
                           " --prompt-tokens 4 --steps 2 --granularity topk:4 --tool t";
  const Result made = run(base);
  INFO("stderr: " << made.err);
  REQUIRE(made.exit_code == 0);
  CHECK_THAT(made.out, Catch::Contains(R"({"name": "model", "type": "string", )"
                                       R"("value": "config-only"})") &&
                           Catch::Contains(R"("weight_dtype":"BF16")") &&
                           Catch::Contains(R"("architecture":"QWEN2")"));
  CHECK_THAT(made.out, !Catch::Contains("row_offsets"));  // top-k only: no dense rows
  const Result named = run(base + " --model-name Qwen2.5-0.5B");
  CHECK_THAT(named.out, Catch::Contains(R"("value": "Qwen2.5-0.5B"})"));
}

TEST_CASE("trace meta refuses bad requests with one line", "[cli][trace][meta]") {
  expect_one_line_error(run(meta("")), 2, "tool");
  expect_one_line_error(run(meta("--tool t --granularity heads")), 2, "mean or top-k");
  expect_one_line_error(run(meta("--tool t --granularity bogus")), 2, "bogus");
  expect_one_line_error(run(meta("--tool t --granularity topk:0")), 2, "topk:K");
  expect_one_line_error(run(meta("--tool t --window 8")), 2, "prefill window");
  expect_one_line_error(run(meta("--tool t --dtype bf16")), 2, "--dtype");
  expect_one_line_error(run(meta("--tool t --temperature -1")), 2, "temperature");
  expect_one_line_error(run(meta("--tool t --top-p 0")), 2, "top_p");
  expect_one_line_error(run(meta("--tool ''")), 2, "--tool");
  expect_one_line_error(run(meta("--tool t --frobnicate")), 2, "frobnicate");
  expect_one_line_error(
      run("trace meta --model " + quoted(stories()) + " --prompt-tokens 0 --steps 3 --tool t"), 2,
      "--prompt-tokens");
  expect_one_line_error(run("trace meta --model " + quoted(stories()) +
                            " --prompt-tokens 4000000000 --steps 3 --tool t"),
                        2, "2^31");

  // Models that cannot be read: exit 3, naming the file.
  const fs::path missing = scratch_dir() / "no-such-model.bin";
  expect_one_line_error(
      run("trace meta --model " + quoted(missing) + " --prompt-tokens 4 --steps 2 --tool t"), 3,
      missing.string());
  const fs::path truncated = scratch_dir() / "truncated.bin";
  std::ofstream(truncated) << "short";
  expect_one_line_error(
      run("trace meta --model " + quoted(truncated) + " --prompt-tokens 4 --steps 2 --tool t"), 3,
      "header");
  const fs::path gpt2 = hf_directory("gpt2-like", "GPT2LMHeadModel");
  expect_one_line_error(
      run("trace meta --model " + quoted(gpt2) + " --prompt-tokens 4 --steps 2 --tool t"), 3,
      "GPT2LMHeadModel");
  const fs::path empty = scratch_dir() / "empty-dir";
  fs::create_directories(empty);
  expect_one_line_error(
      run("trace meta --model " + quoted(empty) + " --prompt-tokens 4 --steps 2 --tool t"), 3,
      "config.json");
}
