// Drives the kvtier binary as a user would: output on stdout, one-line diagnostics on stderr,
// documented exit codes.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"
#include "tests/support/small_run.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

fs::path write_file(const std::string& name, const std::string& content) {
  const fs::path path = scratch_dir() / name;
  std::ofstream(path) << content;
  return path;
}

int count_lines(const std::string& text) {
  int lines = 0;
  for (const char c : text) {
    lines += c == '\n' ? 1 : 0;
  }
  return lines;
}

const std::string kRun = kvtier::test::small_run_text();

// kRun's requests arriving open-loop: 600 Poisson arrivals at 4/s.
std::string open_loop_run() {
  std::string text = kRun;
  const auto begin = text.find("closed_loop");
  text.replace(begin, text.find("max_batch_size") - begin,
               "poisson { rate_per_s: 4 num_requests: 600 prompt_tokens { fixed_tokens: 512 } "
               "output_tokens { fixed_tokens: 64 } }\n  ");
  return text;
}

// Every failure: exit 2, nothing on stdout, each stderr line a complete diagnostic.
void expect_config_error(const Result& result, const std::string& fragment) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.out.empty());
  CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(fragment));
  std::istringstream lines(result.err);
  for (std::string line; std::getline(lines, line);) {
    CHECK_THAT(line, Catch::StartsWith("kvtier: error: "));
  }
}

}  // namespace

TEST_CASE("kvtier --version and --help", "[cli]") {
  const Result version = run("--version");
  CHECK(version.exit_code == 0);
  CHECK_THAT(version.out, Catch::StartsWith("kvtier 0.1.0 (commit "));
  const Result help = run("--help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("presets") && Catch::Contains("config") &&
                           Catch::Contains("exit codes"));
  for (const char* command : {"presets --help", "presets list --help", "presets show --help",
                              "config --help", "config check --help", "devices --help"}) {
    INFO(command);
    const Result sub = run(command);
    CHECK(sub.exit_code == 0);
    CHECK_THAT(sub.out, Catch::Contains("usage: kvtier"));
  }
}

TEST_CASE("presets list prints a table or JSON, filtered by kind", "[cli]") {
  const Result all = run("presets list");
  CHECK(all.exit_code == 0);
  CHECK(count_lines(all.out) == 58);  // header + 57 presets
  const Result gpus = run("presets list --kind gpu");
  CHECK(count_lines(gpus.out) == 13);
  CHECK_THAT(gpus.out, Catch::Contains("H200") && !Catch::Contains("Llama"));
  const Result json = run("presets list --kind model --format json");
  CHECK(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::StartsWith("[{\"kind\": \"model\"") &&
                           Catch::Contains("\"name\": \"Qwen3-8B\""));
  expect_config_error(run("presets list --kind cpu"), "unknown --kind 'cpu'");
  expect_config_error(run("presets list --format yaml"), "unknown --format 'yaml'");
}

TEST_CASE("presets show resolves values and derives quantities", "[cli]") {
  const Result text = run("presets show Llama-3.1-8B");
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("configs/models/Llama-3.1-8B.textproto") &&
                           Catch::Contains("parameters") && Catch::Contains("8030261248") &&
                           Catch::Contains("kv_bytes_per_token"));
  const Result json = run("presets show hgx-h100-8 --format json");
  CHECK(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::Contains("\"spec\": {") && Catch::Contains("\"name\":\"H100-SXM\"") &&
                           Catch::Contains("\"gpu_memory_total\": 636.8"));  // 8 x 79.6 GiB
  const Result overridden = run("presets show H100-SXM --set memory_capacity=40GiB --format json");
  CHECK_THAT(overridden.out, Catch::Contains("\"memory_capacity_gib\":40"));
  // DeepSeek-V3's first dense layers: latent attention (187,107,328), a dense MLP of 18,432
  // (396,361,728) and two norms (14,336).
  const Result deepseek = run("presets show DeepSeek-V3");
  CHECK(deepseek.exit_code == 0);
  // (A line search: std::regex's recursion over the whole output overflows the stack under
  // AddressSanitizer.)
  const auto row = deepseek.out.find("\nparameters_per_dense_layer ");
  REQUIRE(row != std::string::npos);
  const std::string line = deepseek.out.substr(row + 1, deepseek.out.find('\n', row + 1) - row - 1);
  CHECK_THAT(line, Catch::EndsWith(" 583483392"));
  // Gemma 3 27B: 10 of its 62 layers attend globally, 8,192 bytes of KV a layer and token.
  const Result gemma = run("presets show Gemma-3-27B --format json");
  CHECK(gemma.exit_code == 0);
  CHECK_THAT(gemma.out, Catch::Contains("\"global_attention_layers\": 10") &&
                            Catch::Contains("\"kv_bytes_per_token_past_window\": 81920"));
  // Split by requests, a GPU keeps the attention weights whole and 1/8 of the latents.
  const Result split =
      run("config check configs/examples/deepseek-v3-attention.textproto --set "
          "engine.data_parallel_attention=true");
  CHECK(split.exit_code == 0);
  CHECK_THAT(split.out, Catch::Contains("weights_per_gpu                          89.232") &&
                            Catch::Contains("kv_bytes_per_token_per_gpu               8784.0") &&
                            Catch::Contains("kv_tokens_that_fit_per_gpu               736004"));
  // Data-parallel attention does not model a prefix cache per GPU: refused, naming the field.
  expect_config_error(
      run("config check configs/examples/disaggregated-prefill-decode.textproto --set "
          "model.preset=DeepSeek-V2-Lite --set memory.prefix_caching=true --set "
          "memory.kv_block_tokens=16 --set engine.data_parallel_attention=true"),
      "data-parallel attention with memory.prefix_caching is not modelled");
  expect_config_error(run("presets show H300"), "unknown preset 'H300'");
  expect_config_error(run("presets show H100-SXM --kind model"), "unknown model preset 'H100-SXM'");
  expect_config_error(run("presets show"), "name");
}

TEST_CASE("config check accepts the shipped examples", "[cli]") {
  std::vector<fs::path> files;
  for (const char* folder : {"configs/examples", "configs/sweeps"}) {
    for (const auto& entry :
         fs::directory_iterator(fs::path(kvtier::test::source_dir()) / folder)) {
      if (entry.path().extension() == ".textproto") {
        files.push_back(entry.path());
      }
    }
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 11);
  for (const fs::path& file : files) {
    INFO(file.string());
    const Result result = run("config check '" + file.string() + "'");
    CHECK(result.exit_code == 0);
    CHECK(result.err.empty());
    CHECK_THAT(result.out, Catch::Contains(": valid "));
  }
  const Result json = run(std::string("config check '") + kvtier::test::source_dir() +
                          "/configs/examples/quickstart.textproto' --format json");
  CHECK_THAT(json.out, Catch::Contains("\"valid\": true") &&
                           Catch::Contains("\"kv_tokens_that_fit_per_gpu\""));
  CHECK_THAT(json.out, !Catch::Contains("kv_blocks_that_fit_per_gpu"));
  // Paged: the tokens of the whole blocks that fit. 61.642 GiB at 128 KiB a token is 504,975
  // tokens, 31,560 whole 16-token blocks.
  const Result paged =
      run(std::string("config check '") + kvtier::test::source_dir() +
          "/configs/examples/quickstart.textproto' --set memory.kv_block_tokens=16 --format json");
  CHECK_THAT(paged.out, Catch::Contains("\"kv_tokens_that_fit_per_gpu\": 504960,") &&
                            Catch::Contains("\"kv_blocks_that_fit_per_gpu\": 31560,"));
  CHECK_THAT(json.out, Catch::Contains("\"kv_tokens_that_fit_per_gpu\": 504975,"));
  CHECK_THAT(json.out, !Catch::Contains("expert_rows_over_mean_at_max_batch"));
  // Expert parallelism: DeepSeek-V3's 256 experts, 32 on each of 8 GPUs; the busiest takes
  // more than the mean share of a full batch's rows under random group-limited routing (1.062
  // without its groups), or what is stated.
  const std::string deepseek = std::string("config check '") + kvtier::test::source_dir() +
                               "/configs/examples/deepseek-v3-attention.textproto' "
                               "--set engine.expert_parallel=true --format json";
  const Result experts = run(deepseek);
  CHECK_THAT(experts.out, Catch::Contains("\"routed_experts_on_busiest_gpu\": 32,") &&
                              Catch::Contains("\"expert_rows_over_mean_at_max_batch\": 1.0879"));
  const Result stated = run(deepseek + " --set engine.expert_load_imbalance=1.25");
  CHECK_THAT(stated.out, Catch::Contains("\"expert_rows_over_mean_at_max_batch\": 1.25"));
}

TEST_CASE("config check: each class of bad config gives its message and exit 2", "[cli]") {
  SECTION("unknown field") {
    const auto path = write_file("unknown.textproto", kRun + "policy_extra {\n  colour: 3\n}\n");
    expect_config_error(run("config check " + path.string()),
                        "unknown field 'policy_extra' in RunSpec");
    CHECK_THAT(run("config check " + path.string()).err,
               Catch::Contains("unknown.textproto:14:1, field policy_extra"));
    std::string nested = kRun;
    nested.replace(nested.find("model {"), 7, "model {\n  colour: 3");
    const auto nested_path = write_file("nested.textproto", nested);
    CHECK_THAT(run("config check " + nested_path.string()).err,
               Catch::Contains("unknown field 'colour' in ModelSpec") &&
                   Catch::Contains("nested.textproto:3:3, field model.colour"));
  }
  SECTION("JSON that protobuf cannot read, and a folder") {
    // Protobuf's three-line message (text snippet, caret) becomes one line with the position.
    const auto huge = write_file("huge.json", "{\n  \"seed\": 4501e999, \"model\": {}\n}\n");
    expect_config_error(run("config check " + huge.string()),
                        "Number exceeds the range of double. (" + huge.string() + ":2:11)");
    const auto token = write_file("token.json", "# comment\n{\n  \"seed\": z89\n}\n");
    expect_config_error(run("config check " + token.string()), token.string() + ":3:11)");
    // A folder read as an empty file gave eight "missing required field" lines.
    expect_config_error(run("config check " + scratch_dir().string()), "a folder, not a config");
    expect_config_error(run("sim " + scratch_dir().string()), "a folder, not a config");
    // Binary data (an HDF5 file's signature) is refused at its first byte, not parsed.
    const auto binary = write_file("binary.textproto", std::string("\x89HDF\r\n\x1a\n\0\0", 10));
    expect_config_error(
        run("config check " + binary.string()),
        "not a text or JSON config: byte 0 is not UTF-8 text (" + binary.string() + ":1:1)");
    // Columns in bytes from the line's start; a byte order mark, and any byte but NUL in a
    // comment, are no more the config's than the parser's.
    const auto stray = write_file("stray.textproto", "seed: 7\n\t\t\xff\n");
    expect_config_error(run("config check " + stray.string()),
                        "byte 10 is not UTF-8 text (" + stray.string() + ":2:3)");
    CHECK(run("config check " + write_file("bom.textproto", "\xEF\xBB\xBF" + kRun).string())
              .exit_code == 0);
    CHECK(run("config check " +
              write_file("latin1.textproto", kRun + "# caf\xe9 (Latin-1)\n").string())
              .exit_code == 0);
  }
  SECTION("a policy axis sweep would refuse") {
    // configs/ leaves a sweep's policy strings to sweep/, which config check asks too.
    const std::string sweep = std::string("config check '") + kvtier::test::source_dir() +
                              "/configs/sweeps/kimi-k2-one-node.textproto'";
    CHECK(run(sweep).exit_code == 0);
    expect_config_error(run(sweep + " --set 'axis[2].values[1]=tiered:hbmm=0.5'"),
                        "policy axis value 'tiered:hbmm=0.5'");
  }
  SECTION("a policy sim would refuse") {
    const std::string tiered =
        std::string("config check '") + kvtier::test::source_dir() +
        "/configs/examples/llama70b-tp4-tiered.textproto' --set policy.name=nosuch";
    expect_config_error(run(tiered), "unknown policy 'nosuch'");
    CHECK_THAT(run(tiered).err, Catch::Contains("(--set policy.name=nosuch, field policy)"));
    // A parameter in the file: its line and column, and which compared policy; sim and plan
    // refuse it the same way before running, and name --policy when that set it.
    // kRun comparing `full` with `tiered` given `param`.
    const auto compared = [](const std::string& name, const std::string& param) {
      std::string text = kRun;
      text.replace(text.find("policy {"), 8,
                   "compare { name: \"full\" }\ncompare { name: \"tiered\"\n  param { " + param +
                       " } }\ntiering { synthetic_pattern: \"reasoning\" "
                       "prefetch_lookahead_layers: 1 host_allocation: PINNED copy_method: "
                       "COPY_ENGINES }\npolicy {");
      return write_file(name, text);
    };
    const auto path = compared("bogus-param.textproto", "name: \"bogus\" number: 1");
    for (const char* command : {"config check ", "sim ", "plan --slo tpot_p99=50ms "}) {
      const Result bogus = run(command + path.string());
      expect_config_error(bogus, "policy tiered has no parameter 'bogus'");
      CHECK_THAT(bogus.err, Catch::Contains("bogus-param.textproto:") &&
                                Catch::Contains(", field compare[1])"));
    }
    expect_config_error(run("sim " + path.string() + " --policy tiered:bogus=1"), "(--policy)");
    // A value out of range: the value's own line, or the option or --set that wrote it, and
    // which policy and parameter it is.
    const auto range = compared("range-param.textproto", "name: \"hbm\" number: 7");
    const Result out_of_range = run("config check " + range.string());
    expect_config_error(out_of_range, "value 7 is out of range [0, 1] (");
    CHECK_THAT(out_of_range.err,
               Catch::Contains("range-param.textproto:") &&
                   Catch::Contains(", field compare[1].param[0].number, policy tiered, "
                                   "parameter hbm)"));
    expect_config_error(run("sim " + path.string() + " --policy tiered:hbm=2"),
                        "value 2 is out of range [0, 1] (--policy, policy tiered, parameter hbm)");
    expect_config_error(
        run("config check " + range.string() + " --set 'compare[1].param[0].number=3'"),
        "(--set compare[1].param[0].number=3, field compare[1].param[0].number, policy tiered, "
        "parameter hbm)");
    // Values that are wrong together, and need no trace to say so, are refused by the check
    // too, at their place.
    expect_config_error(run("config check " + range.string() +
                            " --set compare[1].name=h2o --set 'compare[1].param[0].name=budgets'"
                            " --set 'compare[1].param[0].text=64/128'"),
                        "budgets needs allocation=explicit (allocation is uniform) (--set "
                        "compare[1].param[0].text=64/128, field compare[1].param[0].text, policy "
                        "h2o, parameter budgets)");
    expect_config_error(run("sim " + range.string() + " --policy monarch:window=100000"),
                        "does not fit in max_hot 768 rounded up to pages (--policy, policy "
                        "monarch, parameter window)");
  }
  SECTION("missing required field") {
    std::string text = kRun;
    text.erase(text.find("seed: 7"));
    const auto path = write_file("missing.textproto", text);
    expect_config_error(run("config check " + path.string()), "missing.textproto, field seed)");
  }
  SECTION("wrong type") {
    std::string text = kRun;
    text.replace(text.find("tensor_parallel_degree: 1"), 25, "tensor_parallel_degree: \"two\"");
    const auto path = write_file("type.textproto", text);
    expect_config_error(run("config check " + path.string()),
                        "type.textproto:3:25, field tensor_parallel_degree");
  }
  SECTION("value out of range") {
    std::string text = kRun;
    text.replace(text.find("runtime_reserve_gib: 2"), 22, "runtime_reserve_gib: -2");
    const auto path = write_file("range.textproto", text);
    expect_config_error(run("config check " + path.string()),
                        "value -2 GiB is out of range: expected >= 0 GiB (");
  }
  SECTION("kv_heads not dividing heads") {
    std::string text = kRun;
    text.replace(text.find("model {"), 7, "model { num_key_value_heads: 6");
    const auto path = write_file("gqa.textproto", text);
    expect_config_error(run("config check " + path.string()),
                        "num_key_value_heads 6 does not divide num_attention_heads 32");
  }
  SECTION("a non-positive head_dim") {
    std::string text = kRun;
    text.replace(text.find("model {"), 7, "model { head_dim: 0");
    const auto path = write_file("hd.textproto", text);
    expect_config_error(run("config check " + path.string()), "head_dim");
  }
  SECTION("TP degree not dividing KV heads") {
    const auto path = write_file("tp.textproto", kRun);
    expect_config_error(run("config check " + path.string() + " --set tensor_parallel_degree=3"),
                        "tensor_parallel_degree 3 neither divides the model's 8 KV heads nor is a "
                        "multiple of them");
  }
  SECTION("a group over nodes without the network between them") {
    const auto path = write_file("nodes.textproto", kRun);
    expect_config_error(run("config check " + path.string() +
                            " --set tensor_parallel_degree=16 --set hardware.num_nodes=2"),
                        "spans 2 nodes of 8 GPUs: give the network between them");
  }
  SECTION("expert parallelism without a mixture of experts") {
    const auto path = write_file("ep.textproto", kRun);
    expect_config_error(run("config check " + path.string() + " --set engine.expert_parallel=true"),
                        "expert parallelism needs a mixture of experts (model.moe)");
  }
  SECTION("a dtype the GPU cannot run") {
    std::string text = kRun;
    text.replace(text.find("hgx-h100-8"), 10, "dgx-a100-8");
    text.replace(text.find("model {"), 7,
                 "model { activation_dtype: FP8_E4M3 weight_dtype: FP8_E4M3");
    const auto path = write_file("dtype.textproto", text);
    expect_config_error(run("config check " + path.string()), "cannot run FP8_E4M3");
  }
  SECTION("JSON with an unknown field") {
    const auto path = write_file("bad.json", "{\n  \"seed\": 1,\n  \"modle\": {}\n}\n");
    expect_config_error(run("config check " + path.string()), "unknown field 'modle'");
  }
  SECTION("JSON positions") {
    const auto path = write_file("pos.json", "{\n  \"seed\": 1,\n  \"modle\": {}\n}\n");
    CHECK_THAT(run("config check " + path.string()).err,
               Catch::Contains("pos.json:3:3, field modle)"));
  }
  SECTION("several problems, one line each") {
    std::string text = kRun;
    text.replace(text.find("model {"), 7, "model { num_key_value_heads: 6");
    text.replace(text.find("runtime_reserve_gib: 2"), 22, "runtime_reserve_gib: -2");
    const auto path = write_file("many.textproto", text);
    const Result result = run("config check " + path.string());
    CHECK(result.exit_code == 2);
    CHECK(count_lines(result.err) >= 2);
  }
  SECTION("unreadable file") {
    expect_config_error(run("config check /nonexistent.textproto"), "cannot open config file");
  }
}

TEST_CASE("overrides reject malformed and wrong-dimension values", "[cli]") {
  const auto path = write_file("run.textproto", kRun);
  expect_config_error(
      run("config check " + path.string() + " --set hardware.node.gpu.memory_capacity=80"),
      "needs a unit");
  expect_config_error(
      run("config check " + path.string() + " --set hardware.node.gpu.memory_capacity=4.8TB/s"),
      "is a bandwidth");
  expect_config_error(
      run("config check " + path.string() + " --set hardware.node.gpu.memory_capacity=lots"),
      "is not a number");
  expect_config_error(run("config check " + path.string() + " --set seed"), "expected PATH=VALUE");
  const Result ok = run("config check " + path.string() +
                        " --set hardware.node.gpu.memory_capacity=40GiB --format json");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Contains("\"memory_capacity_gib\":40"));
}

TEST_CASE("usage errors exit 2 with one line", "[cli]") {
  expect_config_error(run("frobnicate"), "unknown command 'frobnicate'");
  expect_config_error(run("presets list --bogus"), "unrecognised option '--bogus'");
  expect_config_error(run("presets"), "presets needs a subcommand");
  expect_config_error(run("config wrong"), "unknown config subcommand");
}

TEST_CASE("devices lists at least the host CPU", "[cli]") {
  const Result result = run("devices --format json");
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("\"kind\": \"cpu\"") && Catch::Contains("cuda_status"));
}

TEST_CASE("sim runs the quickstart by default and reports the serving metrics", "[cli]") {
  const Result result = run("sim --format json");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("\"schema\": \"kvtier.sim.v2\"") &&
                             Catch::Contains("\"requests_completed\": 32") &&
                             Catch::Contains("\"tpot_p99_ms\"") &&
                             Catch::Contains("\"ttft_p50_ms\""));
  const Result table = run("sim");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("Llama-3.1-8B on H100-SXM") &&
                            Catch::Contains("throughput_output_tokens_per_s"));
  // The quickstart compares full with two tiered variants: one CSV row each.
  CHECK_THAT(table.out, Catch::Contains("tiered:hbm=0.5,evict=0.1,prefetch=differential") &&
                            Catch::Contains("synthetic reasoning trace"));
  const Result csv = run("sim --format csv");
  CHECK_THAT(csv.out, Catch::StartsWith("policy,requests_completed,prompt_tokens,"));
  CHECK(count_lines(csv.out) == 4);
}

TEST_CASE("sim --policy and --compare put policies side by side", "[cli]") {
  const auto path = write_file("compare.textproto", kRun);
  const std::string tiering =
      " --set tiering.prefetch_lookahead_layers=1 --set tiering.host_allocation=PINNED"
      " --set tiering.copy_method=COPY_ENGINES"
      " --set tiering.synthetic_pattern=chat";
  const Result result = run("sim " + path.string() +
                            " --policy tiered:hbm=0.5,evict=0.1 --compare full,h2o:budget=64" +
                            tiering + " --format csv");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK(count_lines(result.out) == 4);
  CHECK_THAT(result.out, Catch::Contains("\n\"tiered:hbm=0.5,evict=0.1,") &&
                             Catch::Contains("\n\"full\",") &&
                             Catch::Contains("\n\"h2o:budget=64,"));
  expect_config_error(run("sim " + path.string() + " --policy nosuch" + tiering), "unknown policy");
  expect_config_error(run("sim " + path.string() + " --compare full,," + tiering), "empty policy");
  const Result missing =
      run("sim " + path.string() + " --policy tiered --trace /no/such.h5" + tiering);
  CHECK(missing.exit_code == 3);
}

TEST_CASE("sim output is byte-identical for the same config and seed", "[cli]") {
  const auto path = write_file("sim.textproto", kRun);
  const Result first = run("sim " + path.string() + " --format json");
  const Result second = run("sim " + path.string() + " --format json");
  CHECK(first.exit_code == 0);
  CHECK(first.out == second.out);
  // Lengths drawn from the seed: the same seed gives the same figures, another seed others (CSV
  // holds the figures alone, not the seed).
  const std::string drawn =
      " --format csv --set workload.closed_loop.output_tokens.uniform"
      ".min_tokens=16 --set workload.closed_loop.output_tokens.uniform"
      ".max_tokens=256";
  const Result seeded = run("sim " + path.string() + drawn);
  INFO(seeded.err);
  REQUIRE(seeded.exit_code == 0);
  CHECK(run("sim " + path.string() + drawn).out == seeded.out);
  const Result reseeded = run("sim " + path.string() + drawn + " --set seed=8");
  CHECK(reseeded.exit_code == 0);
  CHECK(reseeded.out != seeded.out);
}

TEST_CASE("sim --out writes the report files whole", "[cli]") {
  const auto path = write_file("out.textproto", kRun);
  const fs::path out = scratch_dir() / "sim-out";
  const Result result = run("sim " + path.string() + " --out " + out.string() +
                            " --set outputs.timeseries_interval_us=50ms");
  CHECK(result.exit_code == 0);
  CHECK_THAT(slurp(out / "report.json"), Catch::StartsWith("{\"schema\": \"kvtier.sim.v2\""));
  CHECK_THAT(slurp(out / "metrics.csv"), Catch::StartsWith("policy,requests_completed,"));
  CHECK_THAT(slurp(out / "timeseries.csv"),
             Catch::StartsWith("time_us,hbm_kv_used_gib,running_requests,waiting_requests,"
                               "host_kv_used_gib\n"));
  // The page: well-formed, its series charted, and what --format html prints.
  const std::string page = slurp(out / "report.html");
  const kvtier::testing::XmlTree html = kvtier::testing::parse_xml(page);
  std::vector<std::string> charts;
  for (const auto* svg : kvtier::testing::elements(html, "svg")) {
    charts.push_back(kvtier::testing::attribute(*svg, "aria-label"));
  }
  CHECK_THAT(charts, Catch::VectorContains(std::string("Throughput")) &&
                         Catch::VectorContains(std::string("KV in HBM per GPU")) &&
                         Catch::VectorContains(std::string("Requests waiting for admission")));
  const Result printed =
      run("sim " + path.string() + " --format html" + " --set outputs.timeseries_interval_us=50ms");
  CHECK(printed.exit_code == 0);
  CHECK(printed.out == page);
  for (const auto& entry : fs::directory_iterator(out)) {
    CHECK_THAT(entry.path().filename().string(), !Catch::Contains(".tmp"));
  }
  // A run without a time series removes the earlier run's, which would pass for its own.
  const Result plain = run("sim " + path.string() + " --out " + out.string() + " --set seed=5");
  CHECK(plain.exit_code == 0);
  CHECK(fs::exists(out / "report.json"));
  CHECK_FALSE(fs::exists(out / "timeseries.csv"));
  // A folder in the way of one file is refused before the simulation runs (exit 2), and no file
  // is replaced.
  const std::string before = slurp(out / "report.json");
  fs::remove(out / "metrics.csv");
  fs::create_directory(out / "metrics.csv");
  const Result blocked = run("sim " + path.string() + " --out " + out.string() + " --set seed=6");
  expect_config_error(blocked, "--out holds metrics.csv as something other than a file");
  CHECK(slurp(out / "report.json") == before);
  for (const auto& entry : fs::directory_iterator(out)) {
    CHECK_THAT(entry.path().filename().string(), !Catch::Contains(".tmp"));
  }
}

TEST_CASE("sim of a cluster reports every engine and writes engines.csv", "[cli][cluster]") {
  const auto path =
      write_file("cluster.textproto", kRun + "cluster { engines: 3 routing: ROUND_ROBIN }\n");
  const fs::path out = scratch_dir() / "sim-cluster";
  const Result result = run("sim " + path.string() + " --out " + out.string() +
                            " --set outputs.timeseries_interval_us=50ms");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("note: cluster of 3 engine(s) of 1 GPU(s), routed "
                                         "ROUND_ROBIN, 2 to 3 requests each") &&
                             Catch::Contains("cluster_engines") &&
                             Catch::Contains("engines of policy full:") &&
                             Catch::Contains("requests_routed"));
  const std::string engines = slurp(out / "engines.csv");
  CHECK_THAT(engines, Catch::StartsWith("policy,engine,requests_routed,requests_completed,"));
  CHECK(count_lines(engines) == 4);
  CHECK_THAT(slurp(out / "report.json"), Catch::Contains("\"engines\": [{\"requests_routed\": 3"));
  CHECK_THAT(slurp(out / "metrics.csv"), Catch::Contains(",cluster_engines,"));
  // Sampled across the cluster: running requests of every engine, KV of the mean one.
  CHECK_THAT(slurp(out / "timeseries.csv"),
             Catch::StartsWith("time_us,hbm_kv_used_gib,running_requests,waiting_requests,"
                               "host_kv_used_gib\n"));
  CHECK_THAT(slurp(out / "report.html"), Catch::Contains("<h3>Engines of full</h3>"));
  // A run without a cluster removes the earlier run's engines.csv.
  const auto plain = write_file("plain.textproto", kRun);
  CHECK(run("sim " + plain.string() + " --out " + out.string()).exit_code == 0);
  CHECK_FALSE(fs::exists(out / "engines.csv"));
  expect_config_error(run("sim " + path.string() + " --set cluster.routing=KV_AWARE"),
                      "KV_AWARE routing needs kv_overlap_weight");
  expect_config_error(run("sim " + path.string() + " --set cluster.engines=0"), "cluster.engines");
}

TEST_CASE("sim and plan check a run once --policy and --compare have edited it", "[cli]") {
  // The file serves the full cache; what its decode engines receive needs a tier policy, which
  // --policy or --compare may give.
  const auto path =
      write_file("kept.textproto",
                 kRun +
                     "tiering { synthetic_pattern: \"reasoning\" prefetch_lookahead_layers: 1 "
                     "host_allocation: PINNED copy_method: COPY_ENGINES }\n");
  const std::string sets =
      " --set cluster.engines=2 --set cluster.routing=ROUND_ROBIN"
      " --set cluster.disaggregation.prefill_engines=1"
      " --set cluster.disaggregation.decode_routing=ROUND_ROBIN"
      " --set cluster.disaggregation.kv_link.preset=NVLink4"
      " --set cluster.disaggregation.send_kept_only=true";
  expect_config_error(run("sim " + path.string() + sets),
                      "sending only the kept tokens needs a tier policy");
  CHECK(run("sim " + path.string() + sets + " --policy streaming:sinks=4,window=60").exit_code ==
        0);
  CHECK(run("sim " + path.string() + sets + " --compare streaming:sinks=4,window=60").exit_code ==
        0);
  // plan plans a cluster by its arrival rate.
  const auto open =
      write_file("kept-open.textproto",
                 open_loop_run() +
                     "tiering { synthetic_pattern: \"reasoning\" prefetch_lookahead_layers: 1 "
                     "host_allocation: PINNED copy_method: COPY_ENGINES }\n");
  expect_config_error(run("plan " + open.string() + sets + " --slo ttft_p99=2s"),
                      "sending only the kept tokens needs a tier policy");
  CHECK(run("plan " + open.string() + sets +
            " --slo ttft_p99=2s --policy streaming:sinks=4,window=60")
            .exit_code == 0);
}

TEST_CASE("sim refuses configs where nothing can run, and tier policies without tiering", "[cli]") {
  const auto path = write_file("big.textproto", kRun);
  expect_config_error(run("sim " + path.string() + " --set model.preset=Llama-3.1-70B"),
                      "nothing can run: weights 131.");
  expect_config_error(run("sim " + path.string() + " --set policy.name=tiered"),
                      "a policy other than full needs a tiering block");
  expect_config_error(run("sim " + path.string() + " --format yaml"), "unknown --format");
  // A policy compared with itself would give two columns of one name.
  expect_config_error(run("sim " + path.string() + " --compare full"),
                      "policy 'full' is given twice (policy and compare[0])");
  expect_config_error(run("plan " + path.string() + " --slo tpot_p99=50ms --compare full"),
                      "policy 'full' is given twice (policy and compare[0])");
  // The tier options edit a tiering block; kRun has none, so they name what is missing.
  for (const std::string option : {"--trace t.h5", "--extend synthetic", "--cache-dir d"}) {
    expect_config_error(run("sim " + path.string() + " " + option),
                        "edits the run's tiering block, which this run lacks");
  }
}

TEST_CASE("sim writes into the run's outputs.directory the files outputs.formats names", "[cli]") {
  fs::create_directories(scratch_dir() / "outputs-spec");
  const auto path = write_file("outputs-spec/run.textproto",
                               kRun + "outputs { directory: \"results\" formats: JSON }\n");
  // Relative to the config file, not to the working directory.
  const fs::path out = scratch_dir() / "outputs-spec" / "results";
  REQUIRE(run("sim " + path.string()).exit_code == 0);
  CHECK_THAT(slurp(out / "report.json"), Catch::StartsWith("{\"schema\": \"kvtier.sim.v2\""));
  CHECK_FALSE(fs::exists(out / "metrics.csv"));
  // --out wins; CSV alone writes the tables.
  const fs::path elsewhere = scratch_dir() / "outputs-spec-elsewhere";
  REQUIRE(
      run("sim " + path.string() + " --out " + elsewhere.string() + " --set outputs.formats[0]=CSV")
          .exit_code == 0);
  CHECK(fs::exists(elsewhere / "metrics.csv"));
  CHECK_FALSE(fs::exists(elsewhere / "report.json"));
  expect_config_error(run("sim " + path.string() + " --set outputs.formats[0]=HDF5"), "HDF5");
}

TEST_CASE("plan finds the largest batch per policy and the GPUs a target needs", "[cli]") {
  const auto path = write_file("plan.textproto", kRun);
  const Result result =
      run("plan " + path.string() + " --slo tpot_p99=1s --target-tokens-per-s 5000 --format json");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("\"plans\": [{\"policy\": \"full\"") &&
                             Catch::Contains("\"max_batch\": ") && Catch::Contains("\"gpus\": "));
  const Result table = run("plan " + path.string() + " --slo tpot_p99=1s");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("max batch") && Catch::Contains("bound by"));
  expect_config_error(run("plan " + path.string() + " --slo tpot=1s"), "unknown metric");
  expect_config_error(run("plan " + path.string()), "slo");
  // A negative count was read as 2^32 - 1 rounds and never finished.
  expect_config_error(run("plan " + path.string() + " --slo tpot_p99=1s --rounds=-1"),
                      "--rounds -1: must not be negative");
  expect_config_error(run("plan " + path.string() + " --slo tpot_p99=1s --rounds 1000000"),
                      "--rounds 1000000: from 1 to 1000");
  expect_config_error(run("plan " + path.string() + " --slo tpot_p99=1s --target-tokens-per-s inf"),
                      "positive finite");
  // No batch meets a 1 us TPOT: no number of engines serves the target.
  const Result none =
      run("plan " + path.string() + " --slo tpot_p99=1us --target-tokens-per-s 1000 --format json");
  CHECK(none.exit_code == 0);
  CHECK_THAT(none.out, Catch::Contains("\"max_batch\": 0") &&
                           Catch::Contains(R"("engines": null, "gpus": null, "nodes": null)"));
}

TEST_CASE("plan searches an open-loop workload's arrival rate", "[cli]") {
  const std::string text = open_loop_run();
  const auto path = write_file("plan-open.textproto", text);
  const Result result = run("plan " + path.string() +
                            " --slo ttft_p99=300ms --target-requests-per-s 100 --format json");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("\"max_requests_per_s\": ") &&
                             Catch::Contains("\"infeasible_requests_per_s\": ") &&
                             Catch::Contains("\"max_running_requests\": ") &&
                             Catch::Contains("\"notes\": []") && Catch::Contains("\"engines\": "));
  const Result table = run("plan " + path.string() + " --slo ttft_p99=300ms --rate-precision 0.1");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("largest arrival rate") && Catch::Contains("max req/s") &&
                            Catch::Contains("in flight") && Catch::Contains("bound by"));
  expect_config_error(run("plan " + path.string() + " --slo tpot_p99=50ms"),
                      "needs an SLO on ttft, queue_wait or e2e_latency");
  expect_config_error(run("plan " + path.string() + " --slo ttft_p99=300ms --rounds 2"),
                      "--rounds applies to closed_loop workloads");
  expect_config_error(run("plan " + path.string() + " --slo ttft_p99=300ms --rate-precision 0"),
                      "--rate-precision 0: from 1e-06 to 1");
  expect_config_error(
      run("plan " + path.string() + " --slo ttft_p99=300ms --target-requests-per-s -3"),
      "--target-requests-per-s must be a positive finite number");
  const auto closed = write_file("plan-closed.textproto", kRun);
  expect_config_error(run("plan " + closed.string() + " --slo tpot_p99=1s --rate-precision 0.1"),
                      "--rate-precision applies to open-loop workloads");
}

TEST_CASE("plan plans a cluster whole by its arrival rate", "[cli][cluster]") {
  const std::string text = open_loop_run();
  const auto path = write_file("plan-cluster.textproto",
                               text + "cluster { engines: 2 routing: LEAST_OUTSTANDING }\n");
  const Result json = run("plan " + path.string() +
                          " --slo ttft_p99=300ms --target-requests-per-s 100 --format json");
  INFO(json.err);
  CHECK(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::Contains("\"cluster_engines\": 2") &&
                           Catch::Contains("\"cluster_max_requests_per_s\": ") &&
                           Catch::Contains("the cluster of 2 engines, routed LEAST_OUTSTANDING"));
  const Result table = run("plan " + path.string() + " --slo ttft_p99=300ms --rate-precision 0.1");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("of a cluster of 2 engines routed LEAST_OUTSTANDING"));
  const auto closed = write_file("plan-closed-cluster.textproto",
                                 kRun + "cluster { engines: 2 routing: ROUND_ROBIN }\n");
  expect_config_error(run("plan " + closed.string() + " --slo tpot_p99=1s"),
                      "planned by the arrival rate it serves");
}

TEST_CASE("usage errors: no command, abbreviated options, kvtier help COMMAND", "[cli]") {
  const Result none = run("");
  CHECK(none.exit_code == 2);
  CHECK(none.out.empty());
  CHECK_THAT(none.err, Catch::StartsWith("usage: kvtier"));
  const Result help = run("help plan");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::StartsWith("usage: kvtier plan"));
  // A subcommand's help likewise.
  const Result sub = run("help sweep merge");
  CHECK(sub.exit_code == 0);
  CHECK_THAT(sub.out, Catch::StartsWith("usage: kvtier sweep merge"));
  // Boost would take --form for --format; an abbreviation is an unknown option here.
  expect_config_error(run("presets list --form json"), "--form");
}

TEST_CASE("validate checks every measured reference against its tolerance", "[cli]") {
  // The prototype's reference within its tolerances (every committed file, live ones too:
  // tests/cli/test_validate_live_cli.cpp).
  const std::string folder = std::string(kvtier::test::source_dir()) + "/validation/measurements/";
  const Result gate = run("validate '" + folder + "rtx5080-prototype.textproto'");
  INFO(gate.err);
  CHECK(gate.exit_code == 0);
  CHECK_THAT(gate.out, Catch::Contains("0 outside tolerance") && Catch::Contains("calibrated"));
  const auto run_file = write_file("reference-run.textproto", kRun);
  const std::string figure =
      "id: \"x\" citation: \"test\" run_file: \"reference-run.textproto\"\n"
      "metric { policy_index: 0 metric: \"throughput_output_tokens_per_s\" measured: 1 "
      "tolerance: 0.01 }\n";
  const auto strict = write_file("strict.textproto", figure);
  const Result outside = run("validate " + strict.string() + " --format json");
  CHECK(outside.exit_code == 1);
  CHECK_THAT(outside.out, Catch::Contains("\"within\": false"));
  CHECK_THAT(outside.err, Catch::Contains("outside their tolerance"));
  const auto bad_index =
      write_file("bad-index.textproto",
                 "id: \"x\" citation: \"test\" run_file: \"reference-run.textproto\"\n"
                 "metric { policy_index: 3 metric: \"tpot_p50_ms\" measured: 1 tolerance: 0.1 }\n");
  expect_config_error(run("validate " + bad_index.string()), "policy_index 3");
  const auto bad_metric =
      write_file("bad-metric.textproto",
                 "id: \"x\" citation: \"test\" run_file: \"reference-run.textproto\"\n"
                 "metric { policy_index: 0 metric: \"speed\" measured: 1 tolerance: 0.1 }\n");
  expect_config_error(run("validate " + bad_metric.string()), "no metric 'speed'");
  expect_config_error(run("validate"), "measurement files or --published");
}

TEST_CASE("validate compares the simulator with the published measurements", "[cli]") {
  const std::string published =
      std::string("'") + kvtier::test::source_dir() + "/validation/published/decode_latency.csv'";
  const Result table = run("validate --published " + published);
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("lmdeploy-01") && Catch::Contains("median |error|"));
  const Result json = run("validate --published " + published + " --format json");
  CHECK(json.exit_code == 0);
  // The accuracy gate of docs/VALIDATION.md: median |relative error| over every projected
  // point stays within 10%.
  const auto at = json.out.find("\"median_abs_relative_error\": ");
  REQUIRE(at != std::string::npos);
  const double median = std::stod(json.out.substr(at + 29));
  CHECK(median <= 0.10);
  CHECK(median > 0.0);
  const auto bad = write_file("bad.csv", "id,gpu\nx\n");
  const Result broken = run("validate --published " + bad.string());
  CHECK(broken.exit_code == 3);
  CHECK_THAT(broken.err, Catch::Contains("bad.csv:2"));
  // Rows whose values cannot be right, and files without rows: exit 3 naming file and line,
  // never a report of 0 points or a `nan` in the JSON.
  const std::string header =
      "id,gpu,tensor_parallel,model,batch_size,prompt_tokens,output_tokens,metric,value,unit,"
      "weight_dtype,num_gpus\n";
  const auto row = [&header](const std::string& tp, const std::string& model,
                             const std::string& batch, const std::string& value,
                             const std::string& unit = "ms", const std::string& dtype = "BF16",
                             const std::string& gpus = "") {
    return header + "p1,H100-SXM," + tp + "," + model + "," + batch + ",128,128,tpot_ms," + value +
           "," + unit + "," + dtype + "," + gpus + "\n";
  };
  for (const auto& [name, content, expected] :
       {std::tuple{"nan.csv", row("1", "Llama-3.1-8B", "1", "nan"), "not a positive finite"},
        std::tuple{"negative.csv", row("1", "Llama-3.1-8B", "1", "-5"), "not a positive finite"},
        std::tuple{"batch0.csv", row("1", "Llama-3.1-8B", "0", "10"), "at least 1"},
        std::tuple{"nomodel.csv", row("1", "NoModel", "1", "10"),
                   "row p1 cannot be simulated: unknown model preset 'NoModel'"},
        std::tuple{"tp3.csv", row("3", "Llama-3.1-8B", "1", "10"),
                   "neither divides the model's 8 KV heads"},
        // Before, these were compared as if in ms, as BF16 and as one engine.
        std::tuple{"seconds.csv", row("1", "Llama-3.1-8B", "1", "0.01", "s"),
                   "column unit: 's' is not the unit of tpot_ms (ms)"},
        std::tuple{"dtype.csv", row("1", "Llama-3.1-8B", "1", "10", "ms", "FP99"),
                   "row p1 cannot be simulated"},
        std::tuple{"gpus0.csv", row("1", "Llama-3.1-8B", "1", "10", "ms", "BF16", "0"),
                   "column num_gpus: 0 is fewer than tensor_parallel 1"}}) {
    CAPTURE(name);
    const Result rejected = run("validate --published " + write_file(name, content).string());
    CHECK(rejected.exit_code == 3);
    CHECK(rejected.out.empty());
    CHECK_THAT(rejected.err,
               Catch::Contains(expected) && Catch::Contains(std::string(name) + ":2"));
  }
  // Replicas of an engine are not simulated: such a row is skipped with the reason.
  const Result replicas = run(
      "validate --published " +
      write_file("replicas.csv", row("1", "Llama-3.1-8B", "1", "10", "ms", "BF16", "2")).string());
  CHECK(replicas.exit_code == 0);
  CHECK_THAT(replicas.out, Catch::Contains("2 GPUs at tensor parallelism 1: the simulator runs "
                                           "one engine, not replicas"));
  const Result empty = run("validate --published " + write_file("empty.csv", "").string());
  CHECK(empty.exit_code == 3);
  CHECK_THAT(empty.err, Catch::Contains("no measurements"));
  const Result only_header =
      run("validate --published " + write_file("header.csv", header).string());
  CHECK(only_header.exit_code == 3);
  CHECK_THAT(only_header.err, Catch::Contains("a header and no measurements"));
  const Result folder = run("validate --published " + scratch_dir().string());
  CHECK(folder.exit_code == 3);
  CHECK_THAT(folder.err, Catch::Contains("a folder"));
}

TEST_CASE("a reference's run finds its request file beside the run's file", "[cli]") {
  // The request file of configs/examples/request-file.textproto is named relative to that file;
  // a reference naming the run from another folder must find it there, as sim does.
  fs::create_directories(scratch_dir() / "references");
  const auto reference = write_file("references/request-file-reference.textproto",
                                    std::string("id: \"request-file\"\ncitation: \"test\"\n"
                                                "run_file: \"") +
                                        kvtier::test::source_dir() +
                                        "/configs/examples/request-file.textproto\"\n"
                                        "metric { policy_index: 0 metric: \"requests_completed\" "
                                        "measured: 8 tolerance: 0.001 }\n");
  const Result result = run("validate " + reference.string());
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("requests_completed"));
}

TEST_CASE("plan finds a run's traces beside the run's file, as sim does", "[cli]") {
  fs::create_directories(scratch_dir() / "plan-traces");
  const auto trace = scratch_dir() / "plan-traces" / "beside.h5";
  REQUIRE(
      run("trace synth --model Llama-3.1-8B --prompt-tokens 64 --steps 64 --out " + trace.string())
          .exit_code == 0);
  std::string text =
      slurp(fs::path(kvtier::test::source_dir()) / "configs/examples/quickstart.textproto");
  text.replace(text.find("tiering {"), 9, "tiering {\n  traces: \"beside.h5\"");
  const auto config = write_file("plan-traces/run.textproto", text);
  // The working directory holds no beside.h5.
  const std::string args = config.string() +
                           " --set workload.closed_loop.prompt_tokens.fixed_tokens=64"
                           " --set workload.closed_loop.output_tokens.fixed_tokens=32"
                           " --extend synthetic";
  const Result sim = run("sim " + args + " --format json");
  INFO(sim.err);
  REQUIRE(sim.exit_code == 0);
  const Result plan = run("plan " + config.string() +
                          " --set workload.closed_loop.prompt_tokens.fixed_tokens=64"
                          " --set workload.closed_loop.output_tokens.fixed_tokens=32"
                          " --set tiering.extend_synthetic=true --slo tpot_p99=50ms --rounds 1");
  INFO(plan.err);
  CHECK(plan.exit_code == 0);
}

TEST_CASE("sim replays a request file named relative to its config", "[cli]") {
  const Result result = run(std::string("sim '") + kvtier::test::source_dir() +
                            "/configs/examples/request-file.textproto' --format json");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK_THAT(result.out,
             Catch::Contains("\"requests_completed\": 8") && Catch::Contains("request file"));
  const auto broken =
      write_file("broken.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n");
  const auto config = write_file("replay.textproto", kRun);
  // Setting a member of the workload's oneof replaces the closed loop.
  const Result bad =
      run("sim " + config.string() + " --set workload.request_file.path=" + broken.string() +
          " --set workload.request_file.format=AZURE_CSV" +
          " --set workload.request_file.time_scale=1");
  CHECK(bad.exit_code == 3);
  CHECK_THAT(bad.err, Catch::Contains("broken.csv:2") && Catch::Contains("TIMESTAMP 'yesterday'"));
}

TEST_CASE("policies list and show the registry with each policy's parameters", "[cli]") {
  const Result list = run("policies list");
  CHECK(list.exit_code == 0);
  CHECK_THAT(list.out, Catch::Contains("tiered") && Catch::Contains("h2o") &&
                           Catch::Contains("streaming") && Catch::Contains("oracle"));
  const Result show = run("policies show tiered");
  CHECK(show.exit_code == 0);
  CHECK_THAT(show.out, Catch::Contains("hbm") && Catch::Contains("evict") &&
                           Catch::Contains("delta") && Catch::Contains("full|differential"));
  const Result json = run("policies show h2o --format json");
  CHECK_THAT(json.out, Catch::Contains("\"name\": \"budget\""));
  expect_config_error(run("policies show lru"), "unknown policy 'lru'");
}
