// The CUDA engine against the CPU engine (docs/ENGINE.md, "The CUDA engine"). Needs a GPU: the
// test cases carry the CTest label `gpu`, which CI excludes, and each returns at once (with a
// warning) when no CUDA device is present, or fails when KVTIER_REQUIRE_GPU is set (as
// scripts/gpu-validate.sh does), so that a GPU run cannot pass without checking anything.
//
// In FP32 the engines may differ by rounding only: the same greedy tokens, logits within 1e-3,
// attention probabilities within 1e-5, on stories260K (llama2.c layout, GQA) and on seeded random
// Qwen2 (biases, tied embedding), Qwen3 (q/k norms), Mistral (sliding window) and Llama
// (Llama-3 RoPE scaling) models. BF16 and FP16 are checked against looser bounds. Observation
// is checked in every mode: per-head rows or head means, asynchronous or synchronous delivery,
// staging rings small enough to split prefills into many records and to be grown.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/device_info.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/sampler.hpp"
#include "kernels/tracer.hpp"
#include "tests/kernels/support/gpu.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "traces/reader.hpp"
#include "traces/validate.hpp"

namespace kk = kvtier::kernels;
using kvtier::kernels::testing::stories_model;
namespace kt = kvtier::traces;
namespace fs = std::filesystem;
namespace cfg = kvtier::config;

namespace {

using kk::testing::gpu_present;

const std::vector<std::int32_t>& stories_prompt() {
  static const std::vector<std::int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 299};
  return prompt;
}

// A seeded random model of `architecture` (tests/kernels/support), with Llama-3 RoPE scaling for
// LLAMA so that the scaled frequencies are exercised too. A positive `sliding_window` replaces
// the small spec's.
std::shared_ptr<const kk::ModelWeights> random_model(cfg::Architecture architecture,
                                                     const fs::path& directory,
                                                     int sliding_window = 0) {
  cfg::ModelSpec spec = kk::testing::small_spec(architecture);
  if (sliding_window > 0) {
    spec.set_sliding_window(static_cast<std::uint32_t>(sliding_window));
  }
  kk::testing::write_random_hf_model(spec, directory, 11);
  kk::ModelWeights weights = kk::load_hf_checkpoint(directory);
  if (architecture == cfg::LLAMA) {
    cfg::RopeScaling& scaling = *weights.spec.mutable_rope_scaling();
    scaling.set_rope_type("llama3");
    scaling.set_factor(8.0);
    scaling.set_low_freq_factor(1.0);
    scaling.set_high_freq_factor(4.0);
    scaling.set_original_max_position_embeddings(16);
  }
  return std::make_shared<const kk::ModelWeights>(std::move(weights));
}

kk::CudaEngineOptions options(kk::CudaComputeDtype dtype = kk::CudaComputeDtype::kFP32,
                              kk::CudaAttention attention = kk::CudaAttention::kPerHead) {
  kk::CudaEngineOptions result;
  result.dtype = dtype;
  result.attention = attention;
  // cuBLAS and launched steps, which the warp-rows and decode-graph tests compare against.
  result.gemm = kk::CudaGemm::kCublas;
  result.graphs = kk::CudaGraphs::kOff;
  return result;
}

// A NaN on either side is the largest difference there is (std::max would drop it).
float max_difference(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float most = 0.0F;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float difference = std::abs(a[i] - b[i]);
    most = std::isnan(difference) ? std::numeric_limits<float>::infinity()
                                  : std::max(most, difference);
  }
  return most;
}

float spread(std::span<const float> values) {
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  return *high - *low;
}

// Runs the prompt and then `forced` tokens (teacher forcing) on both engines; returns the
// largest logit difference of any call relative to that call's spread of CPU logits.
double relative_logit_difference(kk::Engine& cpu, kk::Engine& cuda,
                                 std::span<const std::int32_t> prompt,
                                 std::span<const std::int32_t> forced) {
  cpu.reset();
  cuda.reset();
  double most = 0.0;
  const auto compare = [&](std::span<const float> expected, std::span<const float> got) {
    for (const float value : got) {
      REQUIRE(std::isfinite(value));
    }
    most = std::max(most, static_cast<double>(max_difference(expected, got)) / spread(expected));
  };
  {
    const std::vector<float> expected = [&] {
      const auto logits = cpu.prefill(prompt);
      return std::vector<float>(logits.begin(), logits.end());
    }();
    compare(expected, cuda.prefill(prompt));
  }
  for (const std::int32_t token : forced) {
    const auto logits = cpu.decode(token);
    const std::vector<float> expected(logits.begin(), logits.end());
    compare(expected, cuda.decode(token));
  }
  return most;
}

// Every observer call, in order, with copies of its spans.
class Recording final : public kk::ForwardObserver {
 public:
  struct Call {
    bool attention = false;
    int layer = 0;
    int position = 0;
    bool prefill = false;
    int first_key = 0;
    int key_count = 0;
    int heads = 0;
    int kv_heads = 0;
    int head_dim = 0;
    std::vector<float> first;   // queries, or keys
    std::vector<float> second;  // probabilities, or values
  };

  void on_key_value(const kk::KeyValueWrite& write) override {
    Call call;
    call.layer = write.layer;
    call.position = write.position;
    call.kv_heads = write.kv_heads;
    call.head_dim = write.head_dim;
    call.first.assign(write.keys.begin(), write.keys.end());
    call.second.assign(write.values.begin(), write.values.end());
    calls.push_back(std::move(call));
  }
  void on_attention(const kk::AttentionStep& step) override {
    Call call;
    call.attention = true;
    call.layer = step.layer;
    call.position = step.query_position;
    call.prefill = step.prefill;
    call.first_key = step.first_key_position;
    call.key_count = step.key_count;
    call.heads = step.query_heads;
    call.kv_heads = step.kv_heads;
    call.head_dim = step.head_dim;
    call.first.assign(step.queries.begin(), step.queries.end());
    call.second.assign(step.probabilities.begin(), step.probabilities.end());
    calls.push_back(std::move(call));
  }

  std::vector<Call> calls;
};

// Largest difference relative to the larger of 1 and the largest magnitude in `expected`.
float relative_difference(std::span<const float> expected, std::span<const float> got) {
  float scale = 1.0F;
  for (const float value : expected) {
    scale = std::max(scale, std::abs(value));
  }
  return max_difference(expected, got) / scale;
}

// The CUDA engine's observations against the CPU engine's: the same calls in the same order,
// queries, keys and values within `vector_margin` (relative to each vector's largest magnitude),
// probabilities within `probability_margin`. With `head_mean` the CUDA rows are the head mean of
// the CPU rows, in every head.
void check_observations(const Recording& cpu, const Recording& cuda, double vector_margin,
                        double probability_margin, bool head_mean) {
  REQUIRE(cuda.calls.size() == cpu.calls.size());
  for (std::size_t i = 0; i < cpu.calls.size(); ++i) {
    const Recording::Call& a = cpu.calls[i];
    const Recording::Call& b = cuda.calls[i];
    INFO("call " << i << ": " << (a.attention ? "attention" : "key/value") << ", layer " << a.layer
                 << ", position " << a.position);
    REQUIRE(b.attention == a.attention);
    REQUIRE(b.layer == a.layer);
    REQUIRE(b.position == a.position);
    REQUIRE(b.prefill == a.prefill);
    REQUIRE(b.first_key == a.first_key);
    REQUIRE(b.key_count == a.key_count);
    REQUIRE(b.heads == a.heads);
    REQUIRE(b.kv_heads == a.kv_heads);
    REQUIRE(b.head_dim == a.head_dim);
    REQUIRE(b.first.size() == a.first.size());
    REQUIRE(b.second.size() == a.second.size());
    CHECK(relative_difference(a.first, b.first) <= vector_margin);
    if (!a.attention) {
      CHECK(relative_difference(a.second, b.second) <= vector_margin);
      continue;
    }
    if (!head_mean) {
      CHECK(max_difference(a.second, b.second) <= probability_margin);
      continue;
    }
    const auto keys = static_cast<std::size_t>(a.key_count);
    for (std::size_t key = 0; key < keys; ++key) {
      float mean = 0.0F;
      for (int head = 0; head < a.heads; ++head) {
        mean += a.second[static_cast<std::size_t>(head) * keys + key];
      }
      mean *= 1.0F / static_cast<float>(a.heads);
      for (int head = 0; head < a.heads; ++head) {
        CHECK(std::abs(b.second[static_cast<std::size_t>(head) * keys + key] - mean) <=
              probability_margin);
      }
    }
  }
}

// A prefill of `prompt` and `steps` greedy decode steps with `observer` attached; the observer is
// detached (which waits for every pending call) before returning.
std::vector<std::int32_t> observed_run(kk::Engine& engine, std::span<const std::int32_t> prompt,
                                       int steps, kk::ForwardObserver& observer) {
  engine.reset();
  engine.set_observer(&observer);
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  std::span<const float> logits = engine.prefill(prompt);
  for (int step = 0; step < steps; ++step) {
    tokens.push_back(kk::argmax(logits));
    logits = engine.decode(tokens.back());
  }
  engine.set_observer(nullptr);
  return tokens;
}

// Teacher-forced through `tokens` (another engine's run), observed: prefills the first
// `prompt` tokens and decodes the rest, so that both engines see the same positions.
void forced_observed_run(kk::Engine& engine, std::span<const std::int32_t> tokens,
                         std::size_t prompt, kk::ForwardObserver& observer) {
  engine.reset();
  engine.set_observer(&observer);
  static_cast<void>(engine.prefill(tokens.first(prompt)));
  for (std::size_t i = prompt; i < tokens.size(); ++i) {
    static_cast<void>(engine.decode(tokens[i]));
  }
  engine.set_observer(nullptr);
}

std::vector<std::int32_t> greedy(kk::Engine& engine, std::span<const std::int32_t> prompt,
                                 int new_tokens) {
  kk::GenerationOptions generation;
  generation.max_new_tokens = new_tokens;
  return kk::generate(engine, prompt, generation).tokens;
}

}  // namespace

TEST_CASE("stories260K: the CUDA engine in FP32 gives the CPU engine's tokens and logits",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto cpu = kk::make_cpu_engine(stories_model());
  const auto cuda = kk::make_cuda_engine(stories_model(), options());
  CHECK(cuda->backend() == "cuda");
  CHECK(cuda->spec().name() == cpu->spec().name());

  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 200);
  CHECK(greedy(*cuda, stories_prompt(), 200) == expected);
  // Teacher-forced along the CPU's tokens, without reserve(): the KV cache grows on the way.
  const std::span<const std::int32_t> forced =
      std::span<const std::int32_t>(expected).subspan(stories_prompt().size());
  CHECK(relative_logit_difference(*cpu, *cuda, stories_prompt(), forced) < 1e-4);
  CHECK(cuda->position() == static_cast<int>(expected.size()));

  // A prefill split differently gives the same logits: the prompt in two calls.
  cuda->reset();
  const std::span<const std::int32_t> prompt(stories_prompt());
  static_cast<void>(cuda->prefill(prompt.first(3)));
  const auto split = cuda->prefill(prompt.subspan(3));
  const std::vector<float> split_logits(split.begin(), split.end());
  cpu->reset();
  CHECK(max_difference(cpu->prefill(prompt), split_logits) < 1e-3F);
}

TEST_CASE("stories260K in BF16 and FP16 stays close to the CPU engine", "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto cpu = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 64);
  const std::span<const std::int32_t> forced =
      std::span<const std::int32_t>(expected).subspan(stories_prompt().size());
  // Bounds relative to each call's spread of logits; set before any GPU run, from the rounding
  // of 8 (BF16) and 11 (FP16) significant bits through five layers.
  const auto bf16 = kk::make_cuda_engine(stories_model(), options(kk::CudaComputeDtype::kBF16));
  CHECK(relative_logit_difference(*cpu, *bf16, stories_prompt(), forced) < 0.05);
  const auto fp16 = kk::make_cuda_engine(stories_model(), options(kk::CudaComputeDtype::kFP16));
  CHECK(relative_logit_difference(*cpu, *fp16, stories_prompt(), forced) < 0.01);

  Recording cpu_calls;
  Recording cuda_calls;
  const std::vector<std::int32_t> tokens = observed_run(*cpu, stories_prompt(), 4, cpu_calls);
  forced_observed_run(*bf16, tokens, tokens.size() - 4, cuda_calls);
  check_observations(cpu_calls, cuda_calls, 0.05, 0.05, false);
}

TEST_CASE("random Qwen2, Qwen3, Mistral and Llama models: FP32 tokens, logits, observations",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const kk::testing::TempDir temp("cuda-random");
  const std::vector<std::int32_t> prompt = {3,  14, 15, 9, 26, 5,  35, 8,  9, 7,
                                            53, 58, 9,  7, 29, 23, 8,  46, 2, 6};
  for (const auto architecture : {cfg::QWEN2, cfg::QWEN3, cfg::MISTRAL, cfg::LLAMA}) {
    CAPTURE(cfg::Architecture_Name(architecture));
    const auto weights =
        random_model(architecture, temp.path() / cfg::Architecture_Name(architecture));
    const auto cpu = kk::make_cpu_engine(weights);
    const auto cuda = kk::make_cuda_engine(weights, options());
    const std::vector<std::int32_t> expected = greedy(*cpu, prompt, 40);
    CHECK(greedy(*cuda, prompt, 40) == expected);
    const std::span<const std::int32_t> forced =
        std::span<const std::int32_t>(expected).subspan(prompt.size());
    CHECK(relative_logit_difference(*cpu, *cuda, prompt, forced) < 1e-4);

    Recording cpu_calls;
    const std::vector<std::int32_t> tokens = observed_run(*cpu, prompt, 12, cpu_calls);
    struct Mode {
      kk::ObserverRows rows;
      kk::ObserverDelivery delivery;
      std::size_t ring_bytes;
    };
    // Default ring; a 4 KiB ring that splits the prefill into many records and wraps; a 256-byte
    // ring that single records outgrow. With the default ring and asynchronous delivery a decode
    // step's observation is gathered on the device and copied once; otherwise layer by layer:
    // the two must agree to the last bit (the recordings of the first and last mode of each
    // kind of rows are compared below).
    std::vector<Recording> recordings;
    for (const Mode mode :
         {Mode{kk::ObserverRows::kPerHead, kk::ObserverDelivery::kAsynchronous,
               std::size_t{256} << 20U},
          Mode{kk::ObserverRows::kPerHead, kk::ObserverDelivery::kAsynchronous, 4096},
          Mode{kk::ObserverRows::kPerHead, kk::ObserverDelivery::kSynchronous, 4096},
          Mode{kk::ObserverRows::kHeadMean, kk::ObserverDelivery::kAsynchronous,
               std::size_t{256} << 20U},
          Mode{kk::ObserverRows::kHeadMean, kk::ObserverDelivery::kAsynchronous, 256},
          Mode{kk::ObserverRows::kHeadMean, kk::ObserverDelivery::kSynchronous,
               std::size_t{256} << 20U}}) {
      CAPTURE(static_cast<int>(mode.rows), static_cast<int>(mode.delivery), mode.ring_bytes);
      kk::CudaEngineOptions observed = options();
      observed.observer_rows = mode.rows;
      observed.observer_delivery = mode.delivery;
      observed.observer_ring_bytes = mode.ring_bytes;
      const auto engine = kk::make_cuda_engine(weights, observed);
      Recording cuda_calls;
      CHECK(observed_run(*engine, prompt, 12, cuda_calls) == tokens);
      check_observations(cpu_calls, cuda_calls, 1e-4, 1e-5,
                         mode.rows == kk::ObserverRows::kHeadMean);
      recordings.push_back(std::move(cuda_calls));
    }
    check_observations(recordings[2], recordings[0], 0.0, 0.0, false);
    check_observations(recordings[5], recordings[3], 0.0, 0.0, false);
  }
}

TEST_CASE("a trace captured on the CUDA engine holds the CPU engine's rows",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const kk::testing::TempDir temp("cuda-capture");
  kk::CaptureOptions capture;
  capture.generation.max_new_tokens = 40;
  capture.contents.heads = true;
  capture.contents.key_norms = true;
  capture.contents.prefill_window = 4;
  capture.contents.dtype = cfg::FP32;
  capture.tool = "kvtier test";
  const auto cpu = kk::make_cpu_engine(stories_model());
  const fs::path expected_path = temp.path() / "cpu.h5";
  const kk::CaptureResult expected =
      kk::capture_trace(*cpu, stories_prompt(), capture, expected_path);

  const auto compare = [&](const fs::path& path, bool heads) {
    CHECK(kt::validate_trace(path).valid());
    const kt::TraceReader a(expected_path);
    const kt::TraceReader b(path);
    CHECK(b.read_tokens() == a.read_tokens());
    for (std::uint32_t layer = 0; layer < a.shape().layers.count; ++layer) {
      CAPTURE(layer);
      kt::DenseRows rows_a;
      kt::DenseRows rows_b;
      a.read_mean(layer, {0, 40}, rows_a);
      b.read_mean(layer, {0, 40}, rows_b);
      CHECK(max_difference(rows_a.values, rows_b.values) < 1e-5F);
      CHECK(relative_difference(a.read_key_norms(layer), b.read_key_norms(layer)) < 1e-4F);
      if (heads) {
        kt::HeadRows heads_a;
        kt::HeadRows heads_b;
        a.read_heads(layer, {0, 40}, heads_a);
        b.read_heads(layer, {0, 40}, heads_b);
        CHECK(max_difference(heads_a.values, heads_b.values) < 1e-5F);
        CHECK(max_difference(a.read_prefill_window(layer), b.read_prefill_window(layer)) < 1e-5F);
      }
    }
  };

  {
    // Per-head rows, asynchronous delivery (the defaults), one pass and two.
    const auto cuda = kk::make_cuda_engine(stories_model(), options());
    const fs::path path = temp.path() / "cuda.h5";
    const kk::CaptureResult result = kk::capture_trace(*cuda, stories_prompt(), capture, path);
    CHECK(result.generation.tokens == expected.generation.tokens);
    compare(path, true);
    // A stop token that never comes: two passes (generate, then trace), each in full.
    std::int32_t absent = 0;
    while (std::find(expected.generation.tokens.begin(), expected.generation.tokens.end(),
                     absent) != expected.generation.tokens.end()) {
      ++absent;
    }
    kk::CaptureOptions stopping = capture;
    stopping.generation.stop_tokens = {absent};
    const fs::path two_passes = temp.path() / "cuda-two-passes.h5";
    CHECK(kk::capture_trace(*cuda, stories_prompt(), stopping, two_passes).two_passes);
    compare(two_passes, true);
  }
  {
    // Head means reduced on the device: mean and top-k rows only.
    kk::CudaEngineOptions mean = options();
    mean.observer_rows = kk::ObserverRows::kHeadMean;
    const auto cuda = kk::make_cuda_engine(stories_model(), mean);
    kk::CaptureOptions mean_capture = capture;
    mean_capture.contents.heads = false;
    mean_capture.contents.prefill_window = 0;
    mean_capture.contents.top_k = 8;
    const fs::path path = temp.path() / "cuda-mean.h5";
    CHECK(kk::capture_trace(*cuda, stories_prompt(), mean_capture, path).generation.tokens ==
          expected.generation.tokens);
    compare(path, false);
  }
}

TEST_CASE("an observer's exception reaches the caller, and nothing after it",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  class Refusing final : public kk::ForwardObserver {
   public:
    explicit Refusing(int position) : position_(position) {}
    void on_attention(const kk::AttentionStep& step) override {
      if (refused_) {
        ++calls_after;
      }
      if (step.layer == 1 && step.query_position == position_) {
        refused_ = true;
        throw std::runtime_error("refused position " + std::to_string(position_));
      }
    }
    int calls_after = 0;

   private:
    int position_;
    bool refused_ = false;
  };
  const int prompt = static_cast<int>(stories_prompt().size());
  const auto cpu = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 20);

  for (const auto delivery :
       {kk::ObserverDelivery::kAsynchronous, kk::ObserverDelivery::kSynchronous}) {
    CAPTURE(static_cast<int>(delivery));
    kk::CudaEngineOptions refusing = options();
    refusing.observer_delivery = delivery;
    const auto cuda = kk::make_cuda_engine(stories_model(), refusing);
    Refusing observer(prompt + 2);
    cuda->set_observer(&observer);
    std::string message;
    int decoded = 0;
    try {
      static_cast<void>(cuda->prefill(stories_prompt()));
      for (std::size_t i = stories_prompt().size(); i < expected.size(); ++i) {
        static_cast<void>(cuda->decode(expected[i]));
        ++decoded;
      }
      cuda->set_observer(nullptr);
    } catch (const std::runtime_error& error) {
      message = error.what();
    }
    CHECK(message == "refused position " + std::to_string(prompt + 2));
    CHECK(observer.calls_after == 0);
    if (delivery == kk::ObserverDelivery::kSynchronous) {
      CHECK(decoded == 2);  // the third decode step runs position prompt + 2
    }
    // Reported once; the engine runs on.
    CHECK_NOTHROW(cuda->set_observer(nullptr));
    CHECK(greedy(*cuda, stories_prompt(), 20) == expected);
  }
}

TEST_CASE("the CUDA engine refuses bad devices and inputs as the CPU engine does",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  kk::CudaEngineOptions missing = options();
  missing.device = 999;
  CHECK_THROWS_AS(kk::make_cuda_engine(stories_model(), missing), kvtier::ConfigError);
  CHECK_THROWS_WITH(kk::make_cuda_engine(stories_model(), missing),
                    Catch::Contains("does not exist"));

  const auto cuda = kk::make_cuda_engine(stories_model(), options());
  CHECK_THROWS_AS(cuda->prefill(std::vector<std::int32_t>{1, 512}), kvtier::DataError);
  CHECK_THROWS_AS(cuda->prefill(std::vector<std::int32_t>{}), kvtier::DataError);
  CHECK_THROWS_AS(cuda->prefill(std::vector<std::int32_t>(513, 1)), kvtier::DataError);
  CHECK(cuda->position() == 0);
  cuda->reserve(100000);  // capped at max_position_embeddings
  const auto cpu = kk::make_cpu_engine(stories_model());
  CHECK(greedy(*cuda, stories_prompt(), 30) == greedy(*cpu, stories_prompt(), 30));
}

// The split-key attention path (kk::CudaAttention::kSplitKeys) against the CPU engine with the
// per-head kernel's bounds. Decode steps and prefills of at most kCudaSplitKeysMaxRows rows take
// it: stories260K's 8-token prompt, the prompt split 3 + 5, and prefills split into records by a
// small observer ring. 200 decode steps reach 208 keys, four chunks of 64, the last partial.
TEST_CASE("the split-key attention path gives the CPU engine's tokens, logits and rows",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto split = kk::CudaAttention::kSplitKeys;
  const auto cpu = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 200);
  const std::span<const std::int32_t> forced =
      std::span<const std::int32_t>(expected).subspan(stories_prompt().size());
  {
    const auto cuda =
        kk::make_cuda_engine(stories_model(), options(kk::CudaComputeDtype::kFP32, split));
    CHECK(kk::cuda_engine_options(*cuda).attention == split);
    CHECK(greedy(*cuda, stories_prompt(), 200) == expected);
    CHECK(relative_logit_difference(*cpu, *cuda, stories_prompt(), forced) < 1e-4);
    cuda->reset();
    const std::span<const std::int32_t> prompt(stories_prompt());
    static_cast<void>(cuda->prefill(prompt.first(3)));
    const auto logits = cuda->prefill(prompt.subspan(3));
    const std::vector<float> split_logits(logits.begin(), logits.end());
    cpu->reset();
    CHECK(max_difference(cpu->prefill(prompt), split_logits) < 1e-3F);

    // Observed rows past several chunks, per head and as head means.
    Recording cpu_calls;
    const std::vector<std::int32_t> tokens = observed_run(*cpu, stories_prompt(), 140, cpu_calls);
    Recording cuda_calls;
    CHECK(observed_run(*cuda, stories_prompt(), 140, cuda_calls) == tokens);
    check_observations(cpu_calls, cuda_calls, 1e-4, 1e-5, false);
    kk::CudaEngineOptions mean = options(kk::CudaComputeDtype::kFP32, split);
    mean.observer_rows = kk::ObserverRows::kHeadMean;
    mean.observer_ring_bytes = 4096;  // prefill records of a few rows
    const auto mean_engine = kk::make_cuda_engine(stories_model(), mean);
    Recording mean_calls;
    CHECK(observed_run(*mean_engine, stories_prompt(), 140, mean_calls) == tokens);
    check_observations(cpu_calls, mean_calls, 1e-4, 1e-5, true);
  }
  {
    const auto bf16 =
        kk::make_cuda_engine(stories_model(), options(kk::CudaComputeDtype::kBF16, split));
    const std::span<const std::int32_t> forced_56 = forced.first(56);
    CHECK(relative_logit_difference(*cpu, *bf16, stories_prompt(), forced_56) < 0.05);
    Recording cpu_calls;
    Recording cuda_calls;
    const std::vector<std::int32_t> tokens = observed_run(*cpu, stories_prompt(), 70, cpu_calls);
    forced_observed_run(*bf16, tokens, stories_prompt().size(), cuda_calls);
    check_observations(cpu_calls, cuda_calls, 0.05, 0.05, false);
  }
}

// Random models on the split path, in FP32 and BF16: a Llama model (GQA, Llama-3 RoPE scaling)
// run to 120 positions (two chunks), and a Mistral model whose 80-token sliding window starts
// rows mid-chunk and moves the chunk boundaries with every step.
TEST_CASE("the split-key attention path on random models, with and without a sliding window",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto split = kk::CudaAttention::kSplitKeys;
  const kk::testing::TempDir temp("cuda-split-keys");
  const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 26, 5, 35, 8};
  for (const auto& [architecture, window] :
       {std::pair{cfg::LLAMA, 0}, std::pair{cfg::MISTRAL, 80}}) {
    CAPTURE(cfg::Architecture_Name(architecture), window);
    const auto weights =
        random_model(architecture, temp.path() / cfg::Architecture_Name(architecture), window);
    const auto cpu = kk::make_cpu_engine(weights);
    const std::vector<std::int32_t> expected = greedy(*cpu, prompt, 112);
    const std::span<const std::int32_t> forced =
        std::span<const std::int32_t>(expected).subspan(prompt.size());

    const auto cuda = kk::make_cuda_engine(weights, options(kk::CudaComputeDtype::kFP32, split));
    CHECK(greedy(*cuda, prompt, 112) == expected);
    CHECK(relative_logit_difference(*cpu, *cuda, prompt, forced) < 1e-4);
    Recording cpu_calls;
    const std::vector<std::int32_t> tokens = observed_run(*cpu, prompt, 112, cpu_calls);
    Recording cuda_calls;
    CHECK(observed_run(*cuda, prompt, 112, cuda_calls) == tokens);
    check_observations(cpu_calls, cuda_calls, 1e-4, 1e-5, false);

    const auto bf16 = kk::make_cuda_engine(weights, options(kk::CudaComputeDtype::kBF16, split));
    CHECK(relative_logit_difference(*cpu, *bf16, prompt, forced) < 0.05);
  }
}

// The warp-per-row GEMM in place of cuBLAS for calls of at most kCudaWarpRowsMaxRows rows (decode):
// the same tokens and logits as the CPU engine up to rounding, on stories260K (whose 172-wide
// MLP input keeps cuBLAS for the down projection in 16-bit dtypes) and on random models.
TEST_CASE("the warp-rows GEMM gives the CPU engine's tokens and logits", "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto with_gemm = [](kk::CudaComputeDtype dtype) {
    kk::CudaEngineOptions result = options(dtype, kk::CudaEngineOptions{}.attention);
    result.gemm = kk::CudaGemm::kWarpRows;
    return result;
  };
  const auto cpu = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 200);
  const std::span<const std::int32_t> forced =
      std::span<const std::int32_t>(expected).subspan(stories_prompt().size());
  const auto fp32 = kk::make_cuda_engine(stories_model(), with_gemm(kk::CudaComputeDtype::kFP32));
  CHECK(kk::cuda_engine_options(*fp32).gemm == kk::CudaGemm::kWarpRows);
  CHECK(greedy(*fp32, stories_prompt(), 200) == expected);
  CHECK(relative_logit_difference(*cpu, *fp32, stories_prompt(), forced) < 1e-4);
  const auto bf16 = kk::make_cuda_engine(stories_model(), with_gemm(kk::CudaComputeDtype::kBF16));
  CHECK(relative_logit_difference(*cpu, *bf16, stories_prompt(), forced.first(56)) < 0.05);
  const auto fp16 = kk::make_cuda_engine(stories_model(), with_gemm(kk::CudaComputeDtype::kFP16));
  CHECK(relative_logit_difference(*cpu, *fp16, stories_prompt(), forced.first(56)) < 0.01);

  const kk::testing::TempDir temp("cuda-warp-rows");
  const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 26};
  for (const auto architecture : {cfg::LLAMA, cfg::QWEN2, cfg::QWEN3, cfg::MISTRAL}) {
    CAPTURE(cfg::Architecture_Name(architecture));
    const auto weights =
        random_model(architecture, temp.path() / cfg::Architecture_Name(architecture));
    const auto reference = kk::make_cpu_engine(weights);
    const std::vector<std::int32_t> tokens = greedy(*reference, prompt, 60);
    const std::span<const std::int32_t> decoded =
        std::span<const std::int32_t>(tokens).subspan(prompt.size());
    const auto cuda = kk::make_cuda_engine(weights, with_gemm(kk::CudaComputeDtype::kFP32));
    CHECK(greedy(*cuda, prompt, 60) == tokens);
    CHECK(relative_logit_difference(*reference, *cuda, prompt, decoded) < 1e-4);
    const auto half = kk::make_cuda_engine(weights, with_gemm(kk::CudaComputeDtype::kBF16));
    CHECK(relative_logit_difference(*reference, *half, prompt, decoded) < 0.05);
  }
}

// Decode steps replayed from a CUDA graph (CudaGraphs::kDecode): the tokens and logits of the
// engine launching every kernel, with either attention kernel and GEMM; captured once per size
// of the growing KV cache and again when a longer prefill moves the scratch buffers, not after
// a reset (replays at earlier positions); from a one-token prompt; with a sliding window; and
// with an observer attached (those steps launch as without graphs, observed in full).
TEST_CASE("decode graphs give the launched engine's tokens, logits and observations",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  const auto with_graphs = [](kk::CudaComputeDtype dtype, kk::CudaAttention attention) {
    kk::CudaEngineOptions result = options(dtype, attention);
    result.graphs = kk::CudaGraphs::kDecode;
    return result;
  };
  const auto cpu = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> expected = greedy(*cpu, stories_prompt(), 200);
  const std::span<const std::int32_t> forced =
      std::span<const std::int32_t>(expected).subspan(stories_prompt().size());
  for (const auto attention : {kk::CudaAttention::kSplitKeys, kk::CudaAttention::kPerHead}) {
    CAPTURE(kk::cuda_attention_name(attention));
    const auto launched =
        kk::make_cuda_engine(stories_model(), options(kk::CudaComputeDtype::kFP32, attention));
    const auto graphed =
        kk::make_cuda_engine(stories_model(), with_graphs(kk::CudaComputeDtype::kFP32, attention));
    CHECK(kk::cuda_engine_options(*graphed).graphs == kk::CudaGraphs::kDecode);
    CHECK(kk::cuda_engine_graph_counts(*launched).replays == 0);
    // Nothing reserved: the 8-position cache of the prompt grows to 16, 32, 64, 128 and 256 as
    // the 200 steps decode, and each size is captured once.
    CHECK(relative_logit_difference(*launched, *graphed, stories_prompt(), forced) < 1e-5);
    kk::CudaGraphCounts counts = kk::cuda_engine_graph_counts(*graphed);
    CHECK(counts.captures == 5);
    CHECK(counts.replays == forced.size());
    // After a reset the same graph replays from the start.
    CHECK(relative_logit_difference(*cpu, *graphed, stories_prompt(), forced) < 1e-4);
    CHECK(greedy(*graphed, stories_prompt(), 200) == expected);
    CHECK(kk::cuda_engine_graph_counts(*graphed).captures == counts.captures);
    CHECK(kk::cuda_engine_graph_counts(*graphed).replays > counts.replays + forced.size());

    // A 40-token prefill reallocates the per-row buffers: the next step captures again.
    const std::span<const std::int32_t> long_prompt =
        std::span<const std::int32_t>(expected).first(40);
    const std::span<const std::int32_t> after = std::span<const std::int32_t>(expected).subspan(40);
    counts = kk::cuda_engine_graph_counts(*graphed);
    CHECK(relative_logit_difference(*launched, *graphed, long_prompt, after) < 1e-5);
    CHECK(kk::cuda_engine_graph_counts(*graphed).captures == counts.captures + 1);

    Recording cpu_calls;
    const std::vector<std::int32_t> tokens = observed_run(*cpu, stories_prompt(), 60, cpu_calls);
    Recording cuda_calls;
    counts = kk::cuda_engine_graph_counts(*graphed);
    CHECK(observed_run(*graphed, stories_prompt(), 60, cuda_calls) == tokens);
    CHECK(kk::cuda_engine_graph_counts(*graphed).replays == counts.replays);
    check_observations(cpu_calls, cuda_calls, 1e-4, 1e-5, false);
    // Replays resume once the observer is gone.
    CHECK(greedy(*graphed, stories_prompt(), 200) == expected);
    CHECK(kk::cuda_engine_graph_counts(*graphed).replays > counts.replays);

    // The first capture right after a one-token prefill, on a fresh engine.
    const std::vector<std::int32_t> bos = {1};
    const auto fresh =
        kk::make_cuda_engine(stories_model(), with_graphs(kk::CudaComputeDtype::kFP32, attention));
    CHECK(greedy(*fresh, bos, 60) == greedy(*cpu, bos, 60));
    CHECK(kk::cuda_engine_graph_counts(*fresh).captures == 1);

    const auto bf16 =
        kk::make_cuda_engine(stories_model(), with_graphs(kk::CudaComputeDtype::kBF16, attention));
    CHECK(relative_logit_difference(*cpu, *bf16, stories_prompt(), forced.first(56)) < 0.05);
  }
  {
    kk::CudaEngineOptions warp_rows =
        with_graphs(kk::CudaComputeDtype::kFP32, kk::CudaAttention::kSplitKeys);
    warp_rows.gemm = kk::CudaGemm::kWarpRows;
    const auto graphed = kk::make_cuda_engine(stories_model(), warp_rows);
    CHECK(greedy(*graphed, stories_prompt(), 200) == expected);
    CHECK(relative_logit_difference(*cpu, *graphed, stories_prompt(), forced) < 1e-4);
    CHECK(kk::cuda_engine_graph_counts(*graphed).replays > 0);
  }

  // An 80-token sliding window, the cache growing past it, with both attention kernels.
  const kk::testing::TempDir temp("cuda-graphs");
  const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 26, 5, 35, 8};
  const auto weights = random_model(cfg::MISTRAL, temp.path() / "mistral", 80);
  const auto reference = kk::make_cpu_engine(weights);
  const std::vector<std::int32_t> tokens = greedy(*reference, prompt, 112);
  const std::span<const std::int32_t> decoded =
      std::span<const std::int32_t>(tokens).subspan(prompt.size());
  for (const auto attention : {kk::CudaAttention::kSplitKeys, kk::CudaAttention::kPerHead}) {
    CAPTURE(kk::cuda_attention_name(attention));
    const auto graphed =
        kk::make_cuda_engine(weights, with_graphs(kk::CudaComputeDtype::kFP32, attention));
    CHECK(relative_logit_difference(*reference, *graphed, prompt, decoded) < 1e-4);
    CHECK(kk::cuda_engine_graph_counts(*graphed).captures == 4);  // 16, 32, 64 and 128
    CHECK(greedy(*graphed, prompt, 112) == tokens);
  }
}

// CudaFusion::kOn and CudaEarlyLaunch::kProgrammatic change which kernels run and when, not what
// they compute: logits bit for bit those of the engine without them (launched, and from decode
// graphs against decode graphs, whose cuBLAS workspace differs), in FP32 and BF16, on stories260K
// and random Qwen2 and Mistral (a sliding window) models; observations too (an observed pass
// keeps the fusion and launches plainly). Prompts of 1, 2 and 8 tokens: the fused SwiGLU at both
// of the warp-rows GEMM's row counts, the fused combine over prefills of up to 8 rows; on
// stories260K also a second prefill whose rows straddle a chunk boundary and decode steps past
// five chunks. Early launches need compute capability 9.0 and are refused below it.
TEST_CASE("fused kernels and early launches give the plain engine's results bit for bit",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  const auto variant = [](kk::CudaComputeDtype dtype, kk::CudaFusion fusion,
                          kk::CudaEarlyLaunch early, kk::CudaGraphs graphs) {
    kk::CudaEngineOptions result = options(dtype, kk::CudaAttention::kSplitKeys);
    result.gemm = kk::CudaGemm::kWarpRows;
    result.fusion = fusion;
    result.early_launch = early;
    result.graphs = graphs;
    return result;
  };
  if (major < 9) {
    CHECK_THROWS_AS(
        kk::make_cuda_engine(stories_model(),
                             variant(kk::CudaComputeDtype::kFP32, kk::CudaFusion::kOff,
                                     kk::CudaEarlyLaunch::kProgrammatic, kk::CudaGraphs::kOff)),
        kvtier::ConfigError);
  }
  // Logits equal to the last bit over `tokens`: prefills of tokens [0, 60) and [60, 68), whose
  // rows have 61 to 68 keys (one or two chunks of the split path, different per row), then
  // decode steps to the end.
  const auto same_logits = [](kk::Engine& a, kk::Engine& b, std::span<const std::int32_t> tokens) {
    a.reset();
    b.reset();
    bool same = true;
    const auto compare = [&](std::span<const float> first, std::span<const float> second) {
      same = same && std::equal(first.begin(), first.end(), second.begin(), second.end());
    };
    const auto copy = [](std::span<const float> logits) {
      return std::vector<float>(logits.begin(), logits.end());
    };
    compare(copy(a.prefill(tokens.first(60))), b.prefill(tokens.first(60)));
    compare(copy(a.prefill(tokens.subspan(60, 8))), b.prefill(tokens.subspan(60, 8)));
    for (std::size_t i = 68; i < tokens.size(); ++i) {
      compare(copy(a.decode(tokens[i])), b.decode(tokens[i]));
    }
    return same;
  };
  const kk::testing::TempDir temp("cuda-fusion");
  const auto qwen2 = random_model(cfg::QWEN2, temp.path() / "qwen2");
  const auto mistral = random_model(cfg::MISTRAL, temp.path() / "mistral", 80);
  // Within every model's 64-token vocabulary; 4 prompt tokens and 116 decoded: 120 positions.
  const std::vector<std::int32_t> prompt = {1, 14, 15, 9};
  const std::vector<std::pair<kk::CudaFusion, kk::CudaEarlyLaunch>> changes = {
      {kk::CudaFusion::kOn, kk::CudaEarlyLaunch::kOff},
      {kk::CudaFusion::kOff, kk::CudaEarlyLaunch::kProgrammatic},
      {kk::CudaFusion::kOn, kk::CudaEarlyLaunch::kProgrammatic}};
  for (const auto& [label, weights] : {std::pair{"stories260K", stories_model()},
                                       std::pair{"qwen2", qwen2}, std::pair{"mistral", mistral}}) {
    for (const auto dtype : {kk::CudaComputeDtype::kFP32, kk::CudaComputeDtype::kBF16}) {
      for (const auto graphs : {kk::CudaGraphs::kOff, kk::CudaGraphs::kDecode}) {
        const auto plain = kk::make_cuda_engine(
            weights, variant(dtype, kk::CudaFusion::kOff, kk::CudaEarlyLaunch::kOff, graphs));
        const std::vector<std::int32_t> decoded = greedy(*plain, prompt, 116);
        const std::span<const std::int32_t> all(decoded);
        Recording expected;
        forced_observed_run(*plain, decoded, 8, expected);
        // stories260K also past five 64-key chunks (334 positions).
        const std::vector<std::int32_t> long_run = std::string_view(label) == "stories260K"
                                                       ? greedy(*plain, prompt, 330)
                                                       : std::vector<std::int32_t>{};
        for (const auto& [fusion, early] : changes) {
          if (early == kk::CudaEarlyLaunch::kProgrammatic && major < 9) {
            continue;
          }
          CAPTURE(label, kk::cuda_compute_dtype_name(dtype), kk::cuda_graphs_name(graphs),
                  kk::cuda_fusion_name(fusion), kk::cuda_early_launch_name(early));
          const auto engine = kk::make_cuda_engine(weights, variant(dtype, fusion, early, graphs));
          for (const std::size_t rows : {std::size_t{1}, std::size_t{2}, std::size_t{8}}) {
            CAPTURE(rows);
            CHECK(relative_logit_difference(*plain, *engine, all.first(rows), all.subspan(rows)) ==
                  0.0);
          }
          CHECK(greedy(*engine, prompt, 116) == decoded);
          if (graphs == kk::CudaGraphs::kDecode) {
            CHECK(kk::cuda_engine_graph_counts(*engine).replays > 0);
          }
          Recording got;
          forced_observed_run(*engine, decoded, 8, got);
          check_observations(expected, got, 0.0, 0.0, false);
          if (std::string_view(label) == "stories260K") {
            CHECK(same_logits(*plain, *engine, long_run));
          }
        }
      }
    }
  }
}
