// The live tiered cache's CUDA backend (kernels/cuda_tiered_cache.hpp) against the CPU backend and
// the CUDA engine's own cache. Needs a GPU (CTest label gpu; scripts/gpu-validate.sh runs it with
// KVTIER_REQUIRE_GPU set, so that it cannot pass without a device).
//
// - Tiering without eviction or compression leaves every logit bit-identical to the CUDA engine's
//   own cache, in FP32 and BF16, with both prefetch modes and T0 from 0% to 100%: the copies
//   are exact and attention reads the same values in the same order through the page table.
// - Following the same attention, the CUDA cache makes the CPU cache's moves, step by step and
//   layer by layer, and counts the same bytes for every kind of copy (FP32 slots are the CPU's
//   size; BF16 halves the full-precision kinds, not the compressed ones).
// - T2 encoded on the device (offloads) and on the host (recodes) decodes on the device to what
//   the CPU backend reads: logits within the engines' FP32 tolerance of the CPU run's.
// - The T0 budget is enforced on the device.
// - Staging any number of layers ahead (0 to past the model's layers) changes no logit, with
//   either way of copying.
// - Recodes on several host threads change no logit, byte count or move.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/cuda_tiered_cache.hpp"
#include "kernels/engine.hpp"
#include "kernels/live.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/tokenizer.hpp"
#include "replay/parameters.hpp"
#include "replay/synthetic_attention.hpp"
#include "tests/kernels/support/gpu.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "tests/kernels/support/wide_recodes.hpp"
#include "traces/synth.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::kernels::testing::stories_model;
namespace kr = kvtier::replay;
using kk::testing::gpu_present;

std::vector<std::int32_t> prompt() {
  return kk::testing::stories_prompt("Once upon a time, there was a little girl named Lily");
}

std::unique_ptr<kk::Engine> cuda_engine(
    kk::CudaComputeDtype dtype, kk::CudaAttention attention = kk::CudaEngineOptions{}.attention,
    std::shared_ptr<const kk::ModelWeights> weights = stories_model()) {
  kk::CudaEngineOptions options;
  options.dtype = dtype;
  options.attention = attention;
  // A live run reads the observed rows right after each decode.
  options.observer_delivery = kk::ObserverDelivery::kSynchronous;
  options.observer_rows = kk::ObserverRows::kHeadMean;
  // As `kvtier live`: the reference launches every kernel, as the cached engine must.
  options.graphs = kk::CudaGraphs::kOff;
  return kk::make_cuda_engine(std::move(weights), options);
}

std::string tiered(const std::string& params) {
  return "tiered:delta=8,recent=16,sinks=4," + params;
}

constexpr std::uint32_t kPrompt = 24;
constexpr int kFollowSteps = 150;

std::unique_ptr<kr::SyntheticAttention> source() {
  const kvtier::config::SyntheticAttention params =
      kvtier::traces::synthetic_preset("reasoning", 7);
  return std::make_unique<kr::SyntheticAttention>(stories_model()->spec, kPrompt, kFollowSteps,
                                                  params);
}

std::vector<std::int32_t> tokens(std::uint32_t count, std::int32_t first) {
  std::vector<std::int32_t> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    out.push_back(static_cast<std::int32_t>((first + 37 * static_cast<std::int32_t>(i)) % 512));
  }
  return out;
}

// A run following synthetic attention, on `engine`.
kk::LiveResult follow(kk::Engine& engine, const std::string& policy, bool keep_logits = false,
                      kk::CacheCopies copies = kk::CacheCopies::kKernels) {
  const auto followed = source();
  kk::LiveOptions options;
  options.copies = copies;
  options.policy = kr::parse_policy_string(policy);
  options.max_new_tokens = kFollowSteps;
  options.follow = followed.get();
  options.forced_tokens = tokens(kFollowSteps, 5);
  options.keep_logits = keep_logits;
  return kk::run_live(engine, nullptr, tokens(kPrompt, 1), options);
}

void require_same_counts(const kk::CopyCounter& cuda, const kk::CopyCounter& cpu,
                         std::uint64_t cuda_bytes_per_cpu_byte_num = 1,
                         std::uint64_t cuda_bytes_per_cpu_byte_den = 1) {
  REQUIRE(cuda.tokens == cpu.tokens);
  REQUIRE(cuda.bytes * cuda_bytes_per_cpu_byte_den == cpu.bytes * cuda_bytes_per_cpu_byte_num);
  // The same book, with the run's positions known to both: the same slots, so the same pieces.
  REQUIRE(cuda.runs == cpu.runs);
}

}  // namespace

TEST_CASE("the CUDA cache tiers without changing a logit", "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  constexpr int kSteps = 120;
  // Both attention kernels read through the page table and both ways of copying move the same
  // slots: each combination is exact on its own. Kernel copies first, so that a failure of the
  // copy engines cannot hide theirs.
  for (const auto copies : {kk::CacheCopies::kKernels, kk::CacheCopies::kCopyEngines}) {
    for (const auto& [dtype, attention] :
         {std::pair{kk::CudaComputeDtype::kFP32, kk::CudaAttention::kSplitKeys},
          std::pair{kk::CudaComputeDtype::kBF16, kk::CudaAttention::kSplitKeys},
          std::pair{kk::CudaComputeDtype::kFP32, kk::CudaAttention::kPerHead},
          std::pair{kk::CudaComputeDtype::kBF16, kk::CudaAttention::kPerHead}}) {
      const auto engine = cuda_engine(dtype, attention);
      const auto reference = cuda_engine(dtype, attention);
      for (const std::string prefetch : {"full", "differential"}) {
        for (const std::string hbm : {"0", "0.3", "1"}) {
          INFO("dtype " << kk::cuda_compute_dtype_name(dtype) << ", "
                        << kk::cuda_attention_name(attention) << " attention, "
                        << kk::cache_copies_name(copies) << " copies, prefetch " << prefetch
                        << ", hbm " << hbm);
          kk::LiveOptions options;
          options.policy = kr::parse_policy_string(
              tiered("evict=0,compress=0,hbm=" + hbm + ",prefetch=" + prefetch));
          options.copies = copies;
          options.max_new_tokens = kSteps;
          const kk::LiveResult result = kk::run_live(*engine, reference.get(), prompt(), options);
          CHECK(result.identical_logit_steps == static_cast<std::uint64_t>(kSteps));
          CHECK(result.mean_kl == 0.0);
          CHECK(result.agreement == static_cast<std::uint64_t>(kSteps));
          if (hbm != "1") {
            // T1 really holds tokens and attention really reads them from staging.
            CHECK(result.cache.h2d_prefetch.tokens > 0);
            CHECK(result.cache.d2h_offload.tokens > 0);
            CHECK(result.cache.h2d_prefetch.seconds > 0.0);
            CHECK(result.cache.d2h_offload.seconds > 0.0);
          }
        }
      }
    }
  }
}

TEST_CASE("the CUDA cache makes the CPU cache's moves and copies the same bytes", "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  const auto cpu = kk::make_cpu_engine(stories_model());
  const auto fp32 = cuda_engine(kk::CudaComputeDtype::kFP32);
  const auto bf16 = cuda_engine(kk::CudaComputeDtype::kBF16);
  for (const std::string& policy :
       {tiered("hbm=0.3,evict=0.2,compress=0.5,prefetch=full"),
        tiered("hbm=0.3,evict=0.2,compress=0.5,prefetch=differential"),
        tiered("hbm=0,evict=0,compress=0"), std::string("h2o:budget=64"),
        std::string("monarch:attend=all,compression=int8,window=32,max_hot=64"),
        std::string("dms:budget=64,delay=16")}) {
    INFO(policy);
    const kk::LiveResult on_cpu = follow(*cpu, policy);
    const kk::LiveResult on_fp32 = follow(*fp32, policy);
    const kk::LiveResult on_bf16 = follow(*bf16, policy);
    // The copy engines move the same slots: the same moves, bytes and logits as the kernels.
    const kk::LiveResult on_engines = follow(*fp32, policy, true, kk::CacheCopies::kCopyEngines);
    const kk::LiveResult on_kernels = follow(*fp32, policy, true);
    REQUIRE(on_engines.logits == on_kernels.logits);
    require_same_counts(on_engines.cache.h2d_prefetch, on_kernels.cache.h2d_prefetch);
    require_same_counts(on_engines.cache.h2d_promote, on_kernels.cache.h2d_promote);
    require_same_counts(on_engines.cache.d2h_offload, on_kernels.cache.d2h_offload);
    for (const kk::LiveResult* cuda : {&on_fp32, &on_bf16, &on_engines}) {
      for (std::uint64_t step = 0; step < static_cast<std::uint64_t>(kFollowSteps); ++step) {
        for (std::uint32_t layer = 0; layer < on_cpu.demand.layers(); ++layer) {
          CAPTURE(step, layer);
          REQUIRE(cuda->demand.at(step, layer) == on_cpu.demand.at(step, layer));
        }
      }
      REQUIRE(cuda->final_tier_tokens == on_cpu.final_tier_tokens);
      REQUIRE(cuda->cache.evicted_tokens == on_cpu.cache.evicted_tokens);
    }
    // FP32 slots are the CPU backend's size: every count and byte equal.
    const kk::TieredCacheStats& a = on_fp32.cache;
    const kk::TieredCacheStats& b = on_cpu.cache;
    require_same_counts(a.h2d_prefetch, b.h2d_prefetch);
    require_same_counts(a.h2d_compressed, b.h2d_compressed);
    require_same_counts(a.h2d_promote, b.h2d_promote);
    require_same_counts(a.d2h_offload, b.d2h_offload);
    require_same_counts(a.host_recode, b.host_recode);
    REQUIRE(a.t0_peak_bytes == b.t0_peak_bytes);
    REQUIRE(a.t1_peak_bytes == b.t1_peak_bytes);
    REQUIRE(a.t2_peak_bytes == b.t2_peak_bytes);
    REQUIRE(a.staging_peak_bytes == b.staging_peak_bytes);
    // BF16 halves full-precision copies; the T2 format is the same.
    const kk::TieredCacheStats& h = on_bf16.cache;
    require_same_counts(h.h2d_prefetch, b.h2d_prefetch, 1, 2);
    require_same_counts(h.h2d_compressed, b.h2d_compressed);
    // Promotions, offloads and recodes mix full-precision and T2 tokens, so no one byte ratio:
    // the same tokens in the same pieces.
    for (const auto counter :
         {&kk::TieredCacheStats::h2d_promote, &kk::TieredCacheStats::d2h_offload,
          &kk::TieredCacheStats::host_recode}) {
      REQUIRE((h.*counter).tokens == (b.*counter).tokens);
      REQUIRE((h.*counter).runs == (b.*counter).runs);
    }
    REQUIRE(h.t1_peak_bytes * 2 == b.t1_peak_bytes);
    REQUIRE(h.t2_peak_bytes == b.t2_peak_bytes);
  }
}

TEST_CASE("T2 encoded on the device and on the host decodes on the device as on the CPU",
          "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  const auto cpu = kk::make_cpu_engine(stories_model());
  const auto fp32 = cuda_engine(kk::CudaComputeDtype::kFP32);
  // Offloads straight to T2 (quantised on the device) and T1 <-> T2 recodes (on the host).
  for (const std::string& policy :
       {tiered("hbm=0.2,evict=0,compress=1"),
        std::string("monarch:attend=all,compression=int8,window=32,max_hot=64")}) {
    INFO(policy);
    const kk::LiveResult on_cpu = follow(*cpu, policy, true);
    const kk::LiveResult on_gpu = follow(*fp32, policy, true);
    REQUIRE(on_gpu.cache.h2d_compressed.tokens > 0);
    REQUIRE(on_gpu.logits.size() == on_cpu.logits.size());
    float largest = 0.0F;
    float spread = 0.0F;
    for (std::size_t step = 0; step < on_cpu.logits.size(); ++step) {
      for (std::size_t i = 0; i < on_cpu.logits[step].size(); ++i) {
        largest = std::max(largest, std::fabs(on_gpu.logits[step][i] - on_cpu.logits[step][i]));
        spread = std::max(spread, std::fabs(on_cpu.logits[step][i]));
      }
    }
    // The engines' K/V differ by rounding (their FP32 logits agree to 1e-4 of the spread,
    // test_cuda_engine.cpp), and int8 quantisation turns a value on a rounding boundary into a
    // whole code step: K/V perturbed by 1e-5 on the CPU backend moved these logits by up to
    // 2e-4 of the spread. Quantising at all moves them by about 2% of it, so a wrong T2 format
    // cannot pass.
    INFO("largest difference " << largest << ", logit spread " << spread);
    REQUIRE(largest < 1e-3F * spread);
  }
}

TEST_CASE("the CUDA cache's T0 arena is the budget", "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  const auto engine = cuda_engine(kk::CudaComputeDtype::kBF16);
  // stories260K: 4 KV heads of 8, keys and values, bf16: 128 bytes a token-layer.
  constexpr std::uint64_t kTokenLayer = 2 * 4 * 8 * 2;
  kk::LiveOptions options;
  options.policy = kr::parse_policy_string("h2o:budget=32");
  options.max_new_tokens = 100;
  options.t0_budget_bytes = 5 * (32 + 1) * kTokenLayer;
  const kk::LiveResult result = kk::run_live(*engine, nullptr, prompt(), options);
  REQUIRE(result.cache.t0_peak_bytes <= options.t0_budget_bytes);
  REQUIRE(result.cache.evicted_tokens > 0);
  options.t0_budget_bytes = kTokenLayer - 1;
  REQUIRE_THROWS_AS(kk::run_live(*engine, nullptr, prompt(), options), kvtier::ConfigError);
  options.policy = kr::parse_policy_string("full");
  options.t0_budget_bytes = 5 * 20 * kTokenLayer;
  REQUIRE_THROWS_AS(kk::run_live(*engine, nullptr, prompt(), options), kvtier::ConfigError);
}

TEST_CASE("the CUDA cache stages any number of layers ahead without changing a logit",
          "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  constexpr int kSteps = 60;
  const auto engine = cuda_engine(kk::CudaComputeDtype::kFP32);
  const auto reference = cuda_engine(kk::CudaComputeDtype::kFP32);
  const auto run = [&](const std::string& policy, int lookahead,
                       kk::CacheCopies copies = kk::CacheCopies::kKernels) {
    kk::LiveOptions options;
    options.policy = kr::parse_policy_string(policy);
    options.max_new_tokens = kSteps;
    options.staging_lookahead = lookahead;
    options.copies = copies;
    options.keep_logits = true;
    return kk::run_live(*engine, reference.get(), prompt(), options);
  };
  // The copy engines stage beside compute, where the lookahead lets copies run ahead.
  for (const int lookahead : {0, 1, 3, 8}) {
    INFO("copy engines, lookahead " << lookahead);
    const kk::LiveResult engines =
        run(tiered("evict=0,compress=0,hbm=0.3"), lookahead, kk::CacheCopies::kCopyEngines);
    CHECK(engines.identical_logit_steps == static_cast<std::uint64_t>(kSteps));
    CHECK(engines.cache.h2d_prefetch.tokens > 0);
  }
  for (const std::string prefetch : {"full", "differential"}) {
    const std::string exact = tiered("evict=0,compress=0,hbm=0.3,prefetch=" + prefetch);
    const std::string with_t2 = tiered("evict=0.1,compress=0.5,hbm=0.3,prefetch=" + prefetch);
    const kk::LiveResult one_ahead = run(with_t2, 1);
    // stories260K has 5 layers: 0 stages each layer behind the previous one's attention, 8 the
    // whole model at the forward call's start.
    for (const int lookahead : {0, 2, 4, 8}) {
      INFO("prefetch " << prefetch << ", lookahead " << lookahead);
      const kk::LiveResult tiered_exact = run(exact, lookahead);
      CHECK(tiered_exact.identical_logit_steps == static_cast<std::uint64_t>(kSteps));
      CHECK(tiered_exact.cache.h2d_prefetch.tokens > 0);
      // The same staged values in any order of staging: the T2 run's logits too.
      const kk::LiveResult t2 = run(with_t2, lookahead);
      CHECK(t2.logits == one_ahead.logits);
      CHECK(t2.cache.h2d_compressed.tokens == one_ahead.cache.h2d_compressed.tokens);
      // One transient region per layer in flight: more memory ahead, none for lookahead 0 beyond
      // its single region.
      if (lookahead > 1 && prefetch == "full") {
        CHECK(t2.allocation.staging_bytes > one_ahead.allocation.staging_bytes);
      }
    }
  }
  kk::LiveOptions options;
  options.policy = kr::parse_policy_string(tiered("hbm=0.3"));
  options.max_new_tokens = 4;
  options.staging_lookahead = kk::kMostStagingLookahead + 1;
  CHECK_THROWS_AS(kk::run_live(*engine, nullptr, prompt(), options), kvtier::ConfigError);
}

TEST_CASE("the CUDA cache's recodes on several threads change no logit", "[gpu][live]") {
  if (!gpu_present()) {
    return;
  }
  const auto engine = cuda_engine(kk::CudaComputeDtype::kFP32, kk::CudaEngineOptions{}.attention,
                                  kk::testing::wide_kv_model());
  const kk::LiveResult one = kk::testing::follow_with_recodes(*engine, 1);
  // Enough recodes at once for the pool to wake its threads (8,192 values a token-layer).
  REQUIRE(kk::testing::most_recodes_in_a_step(one) >= 8);
  const kk::LiveResult eight = kk::testing::follow_with_recodes(*engine, 8);
  REQUIRE(eight.logits == one.logits);
  require_same_counts(eight.cache.host_recode, one.cache.host_recode);
  require_same_counts(eight.cache.h2d_compressed, one.cache.h2d_compressed);
  require_same_counts(eight.cache.h2d_promote, one.cache.h2d_promote);
  // The CPU backend makes the same moves from the same attention.
  const auto cpu = kk::make_cpu_engine(kk::testing::wide_kv_model());
  const kk::LiveResult on_cpu = kk::testing::follow_with_recodes(*cpu, 1);
  for (std::uint64_t step = 0; step < on_cpu.demand.steps(); ++step) {
    for (std::uint32_t layer = 0; layer < on_cpu.demand.layers(); ++layer) {
      CAPTURE(step, layer);
      REQUIRE(eight.demand.at(step, layer) == on_cpu.demand.at(step, layer));
    }
  }
}
