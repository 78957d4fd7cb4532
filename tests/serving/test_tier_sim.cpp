// The tier-aware serving simulation: a policy's replay drives each request's tiers, copies are
// pipelined against the layers, admission counts HBM and host memory.

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/engine.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_demand.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"
#include "tests/support/tiered_runs.hpp"
#include "traces/synth.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::CopyRates;
using kvtier::serving::LayerCopies;
using kvtier::serving::time_pipeline;
using kvtier::sim::Tick;
using kvtier::test::tiered_run;

namespace {

// Copy rates whose T2 kernels copy compressed bytes as the others copy theirs.
CopyRates uniform_rates(double h2d, double d2h, Tick h2d_setup, Tick d2h_setup) {
  CopyRates rates;
  rates.h2d_bytes_per_s = rates.t2_h2d_bytes_per_s = h2d;
  rates.d2h_bytes_per_s = rates.t2_d2h_bytes_per_s = d2h;
  rates.h2d_setup = rates.t2_h2d_setup = h2d_setup;
  rates.d2h_setup = rates.t2_d2h_setup = d2h_setup;
  return rates;
}

std::map<std::string, double> metrics(const RunSpec& run) {
  return kvtier::test::serving_metrics(run);
}

}  // namespace

TEST_CASE("with no copies the layers run back to back", "[tiers]") {
  const std::vector<LayerCopies> layers(4);
  const CopyRates rates = uniform_rates(1e9, 1e9, Tick::us(5), Tick::us(5));
  const auto timing = time_pipeline(Tick::us(10), layers, 1, rates);
  CHECK(timing.layers_end == Tick::us(40));
  CHECK(timing.end == Tick::us(40));
  CHECK(timing.stall == Tick::zero());
  CHECK(timing.h2d_busy == Tick::zero());
}

TEST_CASE("copies shorter than a layer hide behind compute except the first", "[tiers]") {
  // 1 MB at 1 GB/s = 1 ms + 5 us setup per layer, layers take 2 ms.
  std::vector<LayerCopies> layers(4);
  for (auto& layer : layers) {
    layer.staged_full = 1e6;
  }
  const CopyRates rates = uniform_rates(1e9, 1e9, Tick::us(5), Tick::us(5));
  const auto timing = time_pipeline(Tick::ms(2), layers, 1, rates);
  const Tick copy = Tick::ms(1) + Tick::us(5);
  CHECK(timing.stall == copy);  // only layer 0 waits
  CHECK(timing.layers_end == copy + Tick::ms(8));
  CHECK(timing.h2d_busy == copy * 4);
}

TEST_CASE("copy-bound layers run at the copy engine's pace", "[tiers]") {
  std::vector<LayerCopies> layers(4);
  for (auto& layer : layers) {
    layer.staged_full = 3e6;  // 3 ms each against 1 ms layers
  }
  const CopyRates rates = uniform_rates(1e9, 1e9, Tick::zero(), Tick::zero());
  // The copy engine is the bottleneck whatever the staging depth: copies run back to back,
  // 4 copies then the last layer.
  for (const std::uint32_t lookahead : {1U, 2U, 4U}) {
    CHECK(time_pipeline(Tick::ms(1), layers, lookahead, rates).layers_end == Tick::ms(13));
  }
  // Synchronous copies add every copy to every layer: 4 × (3 + 1) ms.
  const auto synchronous = time_pipeline(Tick::ms(1), layers, 0, rates);
  CHECK(synchronous.layers_end == Tick::ms(16));
  CHECK(synchronous.stall == Tick::ms(12));
}

TEST_CASE("a deeper staging buffer starts a late layer's copy earlier", "[tiers]") {
  // Only the last of four 1 ms layers stages, 3 ms of copy. Its staging slot frees when layer
  // 3 - lookahead starts (at 3 - lookahead ms), so it starts at 5, 4, 3 and 3 ms; synchronous
  // copies wait for layer 2 to end (3 ms) and then the whole copy.
  std::vector<LayerCopies> layers(4);
  layers[3].staged_full = 3e6;
  const CopyRates rates = uniform_rates(1e9, 1e9, Tick::zero(), Tick::zero());
  CHECK(time_pipeline(Tick::ms(1), layers, 1, rates).layers_end == Tick::ms(6));
  CHECK(time_pipeline(Tick::ms(1), layers, 2, rates).layers_end == Tick::ms(5));
  CHECK(time_pipeline(Tick::ms(1), layers, 3, rates).layers_end == Tick::ms(4));
  CHECK(time_pipeline(Tick::ms(1), layers, 4, rates).layers_end == Tick::ms(4));
  const auto synchronous = time_pipeline(Tick::ms(1), layers, 0, rates);
  CHECK(synchronous.layers_end == Tick::ms(7));
  CHECK(synchronous.stall == Tick::ms(3));
}

TEST_CASE("admission reserves a tiered request's HBM peak and staging for lookahead + 1 layers",
          "[tiers]") {
  for (const std::uint32_t lookahead : {1U, 3U}) {
    INFO("lookahead " << lookahead);
    const RunSpec run =
        tiered_run("tiered:hbm=0.5,evict=0,delta=64,recent=32",
                   {"tiering.prefetch_lookahead_layers=" + std::to_string(lookahead),
                    "workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1"});
    const kvtier::serving::Workload workload =
        kvtier::serving::make_workload(run.workload(), run.seed());
    const kvtier::serving::TierDemand demand(run, run.policy(), workload);
    const kvtier::serving::RequestPeaks& peaks = demand.peaks(0);
    REQUIRE(peaks.staged_tokens > 0.0);
    // The staging buffer holds the layer being read and the `lookahead` layers copied ahead.
    const double bytes =
        kvtier::hw::kv_bytes_per_token_per_layer(run.model()) / run.tensor_parallel_degree();
    const double expected =
        (peaks.hbm_token_layers + peaks.staged_tokens * (lookahead + 1)) * bytes;
    const auto values = metrics(run);
    CHECK(values.at("hbm_kv_reserved_peak_gib") == Approx(expected / (1U << 30U)).epsilon(1e-12));
  }
}

TEST_CASE("offloads extend an iteration only when they outlast the layers", "[tiers]") {
  std::vector<LayerCopies> layers(2);
  layers[0].offloaded_full = 5e6;  // 5 ms
  const CopyRates rates = uniform_rates(1e9, 1e9, Tick::zero(), Tick::zero());
  const auto timing = time_pipeline(Tick::ms(1), layers, 1, rates);
  CHECK(timing.layers_end == Tick::ms(2));
  CHECK(timing.end == Tick::ms(5));
  CHECK(timing.d2h_busy == Tick::ms(5));
}

TEST_CASE("copies by SM kernels take turns with compute whatever the lookahead", "[tiers]") {
  // The copies of "copies shorter than a layer hide behind compute", on the SMs: none hides.
  std::vector<LayerCopies> layers(4);
  for (auto& layer : layers) {
    layer.staged_full = 1e6;
  }
  layers[0].offloaded_full = 3e6;  // with layer 2's, one 5 ms batch after the last layer
  layers[2].offloaded_full = 2e6;
  CopyRates rates = uniform_rates(1e9, 1e9, Tick::us(5), Tick::us(5));
  rates.method = kvtier::config::SM_KERNELS;
  const Tick copy = Tick::ms(1) + Tick::us(5);
  for (const std::uint32_t lookahead : {0U, 1U, 4U}) {
    CAPTURE(lookahead);
    const auto timing = time_pipeline(Tick::ms(2), layers, lookahead, rates);
    CHECK(timing.stall == copy * 4);
    CHECK(timing.layers_end == copy * 4 + Tick::ms(8));
    CHECK(timing.end == timing.layers_end);
    CHECK(timing.trailing == Tick::ms(5) + Tick::us(5));
    CHECK(timing.h2d_busy == copy * 4);
    CHECK(timing.d2h_busy == timing.trailing);
  }
  // On the copy engines the same offload runs beside the layers and adds nothing after them.
  rates.method = kvtier::config::COPY_ENGINES;
  CHECK(time_pipeline(Tick::ms(2), layers, 1, rates).trailing == Tick::zero());
}

TEST_CASE("SM kernels copy each kind apart: a setup per kind, the moves after the layers",
          "[tiers]") {
  // Two layers, each staging T1 and T2 tokens, promoting from both and offloading to both.
  std::vector<LayerCopies> layers(2);
  for (auto& layer : layers) {
    layer.staged_full = 1e6;        // 1 ms
    layer.staged_compressed = 5e5;  // 0.5 ms
    layer.promoted_full = 1e5;
    layer.promoted_compressed = 1e5;
    layer.offloaded_full = 2e5;
    layer.offloaded_compressed = 3e5;
  }
  CHECK(layers[0].h2d_bytes() == 1.7e6);
  CHECK(layers[0].d2h_bytes() == 5e5);
  CopyRates rates = uniform_rates(1e9, 1e9, Tick::us(5), Tick::us(7));
  rates.method = kvtier::config::SM_KERNELS;
  const auto timing = time_pipeline(Tick::ms(2), layers, 1, rates);
  // Each layer waits for two staging kernels, each with its setup.
  const Tick staging = Tick::ms(1) + Tick::us(500) + Tick::us(5) * 2;
  CHECK(timing.stall == staging * 2);
  CHECK(timing.layers_end == staging * 2 + Tick::ms(4));
  // Then the batches of both layers: offloads to T1 and to T2, promotions from T1 and from T2.
  const Tick offloads = Tick::us(400) + Tick::us(600) + Tick::us(7) * 2;
  const Tick promotions = Tick::us(200) + Tick::us(200) + Tick::us(5) * 2;
  CHECK(timing.d2h_busy == offloads);
  CHECK(timing.trailing == offloads + promotions);
  CHECK(timing.h2d_busy == staging * 2 + promotions);
  // T2 kernels of their own figures: the compressed bytes at a half (H2D) and a quarter (D2H)
  // of the rate, other setups.
  CopyRates t2 = rates;
  t2.t2_h2d_bytes_per_s = 5e8;
  t2.t2_d2h_bytes_per_s = 2.5e8;
  t2.t2_h2d_setup = Tick::us(11);
  t2.t2_d2h_setup = Tick::us(13);
  const auto own = time_pipeline(Tick::ms(2), layers, 1, t2);
  const Tick t2_staging = Tick::ms(1) + Tick::us(5) + Tick::ms(1) + Tick::us(11);
  CHECK(own.stall == t2_staging * 2);
  CHECK(own.d2h_busy == Tick::us(400) + Tick::us(7) + Tick::us(2400) + Tick::us(13));
  CHECK(own.h2d_busy ==
        t2_staging * 2 + Tick::us(200) + Tick::us(5) + Tick::us(400) + Tick::us(11));
  // On the copy engines each layer's bytes are one copy with one setup.
  rates.method = kvtier::config::COPY_ENGINES;
  CHECK(time_pipeline(Tick::ms(2), layers, 1, rates).h2d_busy ==
        (Tick::ms(1) + Tick::us(700) + Tick::us(5)) * 2);
}

TEST_CASE("an iteration of SM-kernel copies lasts its copies longer than on copy engines",
          "[tiers]") {
  RunSpec engines = tiered_run("tiered:hbm=0.3,evict=0");
  RunSpec kernels = engines;
  kernels.mutable_tiering()->set_copy_method(kvtier::config::SM_KERNELS);
  const auto on_engines = metrics(engines);
  const auto on_kernels = metrics(kernels);
  // The same bytes, and the same copy time but for setups: on the SMs an iteration's promotions
  // are a kernel of their own after the layers, where the copy engines carry them with each
  // layer's staging. The time per token grows by the copies the lookahead hid.
  CHECK(on_kernels.at("pcie_h2d_gb") == on_engines.at("pcie_h2d_gb"));
  CHECK(on_kernels.at("pcie_h2d_gb") > 0.0);
  const double busy_engines = on_engines.at("pcie_h2d_utilisation") * on_engines.at("duration_s");
  const double busy_kernels = on_kernels.at("pcie_h2d_utilisation") * on_kernels.at("duration_s");
  const double setup =
      kvtier::sim::to_seconds(kvtier::serving::measure_copy_rates(kernels).h2d_setup);
  const double promotion_batches = (busy_kernels - busy_engines) / setup;
  CHECK(promotion_batches == Approx(std::round(promotion_batches)).margin(1e-3));
  CHECK(promotion_batches >= 1.0);
  CHECK(promotion_batches <= on_kernels.at("iterations"));
  CHECK(on_kernels.at("tpot_mean_ms") > on_engines.at("tpot_mean_ms"));
  // Nothing overlaps: the run lasts the full cache's run plus every staging copy (the stall)
  // plus every offload and promotion after the layers.
  RunSpec full = kernels;
  full.mutable_policy()->Clear();
  full.mutable_policy()->set_name("full");
  const auto on_full = metrics(full);
  const double offloads = on_kernels.at("pcie_d2h_utilisation") * on_kernels.at("duration_s");
  CHECK(on_kernels.at("prefetch_stall_s") < busy_kernels);  // promotions: busy, not a stall
  CHECK(offloads > 0.0);
  CHECK(on_kernels.at("duration_s") ==
        Approx(on_full.at("duration_s") + busy_kernels + offloads).epsilon(1e-6));
  // The GPU waits for all of it: the staging, and the offloads and promotions after the layers.
  CHECK(on_kernels.at("copy_wait_s") == Approx(busy_kernels + offloads).epsilon(1e-6));
  // On the copy engines the offloads run beside the layers; only the prefetch stall and
  // offloads outlasting the layers wait.
  CHECK(on_engines.at("copy_wait_s") >= on_engines.at("prefetch_stall_s"));
  CHECK(on_engines.at("copy_wait_s") < on_kernels.at("copy_wait_s"));
  CHECK(on_full.at("copy_wait_s") == 0.0);
}

TEST_CASE("copies by SM kernels take the host link's SM-kernel figures where it has them",
          "[tiers]") {
  // hgx-h100-8's PCIe-Gen5-x16 has none: SM-kernel copies take the copy engines' figures.
  RunSpec run = tiered_run("tiered");
  const CopyRates engines = kvtier::serving::measure_copy_rates(run);
  run.mutable_tiering()->set_copy_method(kvtier::config::SM_KERNELS);
  const CopyRates plain = kvtier::serving::measure_copy_rates(run);
  CHECK(plain.h2d_bytes_per_s == Approx(engines.h2d_bytes_per_s));
  CHECK(plain.d2h_bytes_per_s == Approx(engines.d2h_bytes_per_s));
  CHECK(plain.h2d_setup == engines.h2d_setup);
  CHECK(plain.d2h_setup == engines.d2h_setup);
  CHECK(plain.h2d_setup == Tick::us(5));  // per_copy_overhead_us

  // Measured SM-kernel figures for H2D only: that direction's rate capped at the kernels' own.
  // hgx-h100-8 puts two GPUs behind a switch, so each gets half the copy engines' rate: kernels
  // at a quarter of it are the bound, kernels at three quarters are not.
  auto* link = run.mutable_hardware()->mutable_node()->mutable_host_link();
  const double engines_gb_per_s = kvtier::hw::asymptotic_gb_per_s(*link, kvtier::config::H2D);
  CHECK(plain.h2d_bytes_per_s == Approx(engines_gb_per_s * 1e9 / 2));
  auto* point = link->add_sm_kernel_measured();
  point->set_direction(kvtier::config::H2D);
  point->set_transfer_size_bytes(std::uint64_t{64} << 20U);
  point->set_effective_gb_per_s(engines_gb_per_s / 4);
  link->set_sm_kernel_h2d_overhead_us(9);
  link->set_sm_kernel_d2h_overhead_us(7);
  const CopyRates kernels = kvtier::serving::measure_copy_rates(run);
  CHECK(kernels.h2d_bytes_per_s == Approx(engines_gb_per_s * 1e9 / 4));
  CHECK(kernels.d2h_bytes_per_s == Approx(plain.d2h_bytes_per_s));
  CHECK(kernels.h2d_setup == Tick::us(9));
  CHECK(kernels.d2h_setup == Tick::us(7));
  point->set_effective_gb_per_s(engines_gb_per_s * 3 / 4);
  CHECK(kvtier::serving::measure_copy_rates(run).h2d_bytes_per_s == Approx(plain.h2d_bytes_per_s));
  // T2 kernels without figures of their own copy as the slot kernel; with them, at theirs
  // (capped by the link's share as well), per direction.
  CHECK(kernels.t2_h2d_bytes_per_s == kernels.h2d_bytes_per_s);
  CHECK(kernels.t2_d2h_bytes_per_s == kernels.d2h_bytes_per_s);
  CHECK(kernels.t2_h2d_setup == kernels.h2d_setup);
  CHECK(kernels.t2_d2h_setup == kernels.d2h_setup);
  point->set_effective_gb_per_s(engines_gb_per_s / 4);
  auto* t2_point = link->add_sm_kernel_t2_measured();
  t2_point->set_direction(kvtier::config::D2H);
  t2_point->set_transfer_size_bytes(std::uint64_t{32} << 20U);
  t2_point->set_effective_gb_per_s(engines_gb_per_s / 8);
  link->set_sm_kernel_t2_h2d_overhead_us(12);
  const CopyRates with_t2 = kvtier::serving::measure_copy_rates(run);
  CHECK(with_t2.t2_d2h_bytes_per_s == Approx(engines_gb_per_s * 1e9 / 8));
  CHECK(with_t2.t2_h2d_bytes_per_s == Approx(with_t2.h2d_bytes_per_s));
  CHECK(with_t2.t2_h2d_setup == Tick::us(12));
  CHECK(with_t2.t2_d2h_setup == Tick::us(7));
  CHECK(with_t2.d2h_bytes_per_s == Approx(kernels.d2h_bytes_per_s));
  t2_point->set_effective_gb_per_s(engines_gb_per_s * 3);
  CHECK(kvtier::serving::measure_copy_rates(run).t2_d2h_bytes_per_s ==
        Approx(plain.d2h_bytes_per_s));
  // The copy engines keep theirs, for compressed bytes too.
  run.mutable_tiering()->set_copy_method(kvtier::config::COPY_ENGINES);
  const CopyRates again = kvtier::serving::measure_copy_rates(run);
  CHECK(again.t2_h2d_bytes_per_s == again.h2d_bytes_per_s);
  CHECK(again.t2_d2h_setup == again.d2h_setup);
  CHECK(again.h2d_bytes_per_s == Approx(engines.h2d_bytes_per_s));
  CHECK(again.h2d_setup == engines.h2d_setup);
  CHECK(again.d2h_setup == engines.d2h_setup);
}

TEST_CASE("the copy rate a GPU sees falls when GPUs behind one switch copy together", "[tiers]") {
  const RunSpec run = tiered_run("tiered");
  const CopyRates rates = kvtier::serving::measure_copy_rates(run);
  // hgx-h100-8: two GPUs per PCIe switch share its uplink; every GPU copies at once.
  RunSpec alone = run;
  alone.mutable_hardware()->mutable_node()->set_gpus_per_pcie_switch(1);
  const CopyRates solo = kvtier::serving::measure_copy_rates(alone);
  CHECK(rates.h2d_bytes_per_s == Approx(solo.h2d_bytes_per_s / 2).epsilon(1e-6));
  RunSpec pageable = alone;
  pageable.mutable_tiering()->set_host_allocation(kvtier::config::PAGEABLE);
  CHECK(kvtier::serving::measure_copy_rates(pageable).h2d_bytes_per_s < solo.h2d_bytes_per_s);
}

TEST_CASE("tiered with everything in HBM and no eviction simulates exactly like full", "[tiers]") {
  const auto full = metrics(tiered_run("full"));
  const auto tiered = metrics(tiered_run("tiered:hbm=1.0,evict=0.0"));
  CHECK(tiered.at("tpot_p50_ms") == full.at("tpot_p50_ms"));
  CHECK(tiered.at("duration_s") == full.at("duration_s"));
  CHECK(tiered.at("pcie_h2d_gb") == 0.0);
  CHECK(tiered.at("attention_mass_kept_mean") == 1.0);
  CHECK(tiered.at("attention_mass_lost_mean") == 0.0);
  CHECK(tiered.at("hbm_kv_used_peak_gib") == Approx(full.at("hbm_kv_used_peak_gib")));
  CHECK(tiered.at("hbm_saved_peak_gib") == Approx(0.0).margin(1e-9));
  // At every moment, not only at the peak: the tiered count follows the running set as it is
  // after each iteration (finished requests gone, prompts placed as their prefill ends) and
  // counts the tokens the full count does.
  CHECK(tiered.at("hbm_kv_used_mean_gib") == Approx(full.at("hbm_kv_used_mean_gib")).epsilon(1e-9));
  CHECK(tiered.at("hbm_saved_mean_gib") == Approx(0.0).margin(1e-9));
  CHECK(tiered.at("host_kv_used_peak_gib") == 0.0);
  // The same with requests finishing at different times and prompts ending prefill mid-run.
  const std::vector<std::string> staggered = {
      "workload.closed_loop.output_tokens.uniform.min_tokens=2",
      "workload.closed_loop.output_tokens.uniform.max_tokens=64",
      "workload.prefill_chunk_tokens=256"};
  const auto full_staggered = metrics(tiered_run("full", staggered));
  const auto tiered_staggered = metrics(tiered_run("tiered:hbm=1.0,evict=0.0", staggered));
  CHECK(tiered_staggered.at("hbm_kv_used_mean_gib") ==
        Approx(full_staggered.at("hbm_kv_used_mean_gib")).epsilon(1e-9));
  CHECK(tiered_staggered.at("hbm_saved_mean_gib") == Approx(0.0).margin(1e-9));
}

TEST_CASE("in a paged cache, tiered with everything in HBM still simulates exactly like full",
          "[tiers]") {
  // Each layer's T0 in whole blocks, as the full cache's KV: 512 + g tokens take the blocks
  // either count gives, so nothing is saved by counting the tiers differently. With 513 tokens
  // out a request's last context (1,024 tokens) ends a block exactly: both reserve it, not one
  // block more for the last token, whose KV is never written.
  for (const char* output : {"512", "513"}) {
    for (const char* block : {"16", "64", "1000"}) {
      INFO("output " << output << ", block " << block);
      const std::vector<std::string> paged = {
          std::string("memory.kv_block_tokens=") + block, "workload.prefill_chunk_tokens=256",
          std::string("workload.closed_loop.output_tokens.fixed_tokens=") + output};
      const auto full = metrics(tiered_run("full", paged));
      const auto tiered = metrics(tiered_run("tiered:hbm=1.0,evict=0.0", paged));
      CHECK(tiered.at("duration_s") == full.at("duration_s"));
      CHECK(tiered.at("hbm_kv_used_peak_gib") == Approx(full.at("hbm_kv_used_peak_gib")));
      CHECK(tiered.at("hbm_kv_used_mean_gib") ==
            Approx(full.at("hbm_kv_used_mean_gib")).epsilon(1e-9));
      CHECK(tiered.at("hbm_saved_peak_gib") == Approx(0.0).margin(1e-9));
      CHECK(tiered.at("hbm_kv_reserved_peak_gib") == Approx(full.at("hbm_kv_reserved_peak_gib")));
      CHECK(tiered.at("largest_batch_that_fits") == full.at("largest_batch_that_fits"));
      // And the blocks cost what they should: more than the tokens alone.
      const auto by_token = metrics(tiered_run(
          "full", {"workload.prefill_chunk_tokens=256",
                   std::string("workload.closed_loop.output_tokens.fixed_tokens=") + output}));
      CHECK(full.at("hbm_kv_used_mean_gib") > by_token.at("hbm_kv_used_mean_gib"));
    }
  }
}

namespace {

// A 4-layer synthetic reasoning trace of the test model's shape, written for a run to follow.
kvtier::traces::SynthOptions trace_options(std::uint64_t prompt_tokens, std::uint64_t steps) {
  kvtier::traces::SynthOptions options;
  options.model = tiered_run("full").model();
  options.model.set_num_hidden_layers(4);
  options.prompt_tokens = prompt_tokens;
  options.steps = steps;
  options.params = kvtier::traces::synthetic_preset("reasoning", 3);
  options.writer.compression_threads = 0;
  return options;
}

}  // namespace

TEST_CASE("in a paged cache, requests shorter than their trace's prompt reserve what they hold",
          "[tiers]") {
  // Requests of 50 + 51 tokens read a trace of a 1,000-token prompt's start placement, scaled
  // to their context: at hbm=1.0 each layer holds all 100 tokens of its last context, 112 in
  // 16-token blocks, as the full cache does; its share of 99 earlier tokens plus its own must
  // not gain a block by rounding.
  const auto folder = std::filesystem::temp_directory_path() / "kvtier-tier-sim-paged-test";
  std::filesystem::create_directories(folder);
  const auto trace = folder / "long-prompt.h5";
  kvtier::traces::write_synthetic_trace(trace, trace_options(1000, 8));
  for (const char* block : {"16", "100", "128"}) {
    INFO("block " << block);
    const std::vector<std::string> sets = {"workload.closed_loop.prompt_tokens.fixed_tokens=50",
                                           "workload.closed_loop.output_tokens.fixed_tokens=51",
                                           std::string("memory.kv_block_tokens=") + block};
    RunSpec full = tiered_run("full", sets);
    RunSpec tiered = tiered_run("tiered:hbm=1.0,evict=0.0", sets);
    tiered.mutable_tiering()->add_traces(trace.string());
    const auto full_values = metrics(full);
    const auto tiered_values = metrics(tiered);
    CHECK(tiered_values.at("hbm_kv_reserved_peak_gib") ==
          Approx(full_values.at("hbm_kv_reserved_peak_gib")));
    CHECK(tiered_values.at("hbm_kv_used_peak_gib") ==
          Approx(full_values.at("hbm_kv_used_peak_gib")));
    CHECK(tiered_values.at("largest_batch_that_fits") == full_values.at("largest_batch_that_fits"));
  }
  std::filesystem::remove_all(folder);
}

TEST_CASE("in a paged cache a tiered request reserves each layer's T0 in whole blocks", "[tiers]") {
  // At hbm=0.9 T0 outgrows the prompt (512 tokens a layer), so it is T0's blocks, not the
  // prompt's, that the reservation holds: a whole number of blocks in every layer, at most a
  // block a layer above the tokens.
  const std::string policy = "tiered:hbm=0.9,evict=0";
  const std::vector<std::string> one = {"workload.closed_loop.concurrency=1",
                                        "workload.closed_loop.num_requests=1"};
  std::vector<std::string> paged = one;
  paged.emplace_back("memory.kv_block_tokens=16");
  const RunSpec by_token = tiered_run(policy, one);
  const RunSpec run = tiered_run(policy, paged);
  const kvtier::serving::Workload workload =
      kvtier::serving::make_workload(run.workload(), run.seed());
  const kvtier::serving::TierDemand tokens(by_token, by_token.policy(), workload);
  const kvtier::serving::TierDemand blocks(run, run.policy(), workload);
  const double token_peak = tokens.peaks(0).hbm_token_layers;
  const double block_peak = blocks.peaks(0).hbm_token_layers;
  REQUIRE(token_peak > 32 * 512.0);
  CHECK(std::fmod(block_peak, 16.0) == 0.0);
  CHECK(block_peak > token_peak);
  CHECK(block_peak < token_peak + 32 * 16.0);
  // Blocks page T0 only: the host tiers and the staging buffer are counted as before.
  CHECK(blocks.peaks(0).host_token_layers == tokens.peaks(0).host_token_layers);
  CHECK(blocks.peaks(0).staged_tokens == tokens.peaks(0).staged_tokens);
}

namespace {

// 32 requests of 2,048 + 2,048 tokens starting together, admitted on demand.
std::vector<std::string> on_demand_long_requests() {
  return {"workload.closed_loop.concurrency=32",
          "workload.closed_loop.num_requests=32",
          "workload.closed_loop.prompt_tokens.fixed_tokens=2048",
          "workload.closed_loop.output_tokens.fixed_tokens=2048",
          "workload.prefill_chunk_tokens=2048",
          "workload.on_demand_admission.watermark=0.01"};
}

// The 32 long requests all served, within HBM, host memory and swap space, and every one
// swapped out swapped back in.
void check_served_within_memory(const std::map<std::string, double>& values) {
  CHECK(values.at("requests_completed") == 32);
  CHECK(values.at("output_tokens") == 32 * 2048);
  CHECK(values.at("hbm_kv_used_peak_gib") <= values.at("hbm_kv_capacity_gib"));
  CHECK(values.at("host_kv_used_peak_gib") <= values.at("host_kv_capacity_gib"));
  CHECK(values.at("swap_space_used_peak_gib") <= values.at("swap_space_gib"));
  CHECK(values.at("swap_in_gb") == Approx(values.at("swap_out_gb")));
}

// Preemption by swapping into `space_gib` of swap space per GPU, in vLLM's 16-token blocks.
void add_swapping(std::vector<std::string>& sets, const std::string& space_gib) {
  sets.push_back("workload.on_demand_admission.swap.space_gib=" + space_gib);
  sets.emplace_back("memory.kv_block_tokens=16");
}

}  // namespace

TEST_CASE("with on-demand admission, tiering preempts less than the full cache", "[tiers]") {
  // 10 GiB of KV in HBM (81,000 tokens): 32 requests of 2,048 + 2,048 tokens start together;
  // their prompts fit, their whole lives (132,000 tokens) do not.
  std::vector<std::string> pressure = on_demand_long_requests();
  pressure.emplace_back("hardware.node.gpu.memory_capacity=28GiB");
  const auto full = metrics(tiered_run("full", pressure));
  const auto tiered =
      metrics(tiered_run("tiered:hbm=0.3,evict=0.0,prefetch=differential", pressure));
  INFO("full " << full.at("preemptions") << ", tiered " << tiered.at("preemptions"));
  CHECK(full.at("preemptions") > 0);
  // The tiered cache holds about a third of the KV in host memory: a fraction of the
  // preemptions, and more tokens a second for it.
  CHECK(tiered.at("preemptions") * 3 < full.at("preemptions"));
  CHECK(tiered.at("preempted_kv_tokens") * 3 < full.at("preempted_kv_tokens"));
  CHECK(tiered.at("throughput_output_tokens_per_s") > full.at("throughput_output_tokens_per_s"));
  for (const auto* values : {&full, &tiered}) {
    CHECK(values->at("requests_completed") == 32);
    CHECK(values->at("output_tokens") == 32 * 2048);
    CHECK(values->at("hbm_kv_used_peak_gib") <= values->at("hbm_kv_capacity_gib"));
    CHECK(values->at("host_kv_used_peak_gib") <= values->at("host_kv_capacity_gib"));
  }
  // A preempted request's tiers start again from its recomputed prefill's placement; no
  // eviction still keeps all attention.
  CHECK(tiered.at("attention_mass_kept_mean") == 1.0);
}

TEST_CASE("with on-demand admission, host memory holds admissions back and a recompute must fit",
          "[tiers]") {
  // 1 GiB of host memory per engine (8 GiB for the node's eight): the tiered cache's T1 binds.
  std::vector<std::string> host_bound = on_demand_long_requests();
  host_bound.emplace_back("hardware.node.host.capacity=8GiB");
  const auto values = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", host_bound));
  CHECK(values.at("host_kv_capacity_gib") == Approx(1.0));
  CHECK(values.at("host_kv_used_peak_gib") <= values.at("host_kv_capacity_gib"));
  CHECK(values.at("requests_completed") == 32);
  // A request's host share counts from its first chunk, so the queue waits for host memory
  // rather than admitting requests that a placed prompt would then have to preempt. (Counted
  // only once a prompt was placed, configs/examples/quickstart.textproto's run under the same
  // limit preempted 1,888 times, about 60 times a request, and no admission waited.)
  CHECK(values.at("admissions_held_by_host") > 0);
  CHECK(values.at("preemptions") < 4 * 32);

  // A recompute holds every token it prefills in HBM, however the policy places them: a request
  // whose longest recompute does not fit is refused, where reservations (its T0 peak) run it.
  // 0.35 GiB of KV is 2,867 tokens; 500 + 3,000 tokens at most 30% in T0 fit, 3,499 do not.
  const std::vector<std::string> long_request = {
      "hardware.node.gpu.memory_capacity=18.3075GiB", "workload.closed_loop.concurrency=2",
      "workload.closed_loop.num_requests=2", "workload.closed_loop.prompt_tokens.fixed_tokens=500",
      "workload.closed_loop.output_tokens.fixed_tokens=3000"};
  CHECK(metrics(tiered_run("tiered:hbm=0.1,evict=0.0", long_request)).at("requests_completed") ==
        2);
  std::vector<std::string> on_demand = long_request;
  on_demand.emplace_back("workload.on_demand_admission.watermark=0.01");
  try {
    (void)kvtier::serving::simulate(tiered_run("tiered:hbm=0.1,evict=0.0", on_demand));
    FAIL("the request was not refused");
  } catch (const kvtier::serving::DoesNotFit& error) {
    CHECK_THAT(error.what(), Catch::Contains("3500 tokens") &&
                                 Catch::Contains("when a preemption recomputes it whole in HBM"));
  }
}

TEST_CASE("with swapping, a swapped-out tiered request keeps its T1/T2 and resumes", "[tiers]") {
  std::vector<std::string> pressure = on_demand_long_requests();
  pressure.emplace_back("hardware.node.gpu.memory_capacity=28GiB");
  add_swapping(pressure, "8");
  const auto full = metrics(tiered_run("full", pressure));
  const auto tiered = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", pressure));
  INFO("full " << full.at("swapped_preemptions") << ", tiered "
               << tiered.at("swapped_preemptions"));
  for (const auto* values : {&full, &tiered}) {
    CHECK(values->at("swapped_preemptions") > 0);
    check_served_within_memory(*values);
  }
  // Only the tiered request's T0 goes to the swap space.
  CHECK(tiered.at("swap_out_gb") / tiered.at("swapped_preemptions") <
        full.at("swap_out_gb") / full.at("swapped_preemptions"));
  CHECK(tiered.at("attention_mass_kept_mean") == 1.0);
  const RunSpec run = tiered_run("tiered:hbm=0.3,evict=0.0", pressure);
  CHECK(kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v") ==
        kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v"));
}

TEST_CASE("with swapping, a preemption for host memory passes the T1/T2 to the swap space",
          "[tiers]") {
  // 1 GiB of T1/T2 per GPU, as the host-bound case above: there 8 GiB for the node, here 16
  // with 1 GiB of each GPU's 2 set aside for swapping. A swapped-out request's T1/T2 leave the
  // tiers' host memory for the swap space, so swapping frees host memory too.
  std::vector<std::string> recompute = on_demand_long_requests();
  recompute.emplace_back("hardware.node.host.capacity=8GiB");
  std::vector<std::string> swap = on_demand_long_requests();
  swap.emplace_back("hardware.node.host.capacity=16GiB");
  add_swapping(swap, "1");
  const auto recomputing = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", recompute));
  const auto values = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", swap));
  INFO("preemptions " << values.at("preemptions") << ", swapped "
                      << values.at("swapped_preemptions") << "; recomputing "
                      << recomputing.at("preemptions"));
  CHECK(values.at("host_kv_capacity_gib") == recomputing.at("host_kv_capacity_gib"));
  CHECK(recomputing.at("swapped_preemptions") == 0);
  CHECK(values.at("swapped_preemptions") > 0);
  CHECK(values.at("preempted_kv_tokens") < recomputing.at("preempted_kv_tokens"));
  check_served_within_memory(values);

  // A victim is swapped only when the swap space holds it whole, T0 and T1/T2: the space is
  // never overfilled, and with a decoding victim it holds more than was ever copied to it.
  // Here (16-token blocks) the one victim swapped takes 0.39 GiB: 0.35 GiB holds none.
  std::vector<std::string> too_small = on_demand_long_requests();
  too_small.emplace_back("hardware.node.gpu.memory_capacity=28GiB");
  add_swapping(too_small, "0.35");
  const auto none = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", too_small));
  CHECK(none.at("preemptions") > 0);
  CHECK(none.at("swapped_preemptions") == 0);
  CHECK(none.at("swap_space_used_peak_gib") == 0.0);
  bool handed_over = false;
  for (const char* space : {"0.4", "0.5", "0.8"}) {
    std::vector<std::string> pressure = on_demand_long_requests();
    pressure.emplace_back("hardware.node.gpu.memory_capacity=28GiB");
    add_swapping(pressure, space);
    const auto run = metrics(tiered_run("tiered:hbm=0.3,evict=0.0", pressure));
    INFO("swap space " << space << " GiB: " << run.at("swapped_preemptions") << " swapped, peak "
                       << run.at("swap_space_used_peak_gib") << " GiB, copied out "
                       << run.at("swap_out_gb") << " GB");
    CHECK(run.at("swapped_preemptions") > 0);
    check_served_within_memory(run);
    handed_over =
        handed_over || run.at("swap_space_used_peak_gib") * (1 << 30) / 1e9 > run.at("swap_out_gb");
  }
  CHECK(handed_over);
}

TEST_CASE("tiering moves KV out of HBM and pays for it on PCIe", "[tiers]") {
  const auto full = metrics(tiered_run("full"));
  const auto tiered = metrics(tiered_run("tiered:hbm=0.3,evict=0.0"));
  CHECK(tiered.at("hbm_saved_peak_gib") > 0.0);
  CHECK(tiered.at("hbm_kv_used_peak_gib") < full.at("hbm_kv_used_peak_gib"));
  CHECK(tiered.at("host_kv_used_peak_gib") > 0.0);
  CHECK(tiered.at("pcie_h2d_gb") > 0.0);
  CHECK(tiered.at("tpot_p50_ms") >= full.at("tpot_p50_ms"));
  // No eviction: attention keeps everything (Proposition 1), whatever sits on the host.
  CHECK(tiered.at("attention_mass_kept_mean") == 1.0);
  CHECK(tiered.at("attention_mass_lost_mean") == 0.0);
}

TEST_CASE("differential prefetch moves fewer bytes than full prefetch", "[tiers]") {
  const auto full = metrics(tiered_run("tiered:hbm=0.3,evict=0.1,prefetch=full"));
  const auto differential = metrics(tiered_run("tiered:hbm=0.3,evict=0.1,prefetch=differential"));
  CHECK(differential.at("pcie_h2d_gb") < full.at("pcie_h2d_gb"));
  CHECK(differential.at("prefetch_stall_s") <= full.at("prefetch_stall_s"));
  CHECK(differential.at("hbm_saved_peak_gib") == Approx(full.at("hbm_saved_peak_gib")));
}

TEST_CASE("pageable host memory makes prefetches slower", "[tiers]") {
  const auto pinned = metrics(tiered_run("tiered:hbm=0.3,evict=0.0"));
  const auto pageable =
      metrics(tiered_run("tiered:hbm=0.3,evict=0.0", {"tiering.host_allocation=PAGEABLE"}));
  CHECK(pageable.at("pcie_h2d_utilisation") > pinned.at("pcie_h2d_utilisation"));
  CHECK(pageable.at("tpot_p50_ms") >= pinned.at("tpot_p50_ms"));
}

TEST_CASE("an eviction budget lets more requests fit and loses attention mass", "[tiers]") {
  const auto full = metrics(tiered_run("full"));
  const auto h2o = metrics(tiered_run("h2o:budget=128"));
  CHECK(h2o.at("largest_batch_that_fits") > full.at("largest_batch_that_fits"));
  CHECK(h2o.at("attention_mass_kept_mean") < 1.0);
  CHECK(h2o.at("attention_mass_lost_mean") == Approx(1.0 - h2o.at("attention_mass_kept_mean")));
  CHECK(h2o.at("pcie_h2d_gb") == 0.0);
}

TEST_CASE("a tiered simulation is byte-identical for a seed and differs for another", "[tiers]") {
  const RunSpec run = tiered_run("tiered:hbm=0.5,evict=0.1");
  const auto json = [](const RunSpec& spec) {
    return kvtier::serving::report_json({kvtier::serving::simulate(spec)}, spec, "v");
  };
  CHECK(json(run) == json(run));
  RunSpec reseeded = run;
  reseeded.set_seed(8);
  CHECK(json(reseeded) != json(run));
}

TEST_CASE("comparing policies reports each on the same workload", "[tiers]") {
  RunSpec run = tiered_run("tiered:hbm=0.5,evict=0.1");
  run.add_compare()->set_name("full");
  const auto reports = kvtier::serving::simulate_all(run);
  REQUIRE(reports.size() == 2);
  CHECK(reports[1].policy == "full");
  CHECK(reports[0].policy.rfind("tiered:hbm=0.5,evict=0.1,", 0) == 0);
  CHECK(reports[0].workload == reports[1].workload);
  CHECK(reports[0].metrics.size() == reports[1].metrics.size());
  const std::string csv = kvtier::serving::report_csv(reports);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);
}

TEST_CASE("requests follow traces, and one too short is refused unless extended", "[tiers]") {
  const auto folder = std::filesystem::temp_directory_path() / "kvtier-tier-sim-test";
  std::filesystem::create_directories(folder);
  const auto trace = folder / "short.h5";
  kvtier::traces::SynthOptions options = trace_options(512, 100);  // requests need 511 steps
  kvtier::traces::write_synthetic_trace(trace, options);

  RunSpec run = tiered_run("tiered:hbm=0.5,evict=0.1");
  run.mutable_tiering()->add_traces(trace.string());
  CHECK_THROWS_AS(kvtier::serving::simulate(run), kvtier::ConfigError);
  run.mutable_tiering()->set_extend_synthetic(true);
  const auto noted = [](const RunSpec& extended, const std::string& share) {
    bool found = false;
    for (const auto& note : kvtier::serving::simulate(extended).notes) {
      found = found || (note.find("synthetic extension") != std::string::npos &&
                        note.find(share + " of decode steps ran past their trace") == 0);
    }
    return found;
  };
  // Every request attends up to 1,023 tokens and the trace covers 612: 411 of 511 steps.
  CHECK(noted(run, "80.4%"));
  // A trace shorter than the prompt: every decode step is past it, and no more than every one.
  const auto shorter = folder / "shorter.h5";
  options.prompt_tokens = 64;
  kvtier::traces::write_synthetic_trace(shorter, options);
  run.mutable_tiering()->set_traces(0, shorter.string());
  CHECK(noted(run, "100.0%"));
  std::filesystem::remove_all(folder);
}

TEST_CASE("tier policies run within a sliding window and are refused past it", "[tiers]") {
  // Requests attend up to 1,023 tokens: a 1,024-token window changes nothing.
  const std::string policy = "tiered:hbm=0.5,evict=0.1";
  const auto unwindowed = metrics(tiered_run(policy));
  const auto windowed = metrics(tiered_run(policy, {"model.sliding_window=1024"}));
  CHECK(windowed == unwindowed);
  // Past the window a step's trace placement no longer describes the cache (the window drops
  // the oldest tokens): refused, naming the field. The full cache still runs.
  const RunSpec past = tiered_run(policy, {"model.sliding_window=1000"});
  CHECK_THROWS_WITH(kvtier::serving::simulate(past),
                    Catch::Contains("past model.sliding_window (1000)"));
  CHECK_NOTHROW(kvtier::serving::simulate(tiered_run("full", {"model.sliding_window=1000"})));
}

TEST_CASE("a policy other than full needs a tiering block", "[tiers]") {
  const auto lines = kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run() +
                                                     "\ncompare { name: \"tiered\" }\n");
  REQUIRE(!lines.empty());
  CHECK_THAT(lines.front(), Catch::Contains("tiering"));
}

TEST_CASE("a compared policy whose requests do not fit is reported so while the others run",
          "[tiers]") {
  // 0.11 GiB left for KV: a 1,024-token request of Llama-3.1-8B needs 0.125 GiB in HBM whole,
  // about 0.08 GiB with every generated token outside the recent window on the host.
  const auto roomy = metrics(tiered_run("full"));
  const double reserve = roomy.at("hbm_reserve_gib") + roomy.at("hbm_kv_capacity_gib") - 0.11;
  RunSpec run = tiered_run("tiered:hbm=0.0,evict=0.0",
                           {"memory.runtime_reserve_gib=" + std::to_string(reserve)});
  run.add_compare()->set_name("full");
  const auto reports = kvtier::serving::simulate_all(run);
  REQUIRE(reports.size() == 2);
  CHECK(reports[0].does_not_fit.empty());
  REQUIRE(!reports[0].metrics.empty());
  CHECK(reports[0].metrics.front().name == "requests_completed");
  CHECK(reports[0].metrics.front().value > 0);
  CHECK(reports[1].policy == "full");
  CHECK_THAT(reports[1].does_not_fit, Catch::Contains("GiB of KV per GPU, but only 0.11 GiB"));
  CHECK_THAT(reports[1].notes.back(), Catch::StartsWith("does not fit: request 0"));
  REQUIRE(reports[1].metrics.size() == reports[0].metrics.size());
  for (std::size_t i = 0; i < reports[1].metrics.size(); ++i) {
    CHECK(reports[1].metrics[i].name == reports[0].metrics[i].name);
    CHECK(std::isnan(reports[1].metrics[i].value));
  }
  const std::string csv = kvtier::serving::report_csv(reports);
  CHECK_THAT(csv, Catch::Contains("\n\"full\",,"));
  const std::string json = kvtier::serving::report_json(reports, run, "test");
  CHECK_THAT(json, Catch::Contains("\"does_not_fit\": \"request 0") &&
                       Catch::Contains("\"requests_completed\": null"));
  // When no policy fits, the run fails as a single run does.
  RunSpec only_full = run;
  only_full.clear_compare();
  only_full.mutable_policy()->Clear();
  only_full.mutable_policy()->set_name("full");
  CHECK_THROWS_AS(kvtier::serving::simulate_all(only_full), kvtier::serving::DoesNotFit);
  CHECK_THROWS_AS(kvtier::serving::simulate(only_full), kvtier::serving::DoesNotFit);
}

TEST_CASE("a host pool's recodes last whole rounds of chunks on its busiest thread", "[tiers]") {
  using kvtier::serving::recode_makespan_ns;
  const auto pool = [](std::uint32_t threads, std::uint32_t chunk, std::uint64_t min_values) {
    kvtier::config::HostRecodeSpec spec;
    spec.set_threads(threads);
    spec.set_timing(kvtier::config::STEP_PATH);
    spec.set_chunk_token_layers(chunk);
    spec.set_parallel_min_values(min_values);
    return spec;
  };
  // 9 token-layers of 100 values, 900 ns on one thread.
  CHECK(recode_makespan_ns(9, 900, 100, pool(1, 4, 0)) == Approx(900));
  // Chunks of 4, 4 and 1: on two threads the first runs 4 + 1, on more one runs 4.
  CHECK(recode_makespan_ns(9, 900, 100, pool(2, 4, 0)) == Approx(500));
  CHECK(recode_makespan_ns(9, 900, 100, pool(4, 4, 0)) == Approx(400));
  CHECK(recode_makespan_ns(9, 900, 100, pool(16, 4, 0)) == Approx(400));
  // 33 on 8 threads: eight chunks of 4, then the short one alone; 34 on 16: nine chunks at once.
  CHECK(recode_makespan_ns(33, 3300, 100, pool(8, 4, 0)) == Approx(500));
  CHECK(recode_makespan_ns(34, 3400, 100, pool(16, 4, 0)) == Approx(400));
  // 10 on 8: chunks 4, 4 and 2 at once.
  CHECK(recode_makespan_ns(10, 1000, 100, pool(8, 4, 0)) == Approx(400));
  // Token-layer by token-layer: 9 on 3 threads is an even split, on 4 it is three rounds.
  CHECK(recode_makespan_ns(9, 900, 100, pool(3, 1, 0)) == Approx(300));
  CHECK(recode_makespan_ns(9, 900, 100, pool(4, 1, 0)) == Approx(300));
  CHECK(recode_makespan_ns(8, 800, 100, pool(4, 1, 0)) == Approx(200));
  // Under the one-thread threshold (900 values < 901) the caller runs them alone; at it, not.
  CHECK(recode_makespan_ns(9, 900, 100, pool(4, 4, 901)) == 900);
  CHECK(recode_makespan_ns(9, 900, 100, pool(4, 4, 900)) == Approx(400));
  CHECK(recode_makespan_ns(0, 0, 100, pool(4, 4, 0)) == 0);
}

namespace {

// A request whose policy recodes tokens between T1 and T2 (compress > 0), alone on its engine so
// that every iteration runs after the one before; `extra` last.
RunSpec recoding_run(
    const std::vector<std::string>& extra = {},
    const std::string& policy = "tiered:hbm=0.5,evict=0.1,compress=0.3,delta=8,recent=32") {
  std::vector<std::string> sets = {"workload.closed_loop.concurrency=1",
                                   "workload.closed_loop.num_requests=1",
                                   "hardware.node.host.kv_recode.to_compressed_ns_per_value=2",
                                   "hardware.node.host.kv_recode.to_full_ns_per_value=1",
                                   "hardware.node.host.kv_recode.source=a test's figures"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return tiered_run(policy, sets);
}

// Handed out token-layer by token-layer, however few.
const std::vector<std::string> kFinePool = {"tiering.host_recode.chunk_token_layers=1",
                                            "tiering.host_recode.parallel_min_values=0"};

std::vector<std::string> joined(std::vector<std::string> sets,
                                const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

const std::vector<std::string> kOnStepPath =
    joined({"tiering.host_recode.threads=1", "tiering.host_recode.timing=STEP_PATH"}, kFinePool);

std::vector<std::string> with(std::vector<std::string> sets, const std::string& set) {
  sets.push_back(set);
  return sets;
}

}  // namespace

TEST_CASE("the host's T1 <-> T2 recodes are counted always and timed where the run says how",
          "[tiers]") {
  const RunSpec untimed_run = recoding_run();
  const auto untimed = metrics(untimed_run);
  REQUIRE(untimed.at("host_recode_gb") > 0.0);
  // Not timed: no time rather than none, and the report says why.
  CHECK(std::isnan(untimed.at("host_recode_s")));
  CHECK(std::isnan(untimed.at("host_recode_stall_s")));
  bool noted = false;
  for (const std::string& note : kvtier::serving::simulate(untimed_run).notes) {
    noted =
        noted || note.find("not timed: the run sets no tiering.host_recode") != std::string::npos;
  }
  CHECK(noted);

  // On the step's path every recode adds its time to the run of this lone request.
  const auto one = metrics(recoding_run(kOnStepPath));
  CHECK(one.at("host_recode_gb") == untimed.at("host_recode_gb"));
  const double recode_s = one.at("host_recode_s");
  REQUIRE(recode_s > 0.0);
  CHECK(one.at("host_recode_stall_s") == recode_s);
  CHECK(one.at("duration_s") - untimed.at("duration_s") == Approx(recode_s).epsilon(1e-6));
  CHECK(one.at("tpot_mean_ms") > untimed.at("tpot_mean_ms"));
  // Threads split the work, in whole token-layers (an iteration's few recodes may leave a
  // thread idle); slower rates take longer in proportion.
  const auto four = metrics(recoding_run(with(kOnStepPath, "tiering.host_recode.threads=4")));
  CHECK(four.at("host_recode_s") >= recode_s / 4 * (1 - 1e-9));
  CHECK(four.at("host_recode_s") < recode_s / 2);
  // One chunk holding every recode of an iteration, or a threshold above any iteration's work,
  // leaves the other threads idle.
  for (const std::string& coarse : {std::string("tiering.host_recode.chunk_token_layers=1048576"),
                                    std::string("tiering.host_recode.parallel_min_values=" +
                                                std::to_string(std::uint64_t{1} << 40))}) {
    const auto idle =
        metrics(recoding_run(with(with(kOnStepPath, "tiering.host_recode.threads=4"), coarse)));
    CHECK(idle.at("host_recode_s") == Approx(recode_s).epsilon(1e-9));
  }
  // A threshold of one value: every iteration that recodes anything runs on the threads.
  const auto pooled = metrics(recoding_run(with(with(kOnStepPath, "tiering.host_recode.threads=4"),
                                                "tiering.host_recode.parallel_min_values=1")));
  CHECK(pooled.at("host_recode_s") == Approx(four.at("host_recode_s")).epsilon(1e-12));
  // The policy moves whole tokens, in every one of the model's 32 layers: two threads halve
  // each iteration's recodes token-layer by token-layer, but in chunks of a token's 32
  // token-layers an iteration of an odd count of tokens keeps one thread a chunk longer.
  const auto two = metrics(recoding_run(with(kOnStepPath, "tiering.host_recode.threads=2")));
  CHECK(two.at("host_recode_s") == Approx(recode_s / 2).epsilon(1e-6));
  const auto two_tokens =
      metrics(recoding_run(with(with(kOnStepPath, "tiering.host_recode.threads=2"),
                                "tiering.host_recode.chunk_token_layers=" + std::to_string(32))));
  CHECK(two_tokens.at("host_recode_s") > recode_s / 2 * (1 + 1e-3));
  CHECK(two_tokens.at("host_recode_s") < recode_s);
  const auto slower = metrics(recoding_run(
      with(with(kOnStepPath, "hardware.node.host.kv_recode.to_compressed_ns_per_value=4"),
           "hardware.node.host.kv_recode.to_full_ns_per_value=2")));
  CHECK(slower.at("host_recode_s") == Approx(2 * recode_s).epsilon(1e-6));

  // Beside the next iteration they cost at most what they cost on the path, and no less than
  // nothing.
  const auto overlapped = metrics(recoding_run(joined(
      {"tiering.host_recode.threads=1", "tiering.host_recode.timing=OVERLAPPED"}, kFinePool)));
  CHECK(overlapped.at("host_recode_s") == Approx(recode_s).epsilon(1e-9));
  CHECK(overlapped.at("host_recode_stall_s") <= overlapped.at("host_recode_s"));
  CHECK(overlapped.at("duration_s") < one.at("duration_s"));
  CHECK(overlapped.at("duration_s") >= untimed.at("duration_s"));

  // A policy without T2 recodes nothing: no bytes and no time, costed or not.
  for (const auto& sets : {std::vector<std::string>{}, kOnStepPath}) {
    const auto none =
        metrics(recoding_run(sets, "tiered:hbm=0.5,evict=0.1,compress=0,delta=8,recent=32"));
    CHECK(none.at("host_recode_gb") == 0.0);
    CHECK(none.at("host_recode_s") == 0.0);
    CHECK(none.at("host_recode_stall_s") == 0.0);
  }
}

TEST_CASE("overlapped recodes longer than an iteration hold back the iteration after next",
          "[tiers]") {
  // Slow enough that each iteration's recodes outlast the next iteration.
  const std::vector<std::string> slow = joined(
      {"hardware.node.host.kv_recode.to_compressed_ns_per_value=20000",
       "hardware.node.host.kv_recode.to_full_ns_per_value=20000", "tiering.host_recode.threads=1"},
      kFinePool);
  const auto on_path = metrics(recoding_run(with(slow, "tiering.host_recode.timing=STEP_PATH")));
  const auto beside = metrics(recoding_run(with(slow, "tiering.host_recode.timing=OVERLAPPED")));
  REQUIRE(beside.at("host_recode_s") > 0.5 * beside.at("duration_s"));
  CHECK(beside.at("host_recode_stall_s") > 0.0);
  CHECK(beside.at("host_recode_stall_s") < on_path.at("host_recode_stall_s"));
  CHECK(beside.at("duration_s") < on_path.at("duration_s"));
  // Recode-bound: the run lasts at least its recodes but the last two iterations'.
  CHECK(beside.at("duration_s") > 0.5 * beside.at("host_recode_s"));
}

TEST_CASE("timing the host's recodes needs the host's rates", "[tiers]") {
  const auto lines = kvtier::test::problems<RunSpec>(
      kvtier::test::quickstart_run(),
      {"policy.name=tiered", "tiering.prefetch_lookahead_layers=1",
       "tiering.host_allocation=PINNED", "tiering.copy_method=COPY_ENGINES",
       "tiering.synthetic_pattern=reasoning", "tiering.host_recode.threads=2",
       "tiering.host_recode.timing=STEP_PATH", "tiering.host_recode.chunk_token_layers=4",
       "tiering.host_recode.parallel_min_values=65536"});
  REQUIRE_FALSE(lines.empty());
  CHECK_THAT(lines.front(),
             Catch::Contains("tiering.host_recode") && Catch::Contains("declares no kv_recode"));
}
