// The live cache's T1 <-> T2 recodes on the host (kernels/impl/host_recode.hpp): every move runs
// once, each chunk with scratch of its own, and the CPU backend's recodes write the same bytes,
// the T2 format's, for every recode thread count, in the cache alone and in a live run.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/forward_observer.hpp"
#include "kernels/impl/host_recode.hpp"
#include "kernels/impl/kv_quantise.hpp"
#include "kernels/impl/worker_pool.hpp"
#include "kernels/tiered_cache.hpp"
#include "tests/kernels/support/wide_recodes.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::replay::Tier;

constexpr int kLayers = 4;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 64;
constexpr int kPositions = 64;
constexpr std::size_t kTokenFloats = 2 * kKvHeads * kHeadDim;

// What a layer's attention reads: per KV head, keys then values of every position.
using Read = std::vector<std::vector<float>>;

// A cache with recode_threads threads holding seeded token-layers, moved T0 -> T1 -> T2 and the
// even positions back to T1: 256 recodes a phase, enough for the pool to run them in parallel.
// Returns every layer's read and the recodes counted.
std::pair<std::vector<Read>, kk::CopyCounter> recoded(int recode_threads) {
  kvtier::config::ModelSpec spec;
  spec.set_num_hidden_layers(kLayers);
  spec.set_num_key_value_heads(kKvHeads);
  spec.set_head_dim(kHeadDim);
  kk::TieredCacheOptions options;
  options.max_positions = kPositions;
  options.recode_threads = recode_threads;
  kk::TieredKvCache cache(spec, options);
  std::mt19937 random(7);
  std::normal_distribution<float> value(0.0F, 2.0F);
  std::vector<float> keys(kTokenFloats / 2);
  std::vector<float> values(kTokenFloats / 2);
  for (int position = 0; position < kPositions; ++position) {
    for (int layer = 0; layer < kLayers; ++layer) {
      for (float& x : keys) {
        x = value(random);
      }
      for (float& x : values) {
        x = value(random);
      }
      cache.store({layer, position, kKvHeads, kHeadDim, keys, values});
    }
  }
  const auto move_all = [&](Tier to, int stride) {
    for (auto& layer : cache.placement()) {
      for (std::uint64_t p = 0; p < layer.size(); p += static_cast<std::uint64_t>(stride)) {
        layer.move(p, to);
      }
    }
    cache.apply_placement();
  };
  move_all(Tier::kHost, 1);
  move_all(Tier::kCompressed, 1);  // T1 -> T2
  move_all(Tier::kHost, 2);        // T2 -> T1, the even positions
  std::vector<Read> reads;
  for (int layer = 0; layer < kLayers; ++layer) {
    const kk::LayerKeyValues view = cache.load(layer, kPositions);
    Read read;
    for (int h = 0; h < kKvHeads; ++h) {
      const auto count = static_cast<std::size_t>(kPositions * kHeadDim);
      read.emplace_back(view.keys[static_cast<std::size_t>(h)],
                        view.keys[static_cast<std::size_t>(h)] + count);
      read.emplace_back(view.values[static_cast<std::size_t>(h)],
                        view.values[static_cast<std::size_t>(h)] + count);
    }
    reads.push_back(std::move(read));
  }
  return {reads, cache.stats().host_recode};
}

}  // namespace

TEST_CASE("host recodes run every move once, each chunk with scratch of its own",
          "[kernels][live][recode]") {
  for (const int threads : {1, 3}) {
    for (const std::size_t moves :
         {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
      INFO(threads << " threads, " << moves << " moves");
      kk::WorkerPool pool(threads);
      std::vector<std::atomic<int>> runs(moves);
      std::atomic<bool> scratch_shared{false};
      std::atomic<bool> scratch_missing{false};
      // Catch's assertions are not thread-safe: the body records, the checks come after.
      kk::recode_on_pool(pool, moves, 8192, 16, [&](std::size_t i, float* scratch) {
        if (scratch == nullptr) {
          scratch_missing = true;
          return;
        }
        for (int k = 0; k < 16; ++k) {
          scratch[k] = static_cast<float>(i);
        }
        std::this_thread::yield();  // another chunk writing the same scratch would show here
        for (int k = 0; k < 16; ++k) {
          if (scratch[k] != static_cast<float>(i)) {
            scratch_shared = true;
          }
        }
        ++runs[i];
      });
      CHECK_FALSE(scratch_missing);
      CHECK_FALSE(scratch_shared);
      for (std::size_t i = 0; i < moves; ++i) {
        REQUIRE(runs[i] == 1);
      }
    }
  }
  kk::WorkerPool pool(2);
  int without_scratch = 0;
  bool null_scratch = true;
  kk::recode_on_pool(pool, 3, 8, 0, [&](std::size_t, float* scratch) {
    null_scratch = null_scratch && scratch == nullptr;
    ++without_scratch;  // a small loop runs on the caller alone
  });
  CHECK(null_scratch);
  CHECK(without_scratch == 3);
}

TEST_CASE("the CPU backend's recodes write the T2 format's bytes for every thread count",
          "[kernels][live][recode]") {
  const auto [one, one_counted] = recoded(1);
  CHECK(one_counted.tokens == 2 * kLayers * kPositions - kLayers * kPositions / 2);
  for (const int threads : {2, 4}) {
    INFO(threads << " recode threads");
    const auto [many, many_counted] = recoded(threads);
    CHECK(many_counted.tokens == one_counted.tokens);
    CHECK(many_counted.bytes == one_counted.bytes);
    CHECK(many == one);
  }
  // What is read is the stored value through the T2 format: quantised once, read back (positions
  // back in T1 were dequantised there; the others are dequantised when staged).
  const auto [reads, counted] = recoded(3);
  std::mt19937 random(7);
  std::normal_distribution<float> value(0.0F, 2.0F);
  std::vector<std::vector<float>> stored(kLayers * kPositions, std::vector<float>(kTokenFloats));
  for (int position = 0; position < kPositions; ++position) {
    for (int layer = 0; layer < kLayers; ++layer) {
      for (float& x : stored[static_cast<std::size_t>(layer * kPositions + position)]) {
        x = value(random);
      }
    }
  }
  std::vector<std::int8_t> codes(kk::quantise::compressed_bytes(kKvHeads, kHeadDim));
  std::vector<float> expected(kTokenFloats);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int position = 0; position < kPositions; ++position) {
      kk::quantise::plain::quantise_token(
          stored[static_cast<std::size_t>(layer * kPositions + position)].data(), kKvHeads,
          kHeadDim, codes.data());
      kk::quantise::dequantise_token(codes.data(), kKvHeads, kHeadDim, expected.data());
      for (int h = 0; h < kKvHeads; ++h) {
        for (int d = 0; d < kHeadDim; ++d) {
          const auto at = static_cast<std::size_t>(position * kHeadDim + d);
          INFO("layer " << layer << " position " << position << " head " << h);
          REQUIRE(reads[layer][static_cast<std::size_t>(2 * h)][at] ==
                  expected[static_cast<std::size_t>(h * kHeadDim + d)]);
          REQUIRE(reads[layer][static_cast<std::size_t>(2 * h + 1)][at] ==
                  expected[static_cast<std::size_t>((kKvHeads + h) * kHeadDim + d)]);
        }
      }
    }
  }
}

TEST_CASE("a live run's recodes on several threads leave every logit and count as on one",
          "[kernels][live][recode]") {
  const auto engine = kk::make_cpu_engine(kk::testing::wide_kv_model());
  const kk::LiveResult one = kk::testing::follow_with_recodes(*engine, 1);
  // Steps whose recodes are enough for the pool to wake its threads: its threshold in
  // token-layers of 8,192 values.
  REQUIRE(kk::testing::most_recodes_in_a_step(one) >=
          static_cast<std::uint64_t>(kk::WorkerPool::kParallelWork / 8192));
  const kk::LiveResult many = kk::testing::follow_with_recodes(*engine, 3);
  CHECK(many.logits == one.logits);
  CHECK(many.cache.host_recode.tokens == one.cache.host_recode.tokens);
  CHECK(many.cache.host_recode.bytes == one.cache.host_recode.bytes);
  CHECK(many.cache.host_recode.runs == one.cache.host_recode.runs);
  CHECK(many.cache.h2d_compressed.tokens == one.cache.h2d_compressed.tokens);
  CHECK(many.final_tier_tokens == one.final_tier_tokens);
}
