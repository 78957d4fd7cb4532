// Loading end to end: presets expanded, overrides applied, every class of bad config reported
// with its position.

#include <catch2/catch.hpp>

#include "configs/schema/hardware.pb.h"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"
#include "tests/support/config_fixture.hpp"

using kvtier::config::ModelSpec;
using kvtier::config::RunSpec;
using kvtier::config::SweepSpec;
using kvtier::test::joined;
using kvtier::test::load_spec;
using kvtier::test::problems;
using kvtier::test::quickstart_run;

TEST_CASE("preset references expand, and values written next to them win", "[loader]") {
  const RunSpec run = load_spec<RunSpec>(quickstart_run(), {"model.kv_dtype=FP8_E4M3"});
  CHECK(run.model().name() == "Llama-3.1-8B");
  CHECK(run.model().preset() == "Llama-3.1-8B");
  CHECK(run.model().num_hidden_layers() == 32);
  CHECK(run.model().kv_dtype() == kvtier::config::FP8_E4M3);
  // Node presets refer to GPU, host and link presets in turn.
  CHECK(run.hardware().node().gpu().name() == "H100-SXM");
  CHECK(run.hardware().node().host_link().pcie_generation() == 5);
  CHECK(run.hardware().node().gpu_link().name() == "NVLink4");
}

TEST_CASE("a list written next to a preset replaces the preset's list", "[loader]") {
  const auto gpu = load_spec<kvtier::config::GpuSpec>(
      "preset: \"H100-SXM\"\ncompute { dtype: BF16 dense_tflops: 500 }\n");
  REQUIRE(gpu.compute_size() == 1);
  CHECK(gpu.compute(0).dense_tflops() == 500);
  CHECK(gpu.memory_capacity_gib() == 79.6);  // the rest of the preset is kept
}

TEST_CASE("overrides convert units and apply after presets", "[loader]") {
  const RunSpec run = load_spec<RunSpec>(
      quickstart_run(),
      {"hardware.node.gpu.memory_capacity=40GiB",
       "hardware.node.gpu.memory_bandwidth_gb_per_s=2000",
       "hardware.node.host_link.per_copy_overhead=7us", "workload.closed_loop.concurrency=2k",
       "model.kv_dtype=fp8_e4m3", "hardware.node.gpu.compute[0].dense_tflops=900TFLOP/s"});
  CHECK(run.hardware().node().gpu().memory_capacity_gib() == 40);
  CHECK(run.hardware().node().gpu().memory_bandwidth_gb_per_s() == 2000);
  CHECK(run.hardware().node().host_link().per_copy_overhead_us() == Approx(7));
  CHECK(run.workload().closed_loop().concurrency() == 2000);
  CHECK(run.model().kv_dtype() == kvtier::config::FP8_E4M3);
  CHECK(run.hardware().node().gpu().compute(0).dense_tflops() == 900);
}

TEST_CASE("64-bit overrides in plain digits are exact up to the type's limit", "[loader]") {
  // Through a double, 2^64 - 1 wrapped to 0 and 2^53 + 1 became 2^53.
  for (const std::uint64_t seed :
       {std::uint64_t{18446744073709551615U}, std::uint64_t{9007199254740993U}}) {
    CAPTURE(seed);
    const RunSpec run = load_spec<RunSpec>(quickstart_run(), {"seed=" + std::to_string(seed)});
    CHECK(run.seed() == seed);
  }
  CHECK(load_spec<RunSpec>(quickstart_run(), {"seed=1e3"}).seed() == 1000);
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"seed=2e16"})),
             Catch::Contains("past 2^53") && Catch::Contains("plain digits"));
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"seed=-1"})),
             Catch::Contains("does not fit"));
}

TEST_CASE("overriding a preset field swaps the whole sub-config, later overrides apply on top",
          "[loader]") {
  const RunSpec run = load_spec<RunSpec>(
      quickstart_run(),
      {"model.kv_dtype=FP8_E4M3", "model.preset=Llama-3.1-70B", "tensor_parallel_degree=4"});
  CHECK(run.model().num_hidden_layers() == 80);
  CHECK(run.model().kv_dtype() == kvtier::config::FP8_E4M3);
  CHECK(run.tensor_parallel_degree() == 4);
}

TEST_CASE("an override appends to a list at index == size and rejects indices past it",
          "[loader]") {
  const auto gpu = load_spec<kvtier::config::GpuSpec>(
      "preset: \"A100-80GB\"", {"compute[5].dtype=FP8_E4M3", "compute[5].dense_tflops=1"});
  CHECK(gpu.compute(5).dtype() == kvtier::config::FP8_E4M3);
  CHECK_THAT(joined(problems<kvtier::config::GpuSpec>("preset: \"A100-80GB\"",
                                                      {"compute[9].dense_tflops=1"})),
             Catch::Contains("past the end of 'compute'"));
}

TEST_CASE("an override of ~ removes a field: a value, a list or a sub-message", "[loader]") {
  const std::vector<std::string> by_rate = {"engine.speculative.draft_tokens=2",
                                            "engine.speculative.acceptance_rate=0.7",
                                            "engine.speculative.draft_layers=1"};
  // A value removed and the other form of it given: the run is valid (one form, not both).
  std::vector<std::string> switched = by_rate;
  switched.insert(switched.end(), {"engine.speculative.acceptance_rate=~",
                                   "engine.speculative.acceptance_by_position=0.9,0.5"});
  const RunSpec by_position = load_spec<RunSpec>(quickstart_run(), switched);
  CHECK_FALSE(by_position.engine().speculative().has_acceptance_rate());
  CHECK(by_position.engine().speculative().acceptance_by_position_size() == 2);
  // A list removed, and back again.
  switched.insert(switched.end(), {"engine.speculative.acceptance_by_position=~",
                                   "engine.speculative.acceptance_rate=0.6"});
  const RunSpec back = load_spec<RunSpec>(quickstart_run(), switched);
  CHECK(back.engine().speculative().acceptance_by_position_size() == 0);
  CHECK(back.engine().speculative().acceptance_rate() == 0.6);
  // A sub-message removed whole.
  std::vector<std::string> none = by_rate;
  none.emplace_back("engine.speculative=~");
  CHECK_FALSE(load_spec<RunSpec>(quickstart_run(), none).engine().has_speculative());
  // Under a sub-message that is not there: nothing removed and nothing made.
  const RunSpec plain = load_spec<RunSpec>(quickstart_run(), {"engine.speculative.draft_tokens=~"});
  CHECK_FALSE(plain.engine().has_speculative());
  CHECK_FALSE(load_spec<RunSpec>(quickstart_run(), {"cluster.disaggregation.kv_link.name=~"})
                  .has_cluster());
  // Through an entry of a list; under an entry past its end nothing is removed or appended.
  const RunSpec untuned = load_spec<RunSpec>(
      quickstart_run(),
      {"compare[0].name=tiered", "compare[0].param[0].name=hbm", "compare[0].param[0].number=0.5",
       "compare[1].name=h2o", "compare[1].param[0].name=budget", "compare[1].param[0].integer=512",
       "compare[0].param=~", "tiering.synthetic_pattern=reasoning",
       "tiering.prefetch_lookahead_layers=1", "tiering.host_allocation=PINNED",
       "tiering.copy_method=COPY_ENGINES"});
  REQUIRE(untuned.compare_size() == 2);
  CHECK(untuned.compare(0).param_size() == 0);
  CHECK(untuned.compare(1).param_size() == 1);
  CHECK(load_spec<RunSpec>(quickstart_run(), {"compare[0].name=~"}).compare_size() == 0);
  // Only ~ itself removes: a value that starts with it is a value.
  CHECK(load_spec<RunSpec>(quickstart_run(), {"name=~quickstart"}).name() == "~quickstart");
  // A field the config needs, removed, is missing as if never written, named by the --set.
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"tensor_parallel_degree=~"})),
             Catch::Contains("--set tensor_parallel_degree=~, field tensor_parallel_degree"));
  // Not one entry of a list, not a preset's name, and nothing a preset's values fill (they
  // would come back wherever the preset is expanded again, as at a sweep's points).
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"compare[0]=~"})),
             Catch::Contains("removes a whole field") && Catch::Contains("without the [0]"));
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"model.preset=~"})),
             Catch::Contains("a preset cannot be removed"));
  CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"model.sliding_window=~"})),
             Catch::Contains("nothing under a preset can be removed (model.preset names one)"));
  CHECK_THAT(
      joined(problems<RunSpec>(quickstart_run(), {"hardware.node.gpu.compute[0].dense_tflops=~"})),
      Catch::Contains("(hardware.node.preset names one)"));
}

TEST_CASE("bad overrides say what is wrong and name the override", "[loader]") {
  const auto check = [](const std::string& set, const std::string& expected) {
    const std::string all = joined(problems<RunSpec>(quickstart_run(), {set}));
    INFO(all);
    CHECK_THAT(all, Catch::Contains(expected) && Catch::Contains("--set " + set));
  };
  check("model.nope=3", "'nope' is not a field of ModelSpec");
  check("model.hidden_size=wide", "is not a number");
  check("model.hidden_size=1.5", "not a whole number");
  check("model.hidden_size=-3", "does not fit");
  check("seed=18446744073709551616", "does not fit");
  check("hardware.node.gpu.compute[99999999999].dense_tflops=1", "is too large");
  check("model.kv_dtype=BF17", "is not one of");
  check("model.tie_word_embeddings=maybe", "not a boolean");
  check("hardware.node.gpu.memory_capacity=80", "needs a unit");
  check("hardware.node.gpu.memory_capacity=5us", "expected a size");
  check("model=3", "is a message");
  check("model.preset=NoSuchModel", "unknown model preset 'NoSuchModel'");
  CHECK_THROWS_WITH(kvtier::config::parse_override("no-equals-sign"),
                    Catch::Contains("PATH=VALUE"));
}

TEST_CASE("missing required values are errors, never silent defaults", "[loader]") {
  const std::string all = joined(problems<ModelSpec>("name: \"m\"\narchitecture: LLAMA\n"));
  CHECK_THAT(all, Catch::Contains("missing required field 'hidden_size'") &&
                      Catch::Contains("field hidden_size") && Catch::Contains("test.textproto"));
  CHECK_THAT(all, Catch::Contains("missing required field 'kv_dtype'"));
  CHECK_THAT(joined(problems<RunSpec>("seed: 1")),
             Catch::Contains("missing required field 'hardware'"));
}

TEST_CASE("values out of range name the range and the value's position", "[loader]") {
  std::string text = quickstart_run();
  text.replace(text.find("runtime_reserve_gib: 2"), 22, "runtime_reserve_gib: -1");
  const std::string all = joined(problems<RunSpec>(text, {"workload.max_batch_size=0"}));
  CHECK_THAT(all, Catch::Contains("value -1 GiB is out of range: expected >= 0 GiB") &&
                      Catch::Contains("field memory.runtime_reserve_gib"));
  CHECK_THAT(all, Catch::Contains("test.textproto:12:10, field memory.runtime_reserve_gib"));
  CHECK_THAT(all,
             Catch::Contains("value 0 requests is out of range") &&
                 Catch::Contains("--set workload.max_batch_size=0, field workload.max_batch_size"));
  CHECK_THAT(joined(problems<kvtier::config::GpuSpec>(
                 "preset: \"H100-SXM\" efficiency { gemm_compute_fraction: 1.5 }")),
             Catch::Contains("expected in (0, 1]"));
  CHECK_THAT(joined(problems<kvtier::config::GpuSpec>(
                 "preset: \"H100-SXM\" memory_bandwidth_gb_per_s: inf")),
             Catch::Contains("not a finite number"));
}

TEST_CASE("a generated workload holds at most ten million requests", "[loader]") {
  CHECK(
      problems<RunSpec>(quickstart_run(), {"workload.closed_loop.num_requests=10000000"}).empty());
  CHECK_THAT(
      joined(problems<RunSpec>(quickstart_run(), {"workload.closed_loop.num_requests=4000000000"})),
      Catch::Contains(
          "value 4000000000 requests is out of range: expected in [1, 10000000] requests") &&
          Catch::Contains("field workload.closed_loop.num_requests"));
}

TEST_CASE("inconsistent combinations are reported", "[loader]") {
  SECTION("kv heads must divide attention heads") {
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"Llama-3.1-8B\" num_key_value_heads: 5")),
               Catch::Contains("num_key_value_heads 5 does not divide num_attention_heads 32"));
  }
  SECTION("a token cannot go to more experts than a layer has") {
    CHECK_THAT(
        joined(problems<ModelSpec>("preset: \"Qwen3-30B-A3B\" moe { experts_per_token: 200 }")),
        Catch::Contains("experts_per_token 200 exceeds num_experts 128") &&
            Catch::Contains("field moe.experts_per_token"));
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"Qwen3-30B-A3B\" moe { num_experts: 1 }")),
               Catch::Contains("moe.num_experts"));
  }
  SECTION("a mixture of experts keeps at least one layer of experts") {
    CHECK_THAT(
        joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" moe { first_dense_layers: 61 }")),
        Catch::Contains("first_dense_layers 61 leaves none of the 61 layers to the experts") &&
            Catch::Contains("field moe.first_dense_layers"));
    CHECK(problems<ModelSpec>("preset: \"DeepSeek-V3\" moe { first_dense_layers: 60 }").empty());
  }
  SECTION("latent attention's shapes agree with the heads' and exclude what it does not model") {
    CHECK(problems<ModelSpec>("preset: \"DeepSeek-V2-Lite\"").empty());
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" num_key_value_heads: 8")),
               Catch::Contains("with mla, num_key_value_heads 8 must equal num_attention_heads "
                               "128") &&
                   Catch::Contains("field num_key_value_heads"));
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" head_dim: 128")),
               Catch::Contains("with mla, head_dim 128 must be qk_nope_head_dim + "
                               "qk_rope_head_dim = 192") &&
                   Catch::Contains("field head_dim"));
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" sliding_window: 4096")),
               Catch::Contains("latent attention (mla) without sliding_window") &&
                   Catch::Contains("field sliding_window"));
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" attention_bias: true")),
               Catch::Contains("field attention_bias"));
    CHECK_THAT(joined(problems<ModelSpec>("preset: \"DeepSeek-V3\" mla { v_head_dim: 0 }")),
               Catch::Contains("mla.v_head_dim"));
  }
  SECTION("an explicit head_dim need not divide hidden evenly among the heads") {
    // Mistral-NeMo 12B's config.json: 32 heads of 128 against a hidden size of 5120.
    CHECK(
        problems<ModelSpec>("preset: \"Mistral-7B-v0.1\" hidden_size: 5120 head_dim: 128").empty());
    CHECK(problems<ModelSpec>("preset: \"Qwen3-8B\" head_dim: 64").empty());
  }
  SECTION("tensor parallelism must divide the KV heads or be a multiple of them") {
    std::string text = quickstart_run();
    text.replace(text.find("tensor_parallel_degree: 1"), 25, "tensor_parallel_degree: 3");
    CHECK_THAT(joined(problems<RunSpec>(text)),
               Catch::Contains("tensor_parallel_degree 3 neither divides the model's 8 KV heads "
                               "nor is a multiple of them") &&
                   Catch::Contains("test.textproto:4:1"));
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"tensor_parallel_degree=16"})),
               Catch::Contains("tensor_parallel_degree 16 needs 2 nodes of 8 GPUs"));
  }
  SECTION("the swap space comes out of one GPU's share of the host memory") {
    // hgx-h100-8: 1,536 GiB of DDR over 8 GPUs, 192 GiB each.
    const std::vector<std::string> swap = {"workload.on_demand_admission.watermark=0.01",
                                           "memory.kv_block_tokens=16"};
    std::vector<std::string> too_large = swap;
    too_large.emplace_back("workload.on_demand_admission.swap.space_gib=192.5");
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), too_large)),
               Catch::Contains("swap space 192.5 GiB per GPU exceeds the GPU's share of host "
                               "DDR5-4800-12ch (1536 GiB / 8 GPUs)") &&
                   Catch::Contains("workload.on_demand_admission.swap.space_gib"));
    std::vector<std::string> all_of_it = swap;
    all_of_it.emplace_back("workload.on_demand_admission.swap.space_gib=192");
    CHECK(problems<RunSpec>(quickstart_run(), all_of_it).empty());
    // The space is required, and so is the memory's block size, the unit a swap copy moves.
    CHECK_THAT(joined(problems<RunSpec>(
                   quickstart_run(),
                   {"workload.on_demand_admission.watermark=0.01", "memory.kv_block_tokens=16",
                    "workload.on_demand_admission.swap.block_tokens=16"})),
               Catch::Contains("space_gib"));
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(),
                                        {"workload.on_demand_admission.watermark=0.01",
                                         "workload.on_demand_admission.swap.space_gib=4"})),
               Catch::Contains("preemption by swapping copies whole KV blocks: set "
                               "memory.kv_block_tokens") &&
                   Catch::Contains("field memory.kv_block_tokens"));
  }
  SECTION("the block size moved from the swap to the memory, and an old config says where") {
    const auto found = joined(
        problems<RunSpec>(quickstart_run(), {"workload.on_demand_admission.watermark=0.01",
                                             "workload.on_demand_admission.swap.space_gib=4",
                                             "workload.on_demand_admission.swap.block_tokens=64"}));
    CHECK_THAT(found, Catch::Contains("the KV block size moved to memory.kv_block_tokens") &&
                          Catch::Contains("set kv_block_tokens: 64 in memory") &&
                          Catch::Contains("field workload.on_demand_admission.swap.block_tokens"));
    // Still refused beside the new field: one block size, in one place.
    CHECK_THAT(joined(problems<RunSpec>(
                   quickstart_run(),
                   {"workload.on_demand_admission.watermark=0.01",
                    "workload.on_demand_admission.swap.space_gib=4", "memory.kv_block_tokens=64",
                    "workload.on_demand_admission.swap.block_tokens=64"})),
               Catch::Contains("moved to memory.kv_block_tokens"));
  }
  SECTION("a KV block holds 1 to 4096 tokens") {
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"memory.kv_block_tokens=0"})),
               Catch::Contains("kv_block_tokens"));
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"memory.kv_block_tokens=4097"})),
               Catch::Contains("kv_block_tokens"));
    CHECK(problems<RunSpec>(quickstart_run(), {"memory.kv_block_tokens=4096"}).empty());
  }
  SECTION("the GPU must run the model's math format") {
    CHECK_THAT(joined(problems<RunSpec>(quickstart_run(), {"hardware.node.preset=dgx-a100-8",
                                                           "model.weight_dtype=FP8_E4M3",
                                                           "model.activation_dtype=FP8_E4M3"})),
               Catch::Contains("GPU A100-80GB cannot run FP8_E4M3 matrix multiplies"));
    CHECK(problems<RunSpec>(quickstart_run(), {"model.weight_dtype=INT4"}).empty());
  }
  SECTION("links and nodes") {
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>("preset: \"PCIe-Gen5-x16\" lanes: 3")),
               Catch::Contains("not a PCIe link width"));
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>(
                   "preset: \"PCIe-Gen5-x16\" peak_gb_per_s_per_direction: 70")),
               Catch::Contains("follows from pcie_generation and lanes"));
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>("preset: \"NVLink4\" lanes: 16")),
               Catch::Contains("apply to PCIE links only"));
    // Copies by SM kernels: host copies, within a declared peak.
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>(
                   "preset: \"PCIe-Gen5-x16-H200\" sm_kernel_measured { direction: PEER "
                   "transfer_size_bytes: 1024 effective_gb_per_s: 10 }")),
               Catch::Contains("sm_kernel_measured[0].direction") &&
                   Catch::Contains("measured H2D or D2H, not PEER"));
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>(
                   "preset: \"NVLink-C2C\" sm_kernel_measured { direction: H2D "
                   "transfer_size_bytes: 1024 effective_gb_per_s: 9000 }")),
               Catch::Contains("sm_kernel_measured[0].effective_gb_per_s") &&
                   Catch::Contains("exceeds the link's peak"));
    // The T2 kernels' figures likewise.
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>(
                   "preset: \"PCIe-Gen5-x16-H200\" sm_kernel_t2_measured { direction: PEER "
                   "transfer_size_bytes: 1024 effective_gb_per_s: 10 }")),
               Catch::Contains("sm_kernel_t2_measured[0].direction") &&
                   Catch::Contains("measured H2D or D2H, not PEER"));
    CHECK_THAT(joined(problems<kvtier::config::LinkSpec>(
                   "preset: \"NVLink-C2C\" sm_kernel_t2_measured { direction: D2H "
                   "transfer_size_bytes: 1024 effective_gb_per_s: 9000 }")),
               Catch::Contains("sm_kernel_t2_measured[0].effective_gb_per_s") &&
                   Catch::Contains("exceeds the link's peak"));
    CHECK(problems<kvtier::config::LinkSpec>(
              "preset: \"PCIe-Gen5-x16-H200\" sm_kernel_t2_measured { direction: H2D "
              "transfer_size_bytes: 1024 effective_gb_per_s: 10 } sm_kernel_t2_h2d_overhead_us: 9")
              .empty());
    CHECK(problems<kvtier::config::LinkSpec>("preset: \"PCIe-Gen5-x16-H200\"").empty());
    CHECK_THAT(joined(problems<kvtier::config::NodeSpec>("preset: \"gh200\" gpus_per_node: 2")),
               Catch::Contains("SINGLE_GPU with gpus_per_node 2"));
  }
  SECTION("workloads need exactly one kind") {
    CHECK_THAT(
        joined(problems<kvtier::config::WorkloadSpec>("max_batch_size: 1 prefill_chunk_tokens: 1")),
        Catch::Contains("missing workload kind"));
  }
}

TEST_CASE("errors in preset-supplied values point at the preset file", "[loader]") {
  // The preset is fine; a broken override of it is reported at the override.
  const std::string all =
      joined(problems<RunSpec>(quickstart_run(), {"model.num_key_value_heads=5"}));
  CHECK_THAT(all, Catch::Contains("--set model.num_key_value_heads=5"));
  // A value the preset supplies keeps the preset's position.
  const auto locations = [] {
    RunSpec run;
    return kvtier::test::loader().load_text(quickstart_run(), "run.textproto", run, {});
  }();
  const auto position = locations.nearest("model.hidden_size");
  CHECK(position.file == "configs/models/Llama-3.1-8B.textproto");
  CHECK(position.line > 0);
  CHECK(locations.nearest("seed").file == "run.textproto");
}

TEST_CASE("sweeps validate every axis value on the base run", "[loader]") {
  const std::string base = "name: \"s\" mode: GRID base {" + quickstart_run() + "}\n";
  CHECK(problems<SweepSpec>(
            base + "axis { path: \"tensor_parallel_degree\" values: [\"1\", \"2\", \"8\"] }")
            .empty());
  const std::string all =
      joined(problems<SweepSpec>(
          base + "axis { path: \"tensor_parallel_degree\" values: [\"1\", \"3\"] }\n"
                 "axis { path: \"model.nope\" values: [\"1\"] }"));
  CHECK_THAT(all, Catch::Contains("axis value tensor_parallel_degree=3 makes an invalid run"));
  CHECK_THAT(all, Catch::Contains("field axis[0].values[1]"));
  CHECK_THAT(all, Catch::Contains("'nope' is not a field of ModelSpec"));
  CHECK_THAT(
      joined(problems<SweepSpec>("name: \"s\" mode: ZIP base {" + quickstart_run() +
                                 "}\naxis { path: \"seed\" values: [\"1\", \"2\"] }\n"
                                 "axis { path: \"tensor_parallel_degree\" values: [\"1\"] }")),
      Catch::Contains("ZIP sweeps need axes of equal length"));
}

TEST_CASE("ZIP sweeps validate each point's values together", "[loader]") {
  const std::string base = "name: \"s\" mode: ZIP base {" + quickstart_run() + "}\n";
  // TP 16 alone spans two nodes the base does not have; with them and their network it is a
  // valid point.
  const std::string axes =
      "axis { path: \"tensor_parallel_degree\" values: [\"1\", \"16\"] }\n"
      "axis { path: \"hardware.num_nodes\" values: [\"1\", \"2\"] }\n"
      "axis { path: \"hardware.network.preset\" values: [\"InfiniBand-NDR\", \"%\"] }\n";
  std::string valid = axes;
  valid.replace(valid.find('%'), 1, "InfiniBand-NDR");
  CHECK(problems<SweepSpec>(base + valid).empty());
  std::string wrong = axes;
  wrong.replace(wrong.find('%'), 1, "NVLink4");
  const std::string all = joined(problems<SweepSpec>(base + wrong));
  CHECK_THAT(all, Catch::Contains("ZIP point 1 (tensor_parallel_degree=16, hardware.num_nodes=2, "
                                  "hardware.network.preset=NVLink4) makes an invalid run: the "
                                  "network between nodes must be a NETWORK link") &&
                      Catch::Contains("field axis[0].values[1]"));
  CHECK_THAT(all, !Catch::Contains("ZIP point 0"));
}

TEST_CASE("the declared message type is read from the file header", "[loader]") {
  CHECK(kvtier::config::declared_kind("# proto-message: SweepSpec\nname: \"x\"") == "sweep");
  CHECK(kvtier::config::declared_kind("# proto-message: kvtier.config.RunSpec\n") == "run");
  CHECK(kvtier::config::declared_kind("seed: 1\n").empty());
  CHECK_THROWS_AS(kvtier::config::declared_kind("# proto-message: Nope\n"), kvtier::ConfigError);
}

TEST_CASE("enum numbers the schema does not name are refused", "[loader]") {
  CHECK_THAT(joined(problems<ModelSpec>("preset: \"Llama-3.1-8B\" kv_dtype: 99")),
             Catch::Contains("value 99 is not a DType") && Catch::Contains("field kv_dtype"));
}
