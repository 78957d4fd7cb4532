// A tier policy with data-parallel dispatch: each GPU copies its own requests' KV over its own
// link, and every layer waits for the GPU that, its copy in, ends its own part last.
#include <catch2/catch.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "serving/tier_timing.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/speculative_runs.hpp"
#include "tests/support/tiered_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::CopyRates;
using kvtier::serving::LayerCopies;
using kvtier::serving::ServingEngine;
using kvtier::serving::time_pipeline;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::TieredServed;

namespace {

// 1 GB/s each way, with no setup unless given.
CopyRates gigabyte_rates(Tick setup = Tick::zero()) {
  CopyRates rates;
  rates.h2d_bytes_per_s = rates.t2_h2d_bytes_per_s = 1e9;
  rates.d2h_bytes_per_s = rates.t2_d2h_bytes_per_s = 1e9;
  rates.h2d_setup = rates.t2_h2d_setup = setup;
  rates.d2h_setup = rates.t2_d2h_setup = setup;
  return rates;
}

// Four layers staging `bytes` each.
std::vector<LayerCopies> staging(double bytes) {
  std::vector<LayerCopies> layers(4);
  for (LayerCopies& layer : layers) {
    layer.staged_full = bytes;
  }
  return layers;
}

// DeepSeek-V2-Lite over two GPUs with data-parallel attention under `policy`, dispatching as
// `dispatch` says ("" for none), with `sets` after.
RunSpec lite_tiered(const std::string& policy, const std::string& dispatch,
                    std::vector<std::string> sets = {}) {
  std::vector<std::string> all = {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                  "hardware.node.gpu.memory_capacity_gib=19",
                                  "engine.data_parallel_attention=true"};
  if (!dispatch.empty()) {
    all.push_back("engine.data_parallel_dispatch=" + dispatch);
  }
  all.insert(all.end(), sets.begin(), sets.end());
  return kvtier::test::tiered_run(policy, all);
}

}  // namespace

TEST_CASE("GPUs with the same copies each copy on their own engines, as one GPU does", "[tiers]") {
  // 1 MB a layer at 1 GB/s against 2 ms layers: only layer 0 waits, on either GPU.
  const std::vector<LayerCopies> layers = staging(1e6);
  const CopyRates rates = gigabyte_rates(Tick::us(5));
  const auto one = time_pipeline(Tick::ms(2), layers, 1, rates);
  const std::span<const LayerCopies> two_gpus[] = {layers, layers};
  const auto two = time_pipeline(Tick::ms(2), two_gpus, 1, rates);
  CHECK(two.layers_end == one.layers_end);
  CHECK(two.end == one.end);
  CHECK(two.stall == one.stall);
  CHECK(two.stall == Tick::ms(1) + Tick::us(5));
  CHECK(two.h2d_busy == one.h2d_busy * 2);
}

TEST_CASE("every layer waits for the GPU whose copy arrives last", "[tiers]") {
  // GPU 0 copies nothing; GPU 1 copies 3 ms a layer against 1 ms layers, so the layers run at
  // its copy engine's pace (4 copies back to back, then the last layer), as it alone would.
  const std::vector<LayerCopies> idle(4);
  const std::vector<LayerCopies> busy = staging(3e6);
  const CopyRates rates = gigabyte_rates();
  const std::span<const LayerCopies> gpus[] = {idle, busy};
  const auto timing = time_pipeline(Tick::ms(1), gpus, 1, rates);
  CHECK(timing.layers_end == Tick::ms(13));
  CHECK(timing.layers_end == time_pipeline(Tick::ms(1), busy, 1, rates).layers_end);
  CHECK(timing.stall == Tick::ms(9));
  CHECK(timing.h2d_busy == Tick::ms(12));
  // Split between the GPUs, the same bytes are copied side by side: 1.5 ms copies back to back
  // on each GPU's engine, then the last layer.
  const std::vector<LayerCopies> half = staging(1.5e6);
  const std::span<const LayerCopies> shared[] = {half, half};
  CHECK(time_pipeline(Tick::ms(1), shared, 1, rates).layers_end == Tick::ms(7));
  // Synchronous copies: each layer waits for the slowest GPU's whole copy.
  CHECK(time_pipeline(Tick::ms(1), gpus, 0, rates).layers_end == Tick::ms(16));
}

TEST_CASE("a GPU's offloads and dequantising hold the iteration, not the other GPUs' layers",
          "[tiers]") {
  std::vector<LayerCopies> offloading(4);
  offloading[0].offloaded_full = 6e6;  // 6 ms from the start, past the 4 ms of layers
  std::vector<LayerCopies> dequantising(4);
  dequantising[2].extra_compute = Tick::us(500);
  const std::span<const LayerCopies> gpus[] = {offloading, dequantising};
  const auto timing = time_pipeline(Tick::ms(1), gpus, 1, gigabyte_rates());
  CHECK(timing.layers_end == Tick::ms(4) + Tick::us(500));
  CHECK(timing.end == Tick::ms(6));
  CHECK(timing.stall == Tick::zero());  // the dequantising is compute, not a wait for copies
  CHECK(timing.d2h_busy == Tick::ms(6));
}

TEST_CASE("with SM kernels each layer waits for the slowest GPU's staging", "[tiers]") {
  std::vector<LayerCopies> light = staging(1e6);
  std::vector<LayerCopies> heavy = staging(2e6);
  light[1].offloaded_full = 4e6;  // GPU 0's batches after the layers: 4 ms of offloads
  heavy[3].promoted_full = 1e6;   // GPU 1's: 1 ms of promotions
  CopyRates rates = gigabyte_rates();
  rates.method = kvtier::config::SM_KERNELS;
  const std::span<const LayerCopies> gpus[] = {light, heavy};
  const auto timing = time_pipeline(Tick::ms(2), gpus, 1, rates);
  CHECK(timing.layers_end == Tick::ms(16));  // 4 × (2 ms staging + 2 ms compute)
  CHECK(timing.stall == Tick::ms(8));
  CHECK(timing.trailing == Tick::ms(4));  // the longer GPU's batches
  CHECK(timing.h2d_busy == Tick::ms(4 + 8 + 1));
  CHECK(timing.d2h_busy == Tick::ms(4));
}

TEST_CASE("a GPU whose own attention is lighter delays a layer by less when its copy is late",
          "[tiers]") {
  // GPU 0 copies nothing and attends the most (the 1 ms layer); GPU 1 copies 3 ms a layer and its
  // own part is 0.5 ms lighter: each layer ends half a millisecond after GPU 1's copy arrives.
  const std::vector<LayerCopies> idle(4);
  const std::vector<LayerCopies> busy = staging(3e6);
  const CopyRates rates = gigabyte_rates();
  const std::span<const LayerCopies> gpus[] = {idle, busy};
  const Tick lighter[] = {Tick::zero(), Tick::us(500)};
  const auto timing = time_pipeline(Tick::ms(1), gpus, 1, rates, lighter);
  CHECK(timing.layers_end == Tick::ms(12) + Tick::us(500));
  // Each layer's wait beyond GPU 0's 1 ms from the previous layer's end: 2.5 ms, then 2 ms.
  CHECK(timing.stall == Tick::ms(8) + Tick::us(500));
  CHECK(timing.h2d_busy == Tick::ms(12));
  // The copying GPU the slowest: as without lighter compute.
  const Tick copier_slowest[] = {Tick::us(500), Tick::zero()};
  CHECK(time_pipeline(Tick::ms(1), gpus, 1, rates, copier_slowest).layers_end == Tick::ms(13));
  // No copy late: the layers take the slowest GPU's time.
  const std::vector<LayerCopies> small = staging(1e5);
  const std::span<const LayerCopies> early[] = {idle, small};
  CHECK(time_pipeline(Tick::ms(1), early, 1, rates, lighter).layers_end ==
        Tick::ms(4));  // GPU 0 the slowest throughout (4.1 ms without lighter compute)
  // With SM kernels each GPU's staging, then its own part.
  CopyRates kernels = gigabyte_rates();
  kernels.method = kvtier::config::SM_KERNELS;
  const std::vector<LayerCopies> light = staging(1e6);
  const std::vector<LayerCopies> heavy = staging(2e6);
  const std::span<const LayerCopies> turns[] = {light, heavy};
  const Tick heavy_lighter[] = {Tick::zero(), Tick::us(1500)};
  const auto taking_turns = time_pipeline(Tick::ms(2), turns, 1, kernels, heavy_lighter);
  CHECK(taking_turns.layers_end == Tick::ms(12));  // 4 x max(1 + 2, 2 + 0.5) ms
  CHECK(taking_turns.stall == Tick::ms(4));
  // One a GPU, within the layer.
  const Tick one[] = {Tick::zero()};
  CHECK_THROWS_AS(time_pipeline(Tick::ms(1), gpus, 1, rates, one), std::invalid_argument);
  const Tick too_light[] = {Tick::zero(), Tick::ms(2)};
  CHECK_THROWS_AS(time_pipeline(Tick::ms(1), gpus, 1, rates, too_light), std::invalid_argument);
}

TEST_CASE("a GPU's late copies hide behind another GPU's longer attention", "[tiers][serving]") {
  // Monarch stages the decoding request's cold pages every step. Alone, layer 0 waits for its
  // copy each step. While the other GPU prefills a long prompt, the chunk's attention outlasts
  // that copy: the layer ends no later for it, and those steps do not wait.
  const std::string policy = "monarch:attend=all,compression=int8,window=18,max_hot=25,page=5";
  const std::vector<std::string> sets = {"workload.prefill_chunk_tokens=2048"};
  const TieredServed alone(lite_tiered(policy, "ROUND_ROBIN", sets),
                           open_loop({request_at(0.0, 100, 64)}));
  const TieredServed beside(lite_tiered(policy, "ROUND_ROBIN", sets),
                            open_loop({request_at(0.0, 100, 64), request_at(0.0, 6000, 1)}));
  const auto& mine = beside.cluster.engine(0).totals();
  const auto& its = alone.cluster.engine(0).totals();
  REQUIRE(its.prefetch_stall > Tick::zero());
  REQUIRE(beside.cluster.engine(0).dispatched_gpu(1) == 1);
  CHECK(mine.h2d_bytes > its.h2d_bytes * 0.99);
  CHECK(mine.prefetch_stall < its.prefetch_stall);
}

TEST_CASE("GPUs' copies must cover the same layers", "[tiers]") {
  const std::vector<LayerCopies> four(4);
  const std::vector<LayerCopies> three(3);
  const std::span<const LayerCopies> gpus[] = {four, three};
  CHECK_THROWS_WITH(time_pipeline(Tick::ms(1), gpus, 1, gigabyte_rates()),
                    Catch::Contains("over 3 and 4 layers"));
  CHECK_THROWS_AS(time_pipeline(Tick::ms(1), std::span<const std::span<const LayerCopies>>(), 1,
                                gigabyte_rates()),
                  std::invalid_argument);
}

TEST_CASE("identical requests dispatched in turn under a tier policy run as the even spread",
          "[tiers][serving]") {
  // Eight identical requests at once over two GPUs, four each, every prompt in the first
  // iteration. Tiered keeps the prompt in HBM and re-tiers the generated tokens every 32 steps,
  // some into T2; with eviction, each GPU's attention reads only what its requests keep.
  // Monarch's placement offloads most of each prompt as it completes, by the prompt's GPU.
  // Each GPU's staging buffer is its own. The same with copies by SM kernels, and with two
  // drafts a step, both always accepted (so that every request steps alike).
  std::vector<kvtier::serving::RequestSpec> requests(8, request_at(0.0, 200, 300));
  const std::string tiered = "tiered:hbm=0.3,evict=0.3,compress=0.2,delta=32";
  const std::vector<std::string> budget = {"workload.prefill_chunk_tokens=4096"};
  struct Variant {
    std::string policy;
    std::vector<std::string> sets;
    bool drafts = false;
  };
  const std::vector<Variant> variants = {
      {tiered, budget},
      {"monarch:attend=all,compression=int8,window=18,max_hot=25,page=5", budget},
      {tiered, {"workload.prefill_chunk_tokens=4096", "tiering.copy_method=SM_KERNELS"}},
      {tiered, kvtier::test::speculative_sets(2, 1.0, budget), true}};
  for (const auto& [policy, sets, drafts] : variants) {
    const TieredServed even(lite_tiered(policy, "", sets), open_loop(requests));
    const auto& theirs = even.cluster.engine(0).totals();
    REQUIRE(theirs.h2d_bytes > 0.0);
    REQUIRE(theirs.d2h_bytes > 0.0);
    REQUIRE(theirs.prefetch_stall > Tick::zero());
    REQUIRE((theirs.host_recode_bytes > 0.0) == policy.starts_with("tiered"));
    REQUIRE((theirs.speculative_tokens > 0) == drafts);
    for (const std::string dispatch : {"ROUND_ROBIN", "LEAST_OUTSTANDING"}) {
      INFO(policy << " " << sets.back() << " " << dispatch);
      const TieredServed dispatched(lite_tiered(policy, dispatch, sets), open_loop(requests));
      const ServingEngine& engine = dispatched.cluster.engine(0);
      const auto& mine = engine.totals();
      CHECK(mine.iterations == theirs.iterations);
      CHECK(mine.busy == theirs.busy);
      CHECK(mine.hbm_bytes == Approx(theirs.hbm_bytes).epsilon(1e-12));
      CHECK(mine.h2d_bytes == Approx(theirs.h2d_bytes).epsilon(1e-12));
      CHECK(mine.d2h_bytes == Approx(theirs.d2h_bytes).epsilon(1e-12));
      CHECK(mine.h2d_busy == theirs.h2d_busy);
      CHECK(mine.d2h_busy == theirs.d2h_busy);
      CHECK(mine.prefetch_stall == theirs.prefetch_stall);
      CHECK(mine.host_recode_bytes == Approx(theirs.host_recode_bytes).epsilon(1e-12));
      CHECK(mine.speculative_tokens == theirs.speculative_tokens);
      CHECK(mine.draft_busy == theirs.draft_busy);
      CHECK(engine.kv_used().max() ==
            Approx(even.cluster.engine(0).kv_used().max()).epsilon(1e-12));
      // Each GPU holds what the mean GPU does, its staging buffer too.
      CHECK(engine.busiest_gpu_kv_peak().value_or(0.0) ==
            Approx(engine.kv_used().max()).epsilon(1e-12));
      CHECK(engine.e2e().percentile(100) == even.cluster.engine(0).e2e().percentile(100));
    }
  }
}

TEST_CASE("requests dispatched to one GPU wait for its copies", "[tiers][serving]") {
  // Three requests in turn over two GPUs; the second ends at once, leaving GPU 0 both long
  // ones: it stages both one's host tokens each step, where the even spread has each GPU
  // attend one. The same tokens cross PCIe in all. Layer 0 always waits for its copy, so the
  // larger copy stalls longer.
  const std::string policy = "tiered:hbm=0.2,evict=0,delta=32";
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, 600), request_at(0.0, 100, 2), request_at(0.0, 100, 600)};
  const TieredServed even(lite_tiered(policy, ""), open_loop(requests));
  const TieredServed turns(lite_tiered(policy, "ROUND_ROBIN"), open_loop(requests));
  const auto& theirs = even.cluster.engine(0).totals();
  const auto& mine = turns.cluster.engine(0).totals();
  REQUIRE(theirs.prefetch_stall > Tick::zero());
  CHECK(turns.cluster.engine(0).dispatched_gpu(2) == 0);
  CHECK(mine.h2d_bytes == Approx(theirs.h2d_bytes).epsilon(1e-12));
  CHECK(mine.prefetch_stall > theirs.prefetch_stall);
  CHECK(mine.busy > theirs.busy);
  // At the peak GPU 1 holds nothing: GPU 0 holds all the KV, its staging buffer too.
  CHECK(turns.cluster.engine(0).busiest_gpu_kv_peak().value_or(0.0) ==
        Approx(2.0 * turns.cluster.engine(0).kv_used().max()).epsilon(1e-12));
  // Long, long, short: in turn, each GPU one long one, and the copies as even as the spread's.
  const std::vector<kvtier::serving::RequestSpec> paired = {
      request_at(0.0, 100, 600), request_at(0.0, 100, 600), request_at(0.0, 100, 2)};
  const TieredServed apart(lite_tiered(policy, "ROUND_ROBIN"), open_loop(paired));
  CHECK(apart.cluster.engine(0).totals().prefetch_stall < mine.prefetch_stall);
}

TEST_CASE("on demand under a tier policy, the GPU out of its own KV memory preempts",
          "[tiers][serving]") {
  // Two requests on GPU 0 grow to about 54% of its KV each in HBM (a tenth of their older
  // generated tokens in host memory); GPU 1's two stay small. Pooled, nothing is preempted;
  // dispatched, GPU 0 preempts.
  // 18.3 GiB GPUs: 0.13 GiB of KV each, about 4,500 tokens.
  const std::vector<std::string> on_demand = {"workload.on_demand_admission.watermark=0.01",
                                              "hardware.node.gpu.memory_capacity_gib=18.3"};
  const std::string policy = "tiered:hbm=0.9,evict=0";
  const RunSpec probe = lite_tiered(policy, "", on_demand);
  const auto plan = kvtier::serving::plan_memory(probe);
  const auto grown = static_cast<std::uint64_t>(
      0.6 * plan.kv_capacity_bytes / (plan.kv_bytes_per_token * probe.tensor_parallel_degree()));
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, grown), request_at(0.0, 100, 64), request_at(0.0, 100, grown),
      request_at(0.0, 100, 64)};
  const TieredServed pooled(probe, open_loop(requests));
  CHECK(pooled.cluster.engine(0).totals().preemptions == 0);
  const TieredServed own(lite_tiered(policy, "ROUND_ROBIN", on_demand), open_loop(requests));
  CHECK(own.cluster.engine(0).totals().preemptions > 0);
  CHECK(own.cluster.engine(0).totals().requests_completed == 4);
  CHECK(own.cluster.engine(0).busiest_gpu_kv_peak().value_or(0.0) <= plan.kv_capacity_bytes);
}

TEST_CASE("a tier policy with data-parallel dispatch is accepted", "[config][tiers]") {
  const RunSpec run = lite_tiered("tiered:hbm=0.5,evict=0,delta=16", "ROUND_ROBIN");
  // The quickstart run's tiered policies (and its tier block), dispatched.
  CHECK(
      kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(),
                                      {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                       "engine.data_parallel_attention=true",
                                       "engine.data_parallel_dispatch=LEAST_OUTSTANDING"})
          .empty());
  const TieredServed served(run, open_loop({request_at(0.0, 100, 300), request_at(0.0, 100, 300)}));
  CHECK(served.cluster.engine(0).totals().requests_completed == 2);
  CHECK(served.cluster.engine(0).totals().h2d_bytes > 0.0);
}
