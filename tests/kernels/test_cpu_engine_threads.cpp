// The CPU engine's threads: a worker pool that runs every chunk once, concurrently when it has
// workers, and an engine whose logits and observed attention are the same bits for every thread
// count, because its work is cut by the model's shape and never by the number of threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/impl/worker_pool.hpp"
#include "kernels/random_model.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;

namespace {

constexpr std::int64_t kParallel = kk::WorkerPool::kParallelWork;

// Everything an engine shows of a run, in the order it showed it.
class RecordingObserver final : public kk::ForwardObserver {
 public:
  void on_key_value(const kk::KeyValueWrite& write) override {
    keys.insert(keys.end(), write.keys.begin(), write.keys.end());
    keys.insert(keys.end(), write.values.begin(), write.values.end());
  }
  void on_attention(const kk::AttentionStep& step) override {
    order.emplace_back(step.layer, step.query_position);
    queries.insert(queries.end(), step.queries.begin(), step.queries.end());
    probabilities.insert(probabilities.end(), step.probabilities.begin(), step.probabilities.end());
  }

  std::vector<std::pair<int, int>> order;
  std::vector<float> keys;
  std::vector<float> queries;
  std::vector<float> probabilities;
};

struct Run {
  std::vector<float> logits;  // the prefill's, then every decode step's
  RecordingObserver observed;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Wide enough that the products and attention heads pass kParallelWork: q/o projections of
// 256 x 256, an MLP of 256 x 512, 8 query heads over 2 KV heads, 150+ keys at decode.
kvtier::config::ModelSpec wide_spec(kvtier::config::Architecture architecture) {
  kvtier::config::ModelSpec spec = kk::testing::small_spec(architecture);
  spec.set_hidden_size(256);
  spec.set_num_attention_heads(8);
  spec.set_num_key_value_heads(2);
  spec.set_head_dim(32);
  spec.set_intermediate_size(512);
  spec.set_vocab_size(1024);
  spec.set_max_position_embeddings(256);
  if (spec.has_sliding_window()) {
    spec.set_sliding_window(64);
  }
  return spec;
}

Run run(const std::shared_ptr<const kk::ModelWeights>& weights, int threads, int prompt_tokens,
        int decode_steps) {
  kk::CpuEngineOptions options;
  options.threads = threads;
  const auto engine = kk::make_cpu_engine(weights, options);
  Run result;
  engine->set_observer(&result.observed);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < prompt_tokens; ++i) {
    prompt.push_back((i * 37 + 11) % 1024);
  }
  auto logits = engine->prefill(prompt);
  result.logits.assign(logits.begin(), logits.end());
  for (int step = 0; step < decode_steps; ++step) {
    logits = engine->decode((step * 53 + 7) % 1024);
    result.logits.insert(result.logits.end(), logits.begin(), logits.end());
  }
  return result;
}

}  // namespace

TEST_CASE("a worker pool runs every chunk exactly once", "[kernels][threads]") {
  for (const int threads : {1, 2, 4}) {
    CAPTURE(threads);
    kk::WorkerPool pool(threads);
    CHECK(pool.threads() == threads);
    for (int loop = 0; loop < 50; ++loop) {
      const int chunks = 1 + loop * 7;
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(chunks));
      pool.for_each_chunk(chunks, kParallel,
                          [&](int chunk) { runs[static_cast<std::size_t>(chunk)].fetch_add(1); });
      for (const std::atomic<int>& count : runs) {
        REQUIRE(count.load() == 1);
      }
    }
  }
}

TEST_CASE("a pool of two runs two chunks at once", "[kernels][threads]") {
  kk::WorkerPool pool(2);
  // Each chunk waits until the other has started: with one thread the first would wait forever,
  // so it gives up after a while and the test fails.
  std::atomic<int> started{0};
  std::atomic<bool> met{true};
  pool.for_each_chunk(2, kParallel, [&](int) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        met = false;
        return;
      }
      std::this_thread::yield();
    }
  });
  CHECK(met.load());
}

TEST_CASE("a chunk's exception reaches the caller after every thread has left the loop",
          "[kernels][threads]") {
  kk::WorkerPool pool(3);
  CHECK_THROWS_WITH(pool.for_each_chunk(1000, kParallel,
                                        [&](int chunk) {
                                          if (chunk == 10) {
                                            throw std::runtime_error("chunk 10 failed");
                                          }
                                        }),
                    "chunk 10 failed");
  // The pool is whole afterwards.
  std::atomic<int> next{0};
  pool.for_each_chunk(64, kParallel, [&](int) { next.fetch_add(1); });
  CHECK(next.load() == 64);
}

TEST_CASE("small loops and pools of one run on the calling thread", "[kernels][threads]") {
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mutex;
  std::set<std::thread::id> ran_on;
  const auto record = [&](int) {
    const std::lock_guard lock(mutex);
    ran_on.insert(std::this_thread::get_id());
  };
  kk::WorkerPool four(4);
  four.for_each_chunk(64, kParallel - 1, record);
  kk::WorkerPool one(1);
  one.for_each_chunk(64, kParallel, record);
  CHECK(ran_on == std::set<std::thread::id>{caller});
  CHECK_THROWS_AS(kk::WorkerPool(0), kvtier::ConfigError);
}

TEST_CASE("the CPU engine gives the same bits for every thread count", "[kernels][threads]") {
  for (const kvtier::config::Architecture architecture :
       {kvtier::config::LLAMA, kvtier::config::QWEN2, kvtier::config::QWEN3,
        kvtier::config::MISTRAL}) {
    CAPTURE(architecture);
    const auto weights =
        std::make_shared<const kk::ModelWeights>(kk::random_model(wide_spec(architecture)));
    // 150 prompt rows: attention in three blocks of rows (64, 64, 22).
    const Run single = run(weights, 1, 150, 12);
    REQUIRE(single.observed.order.size() == 2U * (150 + 12));
    for (const int threads : {2, 3, 4}) {
      CAPTURE(threads);
      const Run threaded = run(weights, threads, 150, 12);
      CHECK(same_bits(threaded.logits, single.logits));
      CHECK(threaded.observed.order == single.observed.order);
      CHECK(same_bits(threaded.observed.keys, single.observed.keys));
      CHECK(same_bits(threaded.observed.queries, single.observed.queries));
      CHECK(same_bits(threaded.observed.probabilities, single.observed.probabilities));
    }
  }
}

TEST_CASE("a threaded prefill over several blocks of rows gives the logits of decoding",
          "[kernels][threads]") {
  const auto weights =
      std::make_shared<const kk::ModelWeights>(kk::random_model(wide_spec(kvtier::config::QWEN2)));
  kk::CpuEngineOptions options;
  options.threads = 3;
  const auto batched = kk::make_cpu_engine(weights, options);
  const auto stepwise = kk::make_cpu_engine(weights, options);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 140; ++i) {
    prompt.push_back((i * 29 + 5) % 1024);
  }
  CHECK(kk::testing::prefill_decode_gap(*batched, *stepwise, prompt) <= 1e-4F);
}
