// Speculative decoding in the serving engine (engine.speculative): what a step gives, what it
// costs, its memory and its refusals.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "configs/pools.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/cluster.hpp"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"
#include "serving/workload.hpp"
#include "sim/tick.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"
#include "tests/support/speculative_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::ServingEngine;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;

using kvtier::test::speculative_sets;

namespace {

// The test run drafting `drafts` tokens a step accepted with probability `acceptance`.
RunSpec speculating(std::uint32_t drafts, double acceptance, std::vector<std::string> extra = {}) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(),
                                          speculative_sets(drafts, acceptance, std::move(extra)));
}

}  // namespace

TEST_CASE("a step gives the drafts it accepts and one token more, none past the last",
          "[speculative]") {
  // A 512-token prompt and 13 output tokens: the prefill gives the first. Every draft accepted,
  // three a step: 4 + 4 + 4 tokens in three steps. None accepted: a token a step, 12 steps.
  const auto all = serve(speculating(3, 1.0), open_loop({request_at(0, 512, 13)}));
  const ServingEngine& every = all->cluster->engine(0);
  CHECK(every.totals().iterations == 1 + 3);
  CHECK(every.totals().speculative_steps == 3);
  CHECK(every.totals().speculative_tokens == 12);
  CHECK(every.totals().output_tokens == 13);
  const auto none = serve(speculating(3, 0.0), open_loop({request_at(0, 512, 13)}));
  const ServingEngine& rejected = none->cluster->engine(0);
  CHECK(rejected.totals().iterations == 1 + 12);
  CHECK(rejected.totals().speculative_tokens == 12);
  // Near its end a step drafts no more than it has tokens left after the newest: of 15 output
  // tokens, 14 are left after the prefill, then 10 and 6 (three drafts each), then 2 (one).
  const auto ragged = serve(speculating(3, 1.0), open_loop({request_at(0, 512, 15)}));
  CHECK(ragged->cluster->engine(0).totals().speculative_steps == 4);
  CHECK(ragged->cluster->engine(0).totals().speculative_tokens == 14);
}

TEST_CASE("a step costs the drafter's passes before the verifying pass", "[speculative]") {
  // Two drafts none of which is accepted, 4 output tokens: the first step drafts two (passes
  // attending 513 and 514 tokens), the second one (514), the third none.
  const RunSpec run = speculating(2, 0.0);
  const auto served = serve(run, open_loop({request_at(0, 512, 4)}));
  const ServingEngine& engine = served->cluster->engine(0);
  const auto pass = [&](std::uint64_t context) {
    const kvtier::hw::IterationCost cost =
        engine.cost_model().cost(kvtier::test::decode(1, context));
    return cost.layer + cost.head;
  };
  CHECK(engine.totals().speculative_steps == 3);
  CHECK(engine.totals().draft_busy == pass(513) + pass(514) + pass(514));
  // The verifying passes: the newest token and its drafts over the request's KV.
  const auto verify = [&](std::uint64_t context, std::uint64_t drafts) {
    kvtier::hw::BatchShape step = kvtier::test::decode(1, context);
    step.decode_draft_tokens = drafts;
    step.logits_tokens += drafts;
    return engine.cost_model().cost(step).total;
  };
  const kvtier::hw::BatchShape prompt = kvtier::test::prefill(512, 0);
  CHECK(engine.totals().busy == engine.cost_model().cost(prompt).total + verify(513, 2) +
                                    verify(514, 1) + verify(515, 0) + engine.totals().draft_busy);
}

TEST_CASE("speculation's steps follow the run's seed and give the tokens their rate promises",
          "[speculative]") {
  // 64 requests of 257 output tokens, four drafts accepted with probability 0.6: a step gives
  // (1 - 0.6^5) / 0.4 = 2.31 tokens on average, fewer near a request's end.
  std::vector<kvtier::serving::RequestSpec> requests;
  for (int i = 0; i < 64; ++i) {
    requests.push_back(request_at(0.01 * i, 256, 257));
  }
  const RunSpec run = speculating(4, 0.6);
  const auto first = serve(run, open_loop(requests));
  const auto again = serve(run, open_loop(requests));
  const auto& totals = first->cluster->engine(0).totals();
  const double per_step = static_cast<double>(totals.speculative_tokens) /
                          static_cast<double>(totals.speculative_steps);
  CHECK(per_step == Approx((1.0 - std::pow(0.6, 5)) / 0.4).epsilon(0.03));
  CHECK(totals.speculative_tokens == 64 * 256);
  CHECK(again->cluster->engine(0).totals().speculative_steps == totals.speculative_steps);
  CHECK(again->cluster->engine(0).e2e().max() == first->cluster->engine(0).e2e().max());
  RunSpec reseeded = run;
  reseeded.set_seed(run.seed() + 1);
  const auto other = serve(reseeded, open_loop(requests));
  CHECK(other->cluster->engine(0).totals().speculative_steps != totals.speculative_steps);
}

TEST_CASE("later drafts are accepted less when acceptance decays", "[speculative]") {
  // Four drafts, the first always accepted, each later one at half the rate of the one before:
  // 1 + 1 + 1/2 + 1/8 + 1/64 tokens a step on average. A decay of 1 is no decay at all.
  std::vector<kvtier::serving::RequestSpec> requests;
  for (int i = 0; i < 64; ++i) {
    requests.push_back(request_at(0.01 * i, 256, 257));
  }
  const auto decaying =
      serve(speculating(4, 1.0, {"engine.speculative.acceptance_decay=0.5"}), open_loop(requests));
  const auto& totals = decaying->cluster->engine(0).totals();
  const double per_step = static_cast<double>(totals.speculative_tokens) /
                          static_cast<double>(totals.speculative_steps);
  CHECK(per_step == Approx(1.0 + 1.0 + 0.5 + 0.125 + 1.0 / 64).epsilon(0.03));
  CHECK(totals.speculative_tokens == 64 * 256);
  const auto undecayed =
      serve(speculating(4, 0.6, {"engine.speculative.acceptance_decay=1"}), open_loop(requests));
  const auto plain = serve(speculating(4, 0.6), open_loop(requests));
  CHECK(undecayed->cluster->engine(0).totals().speculative_steps ==
        plain->cluster->engine(0).totals().speculative_steps);
  CHECK(undecayed->cluster->engine(0).e2e().max() == plain->cluster->engine(0).e2e().max());
}

TEST_CASE("measured acceptance by position gives each draft its own rate", "[speculative]") {
  // Three drafts, the first always accepted and the second never: every step gives two tokens,
  // 12 in six steps. A list shorter than the drafts gives later ones its last entry: with [1]
  // every draft is accepted, four tokens a step.
  const auto by_position = [](const std::string& list) {
    std::vector<std::string> sets = {"engine.speculative.draft_tokens=3",
                                     "engine.speculative.draft_layers=1",
                                     "engine.speculative.acceptance_by_position=" + list};
    return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
  };
  const auto two = serve(by_position("1,0"), open_loop({request_at(0, 512, 13)}));
  CHECK(two->cluster->engine(0).totals().speculative_steps == 6);
  CHECK(two->cluster->engine(0).totals().speculative_tokens == 12);
  const auto all = serve(by_position("1"), open_loop({request_at(0, 512, 13)}));
  CHECK(all->cluster->engine(0).totals().speculative_steps == 3);
  // The rates a draft is accepted with, and the tokens a step the note expects from them.
  const RunSpec run = by_position("0.8,0.5");
  const auto& speculative = run.engine().speculative();
  CHECK(kvtier::serving::draft_acceptance(speculative, 0) == 0.8);
  CHECK(kvtier::serving::draft_acceptance(speculative, 1) == 0.5);
  CHECK(kvtier::serving::draft_acceptance(speculative, 2) == 0.5);
  const RunSpec decaying = speculating(3, 0.8, {"engine.speculative.acceptance_decay=0.5"});
  CHECK(kvtier::serving::draft_acceptance(decaying.engine().speculative(), 2) == 0.8 * 0.5 * 0.5);
  const auto note = kvtier::serving::simulate(run).notes;
  CHECK_THAT(kvtier::test::joined(note),
             Catch::Contains("accepted with probabilities 0.800, 0.500, 0.500 by position in a "
                             "row") &&
                 Catch::Contains(" (2.400 expected;"));
  // Entries past the drafts a step makes are unused: one list serves every draft count.
  const auto longer = serve(by_position("1,0,1,1"), open_loop({request_at(0, 512, 13)}));
  CHECK(longer->cluster->engine(0).totals().speculative_steps == 6);
  // A run built in code is held to the one way too.
  RunSpec neither = run;
  neither.mutable_engine()->mutable_speculative()->clear_acceptance_by_position();
  CHECK_THROWS_WITH(serve(neither, open_loop({request_at(0, 512, 13)})),
                    Catch::Contains("exactly one of acceptance_rate and acceptance_by_position"));
}

TEST_CASE("acceptance is given one way", "[speculative]") {
  const auto problems = [](std::vector<std::string> sets) {
    sets.insert(sets.begin(),
                {"engine.speculative.draft_tokens=2", "engine.speculative.draft_layers=1"});
    return kvtier::test::joined(
        kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), sets));
  };
  CHECK_THAT(problems({}), Catch::Contains("engine.speculative.acceptance_rate") &&
                               Catch::Contains("missing required field 'acceptance_rate'"));
  CHECK_THAT(problems({"engine.speculative.acceptance_decay=0.9"}),
             Catch::Contains("missing required field 'acceptance_rate'"));
  CHECK_THAT(
      problems({"engine.speculative.acceptance_rate=0.7",
                "engine.speculative.acceptance_by_position=0.8,0.6"}),
      Catch::Contains("engine.speculative.acceptance_rate") && Catch::Contains("both given"));
  std::string seventeen = "engine.speculative.acceptance_by_position=1";
  for (int entry = 1; entry < 17; ++entry) {
    seventeen += ",1";
  }
  CHECK_THAT(problems({seventeen}), Catch::Contains("17 entries: at most 16"));
  CHECK_THAT(problems({"engine.speculative.acceptance_by_position=0.8,0.6",
                       "engine.speculative.acceptance_decay=0.9"}),
             Catch::Contains("engine.speculative.acceptance_decay"));
  CHECK_THAT(problems({"engine.speculative.acceptance_by_position=0.8,1.5"}),
             Catch::Contains("acceptance_by_position[1]") && Catch::Contains("out of range"));
  CHECK(problems({"engine.speculative.acceptance_by_position=0.8,0.6"}).empty());
}

TEST_CASE("a step's drafts take the token budget", "[speculative]") {
  // A budget of 32 tokens a step and 8 requests decoding: with three drafts each they take it
  // all, and a prompt arriving meanwhile waits until one of them has finished; with none
  // (draft_tokens 0) it gets 24 tokens a step beside them.
  std::vector<kvtier::serving::RequestSpec> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(request_at(0, 16, 200));
  }
  requests.push_back(request_at(0.5, 64, 400));
  const auto run_with = [&](std::uint32_t drafts) {
    return serve(speculating(drafts, 0.0, {"workload.prefill_chunk_tokens=32"}),
                 open_loop(requests));
  };
  // The late prompt's first token (the longest TTFT), against the first decoder's last token
  // (the shortest E2E: the late request decodes longest).
  const auto first_token_and_first_done = [](const kvtier::serving::Cluster& cluster) {
    const ServingEngine& engine = cluster.engine(0);
    REQUIRE(engine.totals().requests_completed == 9);
    return std::pair{Tick::ms(500) + engine.ttft().max(), engine.e2e().min()};
  };
  const auto [drafting_first, drafting_done] = first_token_and_first_done(*run_with(3)->cluster);
  CHECK(drafting_first > drafting_done);
  const auto [plain_first, plain_done] = first_token_and_first_done(*run_with(0)->cluster);
  CHECK(plain_first < plain_done);
}

TEST_CASE("under on-demand admission a step's drafts count in its footprint", "[speculative]") {
  // Two 500-token prompts decoding 8 and 100 tokens, eight drafts a step none of which is
  // accepted. The first request's step drafts up to its end (500 + 7 tokens at most); at its
  // last step the second, a step behind, holds 500 + 6 and writes 8 drafts: the most the
  // iteration plans is 507 + 514 tokens' KV.
  const auto served = serve(speculating(8, 0.0, {"workload.on_demand_admission.watermark=0.01"}),
                            open_loop({request_at(0, 500, 8), request_at(0, 500, 100)}));
  const ServingEngine& engine = served->cluster->engine(0);
  REQUIRE(engine.totals().requests_completed == 2);
  CHECK(engine.kv_reserved().max() ==
        Approx(engine.memory().kv_bytes_for(507) + engine.memory().kv_bytes_for(514)));
}

TEST_CASE("speculative decoding where it is not modelled is refused", "[speculative]") {
  const auto refused = [&](std::vector<std::string> sets, const std::string& why) {
    const std::string text = kvtier::test::joined(kvtier::test::problems<RunSpec>(
        kvtier::test::quickstart_run(), speculative_sets(2, 0.8, std::move(sets))));
    INFO(text);
    CHECK_THAT(text, Catch::Contains("field engine.speculative") && Catch::Contains(why));
  };
  refused({"pipeline_parallel_degree=2"}, "pipeline_parallel_degree 2");
  // A draft count out of range is refused by its bounds.
  CHECK_FALSE(
      kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), speculative_sets(17, 0.8))
          .empty());
}

TEST_CASE("with data-parallel attention each GPU verifies its own requests' drafts",
          "[speculative]") {
  // DeepSeek-V2-Lite over two GPUs, attention split by requests: a 256-token prompt and 13
  // output tokens, three drafts a step all accepted. Its steps cost the drafter's passes and the
  // verifying passes as the engine's cost model gives them, one GPU attending the request. The
  // config is accepted (load_spec checks it as `kvtier sim` does).
  const RunSpec run = speculating(3, 1.0,
                                  {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                   "engine.data_parallel_attention=true"});
  const auto served = serve(run, open_loop({request_at(0, 256, 13)}));
  const ServingEngine& engine = served->cluster->engine(0);
  REQUIRE(engine.totals().requests_completed == 1);
  CHECK(engine.totals().iterations == 1 + 3);
  CHECK(engine.totals().speculative_tokens == 12);
  const auto pass = [&](std::uint64_t context) {
    const kvtier::hw::IterationCost cost =
        engine.cost_model().cost(kvtier::test::decode(1, context));
    return cost.layer + cost.head;  // the drafter: one layer
  };
  CHECK(engine.totals().draft_busy == pass(257) + pass(258) + pass(259) + pass(261) + pass(262) +
                                          pass(263) + pass(265) + pass(266) + pass(267));
  const auto verify = [&](std::uint64_t context) {
    kvtier::hw::BatchShape step = kvtier::test::decode(1, context);
    step.decode_draft_tokens = 3;
    step.logits_tokens += 3;
    return engine.cost_model().cost(step).total;
  };
  CHECK(engine.totals().busy == engine.cost_model().cost(kvtier::test::prefill(256, 0)).total +
                                    verify(257) + verify(261) + verify(265) +
                                    engine.totals().draft_busy);
  // Each GPU holds the drafter's attention whole, as it does the model's.
  const RunSpec by_heads =
      speculating(3, 1.0, {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2"});
  CHECK(kvtier::serving::plan_memory(run).drafter_weights_bytes >
        kvtier::serving::plan_memory(by_heads).drafter_weights_bytes);
}

TEST_CASE("in a disaggregated cluster the decode engines speculate", "[speculative]") {
  const RunSpec run = kvtier::test::split_run(2, 1, speculative_sets(2, 1.0));
  const auto served = serve(run, open_loop({request_at(0, 512, 7)}));
  const auto& prefill = served->cluster->engine(0);
  const auto& decode = served->cluster->engine(1);
  CHECK(prefill.totals().speculative_steps == 0);
  // Tokens 2 to 7 in two steps of three.
  CHECK(decode.totals().speculative_steps == 2);
  CHECK(decode.totals().iterations == 2);
  CHECK(decode.totals().requests_completed == 1);
}

TEST_CASE("a speculating run reports its tokens a step and its drafter's time", "[speculative]") {
  const auto plain = kvtier::test::serving_metrics(
      kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run()));
  CHECK(plain.count("speculative_tokens_per_step") == 0);
  const auto metrics = kvtier::test::serving_metrics(speculating(3, 0.7));
  CHECK(metrics.at("speculative_tokens_per_step") > 1.0);
  CHECK(metrics.at("speculative_tokens_per_step") < 4.0);
  CHECK(metrics.at("speculative_draft_busy_fraction") > 0.0);
  CHECK(metrics.at("speculative_draft_busy_fraction") < 1.0);
  CHECK(metrics.at("output_tokens") == plain.at("output_tokens"));
}

TEST_CASE("a speculating engine caches prefixes as one decoding a token a step does",
          "[speculative]") {
  // Two requests of one 1,024-token prefix and 128 tokens of their own, the second arriving once
  // the first has finished: it finds the prefix's 64 blocks cached, and both decode their 32
  // tokens, four a step.
  std::vector<kvtier::serving::RequestSpec> requests;
  for (const double at : {0.0, 10.0}) {
    kvtier::serving::RequestSpec spec = request_at(at, 1152, 33);
    spec.shared_tokens = spec.segment_tokens = 1024;
    spec.segments = {1};
    requests.push_back(spec);
  }
  const auto served =
      serve(speculating(3, 1.0, {"memory.kv_block_tokens=16", "memory.prefix_caching=true"}),
            open_loop(requests));
  const ServingEngine& engine = served->cluster->engine(0);
  CHECK(engine.totals().requests_completed == 2);
  CHECK(engine.totals().output_tokens == 66);
  CHECK(engine.totals().speculative_steps == 2 * 8);
  CHECK(engine.totals().prefix_hit_tokens == 1024);
}

TEST_CASE("a speculating request swapped out resumes where it stopped", "[speculative]") {
  // 2 GiB of KV for eight requests of 2k + 2k tokens admitted on demand: some are swapped out
  // and back in, and every one still gives its tokens, a step at a time from where it stopped.
  std::vector<kvtier::serving::RequestSpec> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(request_at(0, 2048, 2048));
  }
  const auto served =
      serve(speculating(3, 0.7,
                        {"hardware.node.gpu.memory_capacity_gib=20", "memory.kv_block_tokens=16",
                         "workload.on_demand_admission.watermark=0.01",
                         "workload.on_demand_admission.swap.space_gib=8"}),
            open_loop(requests));
  const ServingEngine& engine = served->cluster->engine(0);
  REQUIRE(engine.totals().swapped_preemptions > 0);
  CHECK(engine.totals().preemptions == engine.totals().swapped_preemptions);
  CHECK(engine.totals().requests_completed == 8);
  CHECK(engine.totals().output_tokens == 8 * 2048);
  CHECK(engine.totals().speculative_tokens == 8 * 2047);
}

TEST_CASE("a speculating engine holds its drafter's weights and its drafter's KV in HBM",
          "[speculative]") {
  // Llama-3.1-8B at TP 1: one decoder layer is q and o (4,096 x 4,096 each), k and v (4,096 x
  // 1,024 each), the MLP (3 x 4,096 x 14,336) and two norms of 4,096, in 16 bits; its KV a
  // token is 2 x 8 heads x 128 x 2 bytes. The drafter shares the embedding and the LM head.
  const double layer_weights =
      2.0 * (2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336 + 2.0 * 4096);
  const double layer_kv = 2.0 * 8 * 128 * 2;
  const RunSpec plain_run = kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run());
  const kvtier::serving::MemoryPlan plain = kvtier::serving::plan_memory(plain_run);
  const kvtier::serving::MemoryPlan drafting = kvtier::serving::plan_memory(speculating(3, 0.7));
  CHECK(plain.drafter_weights_bytes == 0.0);
  CHECK(drafting.drafter_weights_bytes == Approx(layer_weights).epsilon(1e-12));
  CHECK(drafting.kv_capacity_bytes ==
        Approx(plain.kv_capacity_bytes - layer_weights).epsilon(1e-12));
  CHECK(drafting.kv_bytes_per_token == plain.kv_bytes_per_token + layer_kv);
  CHECK(drafting.drafter_kv_bytes_for(100) == Approx(100 * layer_kv).epsilon(1e-12));
  CHECK_THAT(drafting.breakdown(), Catch::Contains("+ drafter 0.41 GiB +"));
  // Drafting nothing, the baseline of a sweep over draft counts holds no drafter.
  const kvtier::serving::MemoryPlan none = kvtier::serving::plan_memory(speculating(0, 0.7));
  CHECK(none.drafter_weights_bytes == 0.0);
  CHECK(none.kv_bytes_per_token == plain.kv_bytes_per_token);
  // Reported: the drafter's weights, and the HBM peak with them.
  const auto metrics = kvtier::test::serving_metrics(speculating(3, 0.7));
  CHECK(metrics.at("speculative_drafter_weights_gib") ==
        Approx(layer_weights / (1U << 30U)).margin(5e-4));
  CHECK(metrics.at("hbm_peak_gib") ==
        Approx(metrics.at("hbm_weights_gib") + metrics.at("speculative_drafter_weights_gib") +
               metrics.at("hbm_workspace_gib") + metrics.at("hbm_reserve_gib") +
               metrics.at("hbm_kv_reserved_peak_gib"))
            .margin(2e-2));
}

TEST_CASE("a drafter's weights are a layer of the model's as the engine splits it",
          "[speculative]") {
  // DeepSeek-V3 at TP 8 in FP8: its MTP module is one experts layer (attention, 256 routed
  // experts and the shared one, the router, two norms), split over the eight GPUs but for what
  // each keeps whole (the router and latent attention's down-projections).
  const RunSpec v3 = kvtier::test::load_spec<RunSpec>(
      kvtier::test::quickstart_run(),
      speculative_sets(1, 0.875,
                       {"model.preset=DeepSeek-V3", "hardware.node.preset=hgx-h200-8",
                        "tensor_parallel_degree=8"}));
  const auto count = kvtier::hw::count_parameters(v3.model());
  const double layers = v3.model().num_hidden_layers();
  const double experts_layers = layers - static_cast<double>(count.dense_mlp_layers);
  const double latent_per_layer =
      (static_cast<double>(count.replicated) - experts_layers * static_cast<double>(count.router)) /
      layers;
  const double whole = static_cast<double>(count.router) + latent_per_layer;
  const double layer =
      static_cast<double>(count.attention_per_layer + count.mlp_per_layer + count.norms_per_layer);
  const double expected = ((layer - whole) / 8 + whole) * 1.0;  // FP8: a byte a weight
  CHECK(kvtier::serving::plan_memory(v3).drafter_weights_bytes == Approx(expected).epsilon(1e-9));
  // A disaggregated cluster's prefill engines hold the drafter too (its KV is sent with the
  // prompt's), one layer over their tensor-parallel group whatever their pipeline stages.
  const RunSpec split = kvtier::test::split_run(
      2, 1,
      speculative_sets(2, 0.7,
                       {"cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree=3"}));
  const kvtier::serving::MemoryPlan decode = kvtier::serving::plan_memory(split);
  const kvtier::serving::MemoryPlan prefill =
      kvtier::serving::plan_memory(kvtier::config::prefill_pool_run(split));
  REQUIRE(decode.drafter_weights_bytes > 0.0);
  CHECK(prefill.drafter_weights_bytes == Approx(decode.drafter_weights_bytes).epsilon(1e-12));
}
