// What attaching the attention tracer costs on the CPU engine (bench/RESULTS.md, "Attention
// tracer overhead"): greedy decoding from BOS with and without a trace being written, the two
// runs interleaved, each doing the same forward passes (one prefill, then STEPS decode steps)
// over the same tokens.
//
//   kvtier_bench_trace_overhead MODEL STEPS REPEATS [GRANULARITY] [OUT_DIR] [THREADS]
//
// MODEL is a checkpoint (llama2.c file or Hugging Face directory) or `random`: a Llama-shaped
// model of seeded random weights built in memory (hidden 512, 8 layers, 8 heads, 4 KV heads,
// intermediate 1408, vocabulary 4096; 25 M parameters), big enough that the model's own work
// per token resembles a real small model's rather than stories260K's 0.26 M parameters.
// GRANULARITY: mean (default), heads, topk:K or all (mean, heads, top-32, key norms). The trace
// goes to OUT_DIR (default /tmp) and is removed; THREADS compress its chunks (default: one per
// core, the writer's default; 0 compresses on the decoding thread). Prints one JSON line: every
// repeat's wall seconds, the medians and the overhead = traced / plain − 1 of the medians, and
// the same for processor time (all threads, so the compression threads' work counts too).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "bench/median.hpp"
#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/tracer.hpp"

namespace {

namespace kk = kvtier::kernels;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using kvtier::bench::median;

// Seeded normal weights of standard deviation 0.02 (norm gains 1), as an initialised model.
kk::ModelWeights random_model() {
  kk::ModelWeights model;
  kvtier::config::ModelSpec& spec = model.spec;
  spec.set_name("random-llama-25M");
  spec.set_architecture(kvtier::config::LLAMA);
  spec.set_num_hidden_layers(8);
  spec.set_hidden_size(512);
  spec.set_num_attention_heads(8);
  spec.set_num_key_value_heads(4);
  spec.set_head_dim(64);
  spec.set_intermediate_size(1408);
  spec.set_vocab_size(4096);
  spec.set_tie_word_embeddings(true);
  spec.set_attention_bias(false);
  spec.set_qk_norm(false);
  spec.set_max_position_embeddings(4096);
  spec.set_rope_theta(10000.0);
  spec.set_rms_norm_eps(1e-5);
  spec.set_weight_dtype(kvtier::config::FP32);
  spec.set_activation_dtype(kvtier::config::FP32);
  spec.set_kv_dtype(kvtier::config::FP32);
  model.source = "random";
  std::mt19937_64 random(42);
  std::normal_distribution<float> normal(0.0F, 0.02F);
  const auto make = [&](const std::string& name, std::int64_t rows, std::int64_t cols, bool ones) {
    std::vector<float> values(static_cast<std::size_t>(rows * cols), 1.0F);
    if (!ones) {
      for (float& value : values) {
        value = normal(random);
      }
    }
    return kk::WeightTensor{name, model.storage.adopt(std::move(values)), rows, cols};
  };
  const std::int64_t hidden = 512;
  const std::int64_t kv = 256;  // 4 KV heads of 64
  const std::int64_t intermediate = 1408;
  model.token_embedding = make("embedding", 4096, hidden, false);
  model.lm_head = model.token_embedding;
  model.final_norm = make("norm", hidden, 1, true);
  for (int layer = 0; layer < 8; ++layer) {
    kk::LayerWeights weights;
    weights.attention_norm = make("attention_norm", hidden, 1, true);
    weights.wq = make("wq", hidden, hidden, false);
    weights.wk = make("wk", kv, hidden, false);
    weights.wv = make("wv", kv, hidden, false);
    weights.wo = make("wo", hidden, hidden, false);
    weights.mlp_norm = make("mlp_norm", hidden, 1, true);
    weights.w_gate = make("w_gate", intermediate, hidden, false);
    weights.w_up = make("w_up", intermediate, hidden, false);
    weights.w_down = make("w_down", hidden, intermediate, false);
    model.layers.push_back(std::move(weights));
  }
  return model;
}

kk::TraceContents contents_of(const std::string& granularity) {
  kk::TraceContents contents;
  if (granularity == "heads") {
    contents.heads = true;
  } else if (granularity.rfind("topk:", 0) == 0) {
    contents.mean = false;
    contents.top_k = static_cast<std::uint32_t>(std::stoul(granularity.substr(5)));
  } else if (granularity == "all") {
    contents.heads = true;
    contents.top_k = 32;
    contents.key_norms = true;
  } else if (granularity != "mean") {
    throw kvtier::ConfigError("unknown granularity '" + granularity + "'");
  }
  return contents;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: kvtier_bench_trace_overhead MODEL|random STEPS REPEATS [GRANULARITY] "
                 "[OUT_DIR] [THREADS]\n";
    return 2;
  }
  const std::string model_name = argv[1];
  const int steps = std::atoi(argv[2]);
  const int repeats = std::atoi(argv[3]);
  const std::string granularity = argc > 4 ? argv[4] : "mean";
  const std::filesystem::path out_dir = argc > 5 ? argv[5] : "/tmp";
  try {
    const auto weights = std::make_shared<const kk::ModelWeights>(
        model_name == "random" ? random_model() : kk::load_model(model_name));
    const auto engine = kk::make_cpu_engine(weights);
    const std::int32_t bos = 1;
    // Plain: generate() samples steps + 1 tokens and runs all but the last, so it makes the
    // same forward passes as a capture of `steps` decode steps.
    kk::GenerationOptions plain;
    plain.max_new_tokens = steps + 1;
    kk::CaptureOptions traced;
    traced.generation.max_new_tokens = steps;
    traced.contents = contents_of(granularity);
    traced.tool = "kvtier_bench_trace_overhead";
    if (argc > 6) {
      traced.writer.compression_threads = static_cast<unsigned>(std::atoi(argv[6]));
    }
    const std::filesystem::path file = out_dir / "kvtier_bench_trace_overhead.h5";
    std::vector<double> plain_seconds;
    std::vector<double> traced_seconds;
    // Processor time of all threads (the writer's compression threads included).
    std::vector<double> plain_cpu;
    std::vector<double> traced_cpu;
    std::uintmax_t file_bytes = 0;
    for (int i = 0; i < repeats; ++i) {
      auto start = Clock::now();
      std::clock_t cpu = std::clock();
      const kk::GenerationResult result = kk::generate(*engine, {&bos, 1}, plain);
      plain_seconds.push_back(seconds_since(start));
      plain_cpu.push_back(static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC);
      start = Clock::now();
      cpu = std::clock();
      const kk::CaptureResult capture = kk::capture_trace(*engine, {&bos, 1}, traced, file);
      traced_seconds.push_back(seconds_since(start));
      traced_cpu.push_back(static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC);
      file_bytes = std::filesystem::file_size(file);
      std::filesystem::remove(file);
      // The same tokens ran in both: plain's last token was sampled but not run.
      if (!std::equal(capture.generation.tokens.begin(), capture.generation.tokens.end(),
                      result.tokens.begin())) {
        std::cerr << "the traced run decoded other tokens than the plain one\n";
        return 1;
      }
    }
    const double plain_median = median(plain_seconds);
    const double traced_median = median(traced_seconds);
    std::cout << "{\"model\":\"" << weights->spec.name() << "\",\"steps\":" << steps
              << ",\"granularity\":\"" << granularity
              << "\",\"compression_threads\":" << traced.writer.compression_threads
              << ",\"trace_bytes\":" << file_bytes << ",\"plain_s\":[";
    for (std::size_t i = 0; i < plain_seconds.size(); ++i) {
      std::cout << (i == 0 ? "" : ",") << plain_seconds[i];
    }
    std::cout << "],\"traced_s\":[";
    for (std::size_t i = 0; i < traced_seconds.size(); ++i) {
      std::cout << (i == 0 ? "" : ",") << traced_seconds[i];
    }
    std::cout << "],\"plain_median_s\":" << plain_median << ",\"traced_median_s\":" << traced_median
              << ",\"overhead\":" << traced_median / plain_median - 1.0
              << ",\"plain_cpu_median_s\":" << median(plain_cpu)
              << ",\"traced_cpu_median_s\":" << median(traced_cpu)
              << ",\"cpu_overhead\":" << median(traced_cpu) / median(plain_cpu) - 1.0 << "}\n";
  } catch (const kvtier::Error& error) {
    for (const std::string& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
