// The full-cache serving engine: request lifecycle, batching, admission by memory, determinism.

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "serving/engine.hpp"
#include "serving/simulation.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::sim::Tick;

namespace {

RunSpec run_with(const std::vector<std::string>& sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

std::map<std::string, double> metrics(const RunSpec& run) {
  return kvtier::test::serving_metrics(run);
}

// 4,444 tokens of KV (18.5 GiB − 14.96 weights − 3 reserve and workspace, 128 KiB a token);
// two requests of 2,000 + 500 tokens, prefilled in one chunk each: their whole lives do not
// fit together, their prompts do.
std::vector<std::string> two_requests_short_of_kv() {
  return {"hardware.node.gpu.memory_capacity=18.5GiB",
          "workload.closed_loop.concurrency=2",
          "workload.closed_loop.num_requests=2",
          "workload.closed_loop.prompt_tokens.fixed_tokens=2000",
          "workload.closed_loop.output_tokens.fixed_tokens=500",
          "workload.prefill_chunk_tokens=4096"};
}

}  // namespace

TEST_CASE("one request: a prefill iteration yields the first token, then one decode per token",
          "[serving]") {
  const RunSpec run =
      run_with({"workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1",
                "workload.closed_loop.prompt_tokens.fixed_tokens=100",
                "workload.closed_loop.output_tokens.fixed_tokens=10"});
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run,
                                        kvtier::serving::make_workload(run.workload(), run.seed()));
  engine.start();
  simulator.run();
  CHECK(engine.totals().iterations == 10);  // 1 prefill + 9 decodes
  CHECK(engine.totals().requests_completed == 1);
  CHECK(engine.totals().output_tokens == 10);

  // The prefill iteration's duration is the cost model's plus the engine overhead.
  kvtier::hw::BatchShape prefill;
  prefill.prefill.push_back({100, 0});
  prefill.logits_tokens = 1;
  const Tick overhead = Tick::us(1000);
  CHECK(engine.ttft().percentile(50) == engine.cost_model().cost(prefill).total + overhead);
  // Decode k reads the prompt and the k tokens generated so far.
  Tick decodes;
  for (std::uint64_t generated = 1; generated < 10; ++generated) {
    kvtier::hw::BatchShape decode;
    decode.decode_tokens = 1;
    decode.decode_context_tokens = 100 + generated;
    decode.logits_tokens = 1;
    decodes += engine.cost_model().cost(decode).total + overhead;
  }
  CHECK(engine.e2e().percentile(50) == engine.ttft().percentile(50) + decodes);
  CHECK(engine.tpot().percentile(50) == decodes / 9);
}

TEST_CASE("long prompts are prefilled in chunks of the token budget", "[serving]") {
  const RunSpec run = run_with(
      {"workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1",
       "workload.closed_loop.prompt_tokens.fixed_tokens=1200",
       "workload.closed_loop.output_tokens.fixed_tokens=1", "workload.prefill_chunk_tokens=512"});
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run,
                                        kvtier::serving::make_workload(run.workload(), run.seed()));
  engine.start();
  simulator.run();
  CHECK(engine.totals().iterations == 3);  // 512 + 512 + 176
  CHECK(engine.totals().requests_completed == 1);
  CHECK(engine.tpot().count() == 0);  // one output token: no time per output token
}

TEST_CASE("a closed loop keeps its concurrency and serves every request", "[serving]") {
  const auto values = metrics(
      run_with({"workload.closed_loop.concurrency=4", "workload.closed_loop.num_requests=12"}));
  CHECK(values.at("requests_completed") == 12);
  CHECK(values.at("max_running_requests") == 4);
  CHECK(values.at("output_tokens") == 12 * 64);
  CHECK(values.at("prompt_tokens") == 12 * 128);
}

TEST_CASE("admission is limited by the KV memory left next to the weights", "[serving]") {
  // Llama-3.1-8B bf16 weights are 14.96 GiB; 18.5 GiB of HBM leaves 0.54 GiB for KV after the
  // 3 GiB of reserve and workspace: 4,428 tokens, i.e. 23 requests of 192 tokens.
  const auto values = metrics(
      run_with({"hardware.node.gpu.memory_capacity=18.5GiB", "workload.closed_loop.concurrency=64",
                "workload.closed_loop.num_requests=64"}));
  CHECK(values.at("largest_batch_that_fits") == 23);
  CHECK(values.at("max_running_requests") == 23);
  CHECK(values.at("hbm_kv_reserved_peak_gib") <= values.at("hbm_kv_capacity_gib"));
  CHECK(values.at("requests_completed") == 64);
  CHECK(values.at("max_waiting_requests") > 0);
}

TEST_CASE("on-demand admission runs more at once and preempts the last admitted when KV runs out",
          "[serving]") {
  const std::vector<std::string> sets = two_requests_short_of_kv();
  const auto reserving = metrics(run_with(sets));
  CHECK(reserving.at("max_running_requests") == 1);
  CHECK(reserving.at("preemptions") == 0);
  CHECK(reserving.at("preempted_kv_tokens") == 0);
  CHECK(reserving.at("iterations") == 1000);  // one after the other: 1 prefill + 499 decodes
  std::vector<std::string> on_demand = sets;
  on_demand.emplace_back("workload.on_demand_admission.watermark=0.01");
  const auto values = metrics(run_with(on_demand));
  // Both prefill in iteration 1 (4,000 tokens, under 99% of 4,444). A decode step with g tokens
  // out writes 2,000 + g tokens of KV per request: both fit through g = 221. At g = 222 the
  // second is preempted, dropping 2,221 tokens; its recompute (2,222 tokens) never fits beside
  // the first, which decodes alone to its 500th token (iteration 500). The second then prefills
  // its 2,222 tokens, which give its 223rd, and decodes the other 277: 778 iterations.
  CHECK(values.at("max_running_requests") == 2);
  CHECK(values.at("preemptions") == 1);
  CHECK(values.at("preempted_kv_tokens") == 2221);
  CHECK(values.at("iterations") == 778);
  CHECK(values.at("requests_completed") == 2);
  CHECK(values.at("hbm_kv_used_peak_gib") <= values.at("hbm_kv_capacity_gib"));
  CHECK(values.at("hbm_kv_reserved_peak_gib") <= values.at("hbm_kv_capacity_gib"));
  // Both first tokens come from iteration 1; the queue wait ends at the first admission.
  CHECK(values.at("ttft_p99_ms") == values.at("ttft_p50_ms"));
  CHECK(values.at("queue_wait_p99_ms") == 0.0);
  // Deterministic, preemptions included.
  const RunSpec run = run_with(on_demand);
  CHECK(kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v") ==
        kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v"));
}

TEST_CASE("paged KV memory takes whole blocks, so the same requests are preempted sooner",
          "[serving]") {
  // The two requests above in 16-token blocks: the 4,444 tokens of KV capacity are 277 whole
  // blocks (4,432 tokens), and a request with 2,000 + g tokens takes ceil((2,000 + g) / 16)
  // blocks. Both fit through g = 208 (138 blocks each); at g = 209 (139 each) the second is
  // preempted with 2,208 tokens, recomputed after the first ends at iteration 500, and decodes
  // its other 291 tokens: 791 iterations, against 778 counted a token at a time.
  std::vector<std::string> sets = two_requests_short_of_kv();
  sets.emplace_back("workload.on_demand_admission.watermark=0.01");
  const auto by_token = metrics(run_with(sets));
  sets.emplace_back("memory.kv_block_tokens=16");
  const RunSpec run = run_with(sets);
  const auto paged = metrics(run);
  kvtier::sim::Simulator simulator;
  const kvtier::serving::ServingEngine engine(
      simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
  const double block_bytes = 16 * engine.memory().kv_bytes_per_token;
  CHECK(engine.memory().kv_capacity_bytes == 277 * block_bytes);
  CHECK(paged.at("hbm_kv_capacity_gib") == Approx(277 * block_bytes / (1 << 30)));
  CHECK(by_token.at("hbm_kv_capacity_gib") > paged.at("hbm_kv_capacity_gib"));
  CHECK(by_token.at("preempted_kv_tokens") == 2221);
  CHECK(by_token.at("iterations") == 778);
  CHECK(paged.at("preemptions") == 1);
  CHECK(paged.at("preempted_kv_tokens") == 2208);
  CHECK(paged.at("iterations") == 791);
  CHECK(paged.at("requests_completed") == 2);
  // The largest KV held: both at g = 208, 276 blocks.
  CHECK(paged.at("hbm_kv_used_peak_gib") == Approx(276 * block_bytes / (1 << 30)));
  const auto notes = kvtier::serving::simulate(run).notes;
  CHECK(std::any_of(notes.begin(), notes.end(), [](const std::string& note) {
    return note.find("KV memory in blocks of 16 tokens (memory.kv_block_tokens): 277 blocks") !=
           std::string::npos;
  }));
}

TEST_CASE("whole-request reservations reserve whole blocks", "[serving]") {
  // 100 + 29 tokens a request: it holds at most 128 tokens of KV (its last token's is never
  // written), two 64-token blocks. The largest batch is the capacity's whole blocks over two
  // blocks a request.
  const std::vector<std::string> sets = {"workload.closed_loop.prompt_tokens.fixed_tokens=100",
                                         "workload.closed_loop.output_tokens.fixed_tokens=29"};
  std::vector<std::string> paged_sets = sets;
  paged_sets.emplace_back("memory.kv_block_tokens=64");
  const RunSpec run = run_with(paged_sets);
  kvtier::sim::Simulator simulator;
  const kvtier::serving::ServingEngine engine(
      simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
  const double token_bytes = engine.memory().kv_bytes_per_token;
  CHECK(engine.hbm_reservation(0) == 128 * token_bytes);
  const double blocks = engine.memory().kv_capacity_bytes / (64 * token_bytes);
  CHECK(blocks == std::floor(blocks));
  CHECK(metrics(run).at("largest_batch_that_fits") == std::floor(blocks / 2));
  // One token more takes a third block.
  std::vector<std::string> longer = paged_sets;
  longer.emplace_back("workload.closed_loop.output_tokens.fixed_tokens=30");
  const RunSpec longer_run = run_with(longer);
  kvtier::sim::Simulator longer_simulator;
  const kvtier::serving::ServingEngine longer_engine(
      longer_simulator, longer_run,
      kvtier::serving::make_workload(longer_run.workload(), longer_run.seed()));
  CHECK(longer_engine.hbm_reservation(0) == 192 * token_bytes);
  const RunSpec by_token = run_with(sets);
  kvtier::sim::Simulator other;
  const kvtier::serving::ServingEngine unpaged(
      other, by_token, kvtier::serving::make_workload(by_token.workload(), by_token.seed()));
  CHECK(unpaged.hbm_reservation(0) == 128 * token_bytes);
}

TEST_CASE("with a sliding window a paged request reserves the most blocks its window spans",
          "[serving]") {
  // A 1,000-token window in 16-token blocks: 63 blocks when it starts a block's 0th to 8th
  // token, 64 from its 9th on (999 = 62 · 16 + 7), which a context of 1,009 tokens reaches.
  const std::vector<std::string> window = {"model.sliding_window=1000",
                                           "workload.closed_loop.prompt_tokens.fixed_tokens=900",
                                           "memory.kv_block_tokens=16"};
  const auto reservation = [&window](const std::string& output) {
    std::vector<std::string> sets = window;
    sets.push_back("workload.closed_loop.output_tokens.fixed_tokens=" + output);
    const RunSpec run = run_with(sets);
    kvtier::sim::Simulator simulator;
    const kvtier::serving::ServingEngine engine(
        simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
    return engine.hbm_reservation(0) / engine.memory().kv_bytes_per_token;
  };
  CHECK(reservation("50") == 960);     // 949 tokens: 60 blocks, inside the window
  CHECK(reservation("101") == 1008);   // 1,000 tokens, the window from position 0: 63 blocks
  CHECK(reservation("109") == 1008);   // 1,008 tokens: the window starts at 8, still 63
  CHECK(reservation("110") == 1024);   // 1,009 tokens: it starts at 9 and spans 64
  CHECK(reservation("2000") == 1024);  // never more
  // And it runs: the window's blocks are what it holds.
  std::vector<std::string> sets = window;
  sets.emplace_back("workload.closed_loop.output_tokens.fixed_tokens=200");
  const auto values = metrics(run_with(sets));
  CHECK(values.at("requests_completed") == 8);
  CHECK(values.at("output_tokens") == 8 * 200);
}

TEST_CASE("preemption by swapping copies the KV out and back in, and the request resumes",
          "[serving]") {
  // The two requests above in 16-token blocks, now swapped: the second is swapped out at
  // g = 209 with its 2,208 tokens (138 blocks) of KV, waits until the first finishes (iteration
  // 500), is swapped in and decodes its other 291 tokens: 791 iterations again, without a
  // prefill.
  std::vector<std::string> sets = two_requests_short_of_kv();
  sets.emplace_back("workload.on_demand_admission.watermark=0.01");
  sets.emplace_back("memory.kv_block_tokens=16");
  const auto recomputing = metrics(run_with(sets));
  sets.emplace_back("workload.on_demand_admission.swap.space_gib=1");
  const RunSpec run = run_with(sets);
  const auto values = metrics(run);
  CHECK(values.at("iterations") == 791);
  CHECK(values.at("preemptions") == 1);
  CHECK(values.at("swapped_preemptions") == 1);
  CHECK(values.at("preempted_kv_tokens") == 0);
  CHECK(values.at("requests_completed") == 2);
  // 2,208 tokens of 128 KiB each way, one copy per 16-token block of each layer's keys or
  // values (138 blocks, 32 layers), before the forward passes of iterations 209 and 501.
  kvtier::sim::Simulator simulator;
  const kvtier::serving::ServingEngine engine(
      simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
  const double bytes = 2208 * engine.memory().kv_bytes_per_token;
  CHECK(values.at("swap_out_gb") == Approx(bytes / 1e9));
  CHECK(values.at("swap_in_gb") == Approx(bytes / 1e9));
  CHECK(values.at("pcie_d2h_gb") == values.at("swap_out_gb"));
  CHECK(values.at("pcie_h2d_gb") == values.at("swap_in_gb"));
  const kvtier::serving::CopyRates rates = kvtier::serving::measure_swap_rates(run);
  const std::uint64_t copies = 2 * 32 * 138;
  const Tick swaps =
      kvtier::serving::swap_time(bytes, copies, rates.d2h_bytes_per_s, rates.d2h_setup) +
      kvtier::serving::swap_time(bytes, copies, rates.h2d_bytes_per_s, rates.h2d_setup);
  CHECK(rates.h2d_setup == Tick::us(5));  // the link's per-copy overhead
  CHECK(values.at("swap_s") == Approx(kvtier::sim::to_seconds(swaps)).epsilon(1e-12));
  CHECK(values.at("copy_wait_s") == values.at("swap_s"));
  CHECK(values.at("swap_space_used_peak_gib") == Approx(bytes / (1 << 30)).epsilon(1e-3));
  // The swap space comes out of the GPU's share of host memory.
  CHECK(values.at("swap_space_gib") == 1.0);
  CHECK(values.at("host_kv_capacity_gib") == Approx(recomputing.at("host_kv_capacity_gib") - 1));
  // Against the recompute: the same iterations, the second request's 2,209-token prefill
  // traded for the copies. The first request's decodes alone cost the same either way.
  CHECK(values.at("iterations") == recomputing.at("iterations"));
  CHECK(values.at("duration_s") != recomputing.at("duration_s"));
}

TEST_CASE("a run built in code that swaps without KV blocks is refused", "[serving]") {
  RunSpec run = run_with({"workload.on_demand_admission.watermark=0.01"});
  run.mutable_workload()->mutable_on_demand_admission()->mutable_swap()->set_space_gib(1);
  kvtier::sim::Simulator simulator;
  CHECK_THROWS_AS(kvtier::serving::ServingEngine(
                      simulator, run, kvtier::serving::make_workload(run.workload(), run.seed())),
                  kvtier::ConfigError);
  CHECK_THROWS_WITH(kvtier::serving::simulate(run),
                    Catch::Contains("preemption by swapping copies whole KV blocks"));
}

TEST_CASE("a swap space too small for the victim recomputes it instead", "[serving]") {
  std::vector<std::string> sets = two_requests_short_of_kv();
  sets.emplace_back("workload.on_demand_admission.watermark=0.01");
  sets.emplace_back("memory.kv_block_tokens=16");
  const auto recomputing = metrics(run_with(sets));
  // 0.25 GiB holds 2,048 tokens of KV, not the 2,208 the victim holds.
  sets.emplace_back("workload.on_demand_admission.swap.space_gib=0.25");
  const RunSpec run = run_with(sets);
  const auto values = metrics(run);
  CHECK(values.at("preemptions") == 1);
  CHECK(values.at("swapped_preemptions") == 0);
  // Where vLLM V0 would abort, the report says so.
  const auto notes = kvtier::serving::simulate(run).notes;
  CHECK(std::any_of(notes.begin(), notes.end(), [](const std::string& note) {
    return note.find("1 of 1 preempted requests did not fit the free swap space") !=
           std::string::npos;
  }));
  CHECK(values.at("swap_out_gb") == 0.0);
  CHECK(values.at("swap_s") == 0.0);
  for (const char* name :
       {"iterations", "duration_s", "preempted_kv_tokens", "ttft_p99_ms", "e2e_latency_p99_ms"}) {
    INFO(name);
    CHECK(values.at(name) == recomputing.at(name));
  }
}

TEST_CASE("each GPU's T1/T2 gets its share of host memory, whatever the TP degree", "[serving]") {
  // A GPU's host bytes are its share of the KV heads, so its share of the DDR is per GPU:
  // 1,536 GiB over 8 GPUs, at TP 1 as at TP 4.
  CHECK(metrics(run_with({})).at("host_kv_capacity_gib") == 192.0);
  CHECK(metrics(run_with({"tensor_parallel_degree=4"})).at("host_kv_capacity_gib") == 192.0);
}

TEST_CASE("on-demand admission without memory pressure runs exactly as reservations do",
          "[serving]") {
  const auto reserving = metrics(run_with({}));
  const auto on_demand = metrics(run_with({"workload.on_demand_admission.watermark=0.01"}));
  CHECK(on_demand.at("preemptions") == 0);
  for (const char* name :
       {"iterations", "duration_s", "ttft_p50_ms", "tpot_p50_ms", "e2e_latency_p99_ms",
        "queue_wait_p99_ms", "hbm_kv_used_peak_gib", "max_running_requests", "output_tokens"}) {
    INFO(name);
    CHECK(on_demand.at(name) == reserving.at(name));
  }
  // What it holds rather than what whole lives would take: the same here, where the four
  // requests of each wave start and end together and so all hold their whole lives at their
  // last step; less where their lives end apart.
  CHECK(on_demand.at("hbm_kv_reserved_peak_gib") ==
        Approx(reserving.at("hbm_kv_reserved_peak_gib")).epsilon(1e-12));
  const std::vector<std::string> apart = {
      "workload.closed_loop.output_tokens.uniform.min_tokens=2",
      "workload.closed_loop.output_tokens.uniform.max_tokens=64"};
  std::vector<std::string> apart_on_demand = apart;
  apart_on_demand.emplace_back("workload.on_demand_admission.watermark=0.01");
  CHECK(metrics(run_with(apart_on_demand)).at("hbm_kv_reserved_peak_gib") <
        metrics(run_with(apart)).at("hbm_kv_reserved_peak_gib"));
}

TEST_CASE("on-demand admission lets a request run alone whatever the watermark", "[serving]") {
  // A 4,000-token request in one 3,900-token chunk: more than half the KV capacity, held back by
  // a watermark of 0.5 if anything else ran.
  const auto values = metrics(run_with(
      {"hardware.node.gpu.memory_capacity=18.5GiB", "workload.closed_loop.concurrency=2",
       "workload.closed_loop.num_requests=2",
       "workload.closed_loop.prompt_tokens.fixed_tokens=3900",
       "workload.closed_loop.output_tokens.fixed_tokens=100", "workload.prefill_chunk_tokens=4096",
       "workload.on_demand_admission.watermark=0.5"}));
  CHECK(values.at("requests_completed") == 2);
  CHECK(values.at("max_running_requests") == 1);
  CHECK(values.at("preemptions") == 0);
}

TEST_CASE("the batch cap limits running requests", "[serving]") {
  const auto values =
      metrics(run_with({"workload.closed_loop.concurrency=16",
                        "workload.closed_loop.num_requests=16", "workload.max_batch_size=5"}));
  CHECK(values.at("max_running_requests") == 5);
  CHECK(values.at("requests_completed") == 16);
}

TEST_CASE("weights that do not fit are a config error with the memory breakdown", "[serving]") {
  const RunSpec run = run_with({"model.preset=Llama-3.1-70B"});
  try {
    (void)kvtier::serving::simulate(run);
    FAIL("expected an error");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(error.what(),
               Catch::Contains("nothing can run") && Catch::Contains("weights 131.") &&
                   Catch::Contains("of 79.60 GiB") && Catch::Contains("raise the TP degree"));
  }
  // A node without the GPUs for a higher degree is told to go over more nodes where its GPUs
  // have an NVLink switch, and otherwise to use a node with more GPUs.
  const std::vector<std::string> one_gpu = {"model.preset=Llama-3.1-70B",
                                            "hardware.node.gpus_per_node=1",
                                            "hardware.node.gpus_per_pcie_switch=1"};
  try {
    (void)kvtier::serving::simulate(run_with(one_gpu));
    FAIL("expected an error");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(error.what(),
               Catch::Contains("nothing can run") &&
                   Catch::Contains("raise the TP degree over more nodes (hardware.num_nodes, "
                                   "hardware.network)"));
  }
  auto alone = one_gpu;
  alone.push_back("hardware.node.gpu_interconnect=SINGLE_GPU");
  try {
    (void)kvtier::serving::simulate(run_with(alone));
    FAIL("expected an error");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(error.what(), Catch::Contains("nothing can run") &&
                                 Catch::Contains("has 1 GPU(s)") &&
                                 !Catch::Contains("raise the TP degree"));
  }
  CHECK_THROWS_WITH(kvtier::serving::simulate(
                        run_with({"workload.closed_loop.prompt_tokens.fixed_tokens=200000"})),
                    Catch::Contains("positions"));
}

TEST_CASE("a request too long for the model is named by its request file's line", "[serving]") {
  const RunSpec run = run_with({});
  kvtier::serving::Workload workload;
  workload.request_file = "requests.csv";
  workload.requests = kvtier::serving::parse_request_file(
      "arrival_s,prompt_tokens,output_tokens\n0,100,10\n# a long one\n1,200000,10\n",
      workload.request_file, kvtier::config::KVTIER_CSV, 1.0);
  kvtier::sim::Simulator simulator;
  CHECK_THROWS_WITH(kvtier::serving::ServingEngine(simulator, run, workload),
                    Catch::Contains("the request at requests.csv:4 has 200010 tokens") &&
                        Catch::Contains("positions"));
  // Generated requests have no line: they are named by their index.
  workload.request_file.clear();
  CHECK_THROWS_WITH(kvtier::serving::ServingEngine(simulator, run, workload),
                    Catch::StartsWith("request 1 has 200010 tokens"));
}

TEST_CASE("tensor parallelism splits the weights and speeds up decoding", "[serving]") {
  const auto tp1 = metrics(run_with({}));
  const auto tp2 = metrics(run_with({"tensor_parallel_degree=2"}));
  CHECK(tp2.at("hbm_weights_gib") == Approx(tp1.at("hbm_weights_gib") / 2));
  CHECK(tp2.at("tpot_mean_ms") < tp1.at("tpot_mean_ms"));
  CHECK(tp2.count("nvlink_utilisation") == 1);
  CHECK(tp2.at("engines_per_node") == 4);
}

TEST_CASE("the same config and seed give byte-identical reports", "[serving]") {
  const RunSpec run =
      run_with({"workload.poisson.rate_per_s=20", "workload.poisson.num_requests=40",
                "workload.poisson.prompt_tokens.uniform.min_tokens=50",
                "workload.poisson.prompt_tokens.uniform.max_tokens=400",
                "workload.poisson.output_tokens.lognormal.median_tokens=60",
                "workload.poisson.output_tokens.lognormal.sigma=0.5",
                "workload.poisson.output_tokens.lognormal.min_tokens=1",
                "workload.poisson.output_tokens.lognormal.max_tokens=500",
                "outputs.timeseries_interval_us=100000"});
  REQUIRE(run.workload().has_poisson());
  const std::string first =
      kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v");
  const std::string second =
      kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v");
  CHECK(first == second);
  CHECK_THAT(first, Catch::Contains("\"hbm_kv_used_gib\""));
  RunSpec reseeded = run;
  reseeded.set_seed(run.seed() + 1);
  CHECK(kvtier::serving::report_json({kvtier::serving::simulate(reseeded)}, reseeded, "v") !=
        first);
}

TEST_CASE("times out of the simulator's range and endless time series are config errors",
          "[serving]") {
  const auto config_error = [](const std::string& set) -> std::string {
    try {
      (void)kvtier::serving::simulate(run_with({set}));
    } catch (const kvtier::ConfigError& error) {
      return error.what();
    }
    return "no config error";
  };
  // An overhead or a bandwidth that puts simulated time past the picosecond clock's ~106 days.
  for (const std::string set : {"engine.iteration_overhead_us=1e20",
                                "hardware.node.gpu.memory_bandwidth_gb_per_s=1e-300"}) {
    INFO(set);
    CHECK_THAT(config_error(set),
               Catch::Contains("beyond ±106 days") && Catch::Contains("out of range"));
  }
  // 0.75 us over the run's second of serving is 1.25 million samples (a 1 ps interval would
  // sample without end); a series stops at a million.
  CHECK_THAT(config_error("outputs.timeseries_interval_us=0.75"),
             Catch::Contains("timeseries_interval_us 0.75 takes more than 1000000 samples"));
}
