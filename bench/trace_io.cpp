// Attention-trace I/O throughput (bench/RESULTS.md, "Attention trace I/O").
//
//   kvtier_bench_trace_io write FILE MODEL PROMPT STEPS LAYERS [DEFLATE [noisy|synthetic]]
//   kvtier_bench_trace_io read FILE [BLOCK_ELEMENTS]
//
// `write` streams mean rows of a MODEL-shaped trace (LAYERS of its layers) through
// TraceWriter and reports MB/s of attention data (FP16 bytes stored, before compression);
// rows are cut from pre-generated data, so the time is the writer's alone: `noisy` (default)
// weights spread log-uniformly over four decades, which compress like measured attention
// (full-entropy mantissas), or `synthetic` rows of the reasoning generator (smooth, the tail of
// a full-length row per layer), which compress far better. `read` streams every mean row of every
// layer in blocks of BLOCK_ELEMENTS weights and reports MB/s of decompressed attention data. Both
// print one JSON line.

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "sim/random.hpp"
#include "traces/reader.hpp"
#include "traces/synth.hpp"
#include "traces/writer.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace traces = kvtier::traces;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Weights spread over four orders of magnitude (log-uniform), like softmax outputs: rows cut
// from this pool are not normalised, which the writer does not check.
std::vector<float> noisy_pool(std::size_t size) {
  kvtier::sim::RandomStream random(1234, 0);
  std::vector<float> pool(size);
  for (auto& w : pool) {
    w = static_cast<float>(std::pow(10.0, -6.0 + 4.0 * random.uniform_01()));
  }
  return pool;
}

int write(const std::string& file, const std::string& model_name, std::uint32_t prompt,
          std::uint32_t steps, std::uint32_t layers, int deflate, bool synthetic) {
  const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
  const kvtier::config::ConfigLoader loader(presets);
  const kvtier::config::PresetFile* preset = presets.find("model", model_name);
  if (preset == nullptr) {
    throw kvtier::ConfigError(presets.unknown_message("model", model_name));
  }
  kvtier::config::TraceMeta meta;
  (void)loader.load_preset(*preset, *meta.mutable_model(), {});
  meta.set_prompt_tokens(prompt);
  meta.set_steps(steps);
  meta.set_first_layer(0);
  meta.set_num_layers(layers);
  meta.add_granularities(kvtier::config::GRANULARITY_MEAN);
  meta.set_attention_dtype(kvtier::config::FP16);
  meta.mutable_source()->set_kind(kvtier::config::SOURCE_SYNTHETIC);
  meta.mutable_source()->set_tool("kvtier_bench_trace_io");
  traces::WriterOptions options;
  options.deflate_level = deflate;
  // Rows start at random places in a 64 MiB pool: no row repeats another inside deflate's
  // 32 KiB window, as with measured attention.
  const std::uint64_t longest = static_cast<std::uint64_t>(prompt) + steps;
  const std::uint64_t spread = std::uint64_t{1} << 24;
  const std::vector<float> pool = synthetic ? std::vector<float>() : noisy_pool(longest + spread);
  kvtier::sim::RandomStream offsets(99, 0);
  // Synthetic: one full-length reasoning row per layer; a row of length n is its last n weights.
  std::vector<std::vector<float>> full_rows;
  if (synthetic) {
    const traces::TraceShape shape = traces::shape_from_meta(meta, file);
    const traces::SyntheticAttentionModel model(traces::synthetic_preset("reasoning", 1), shape,
                                                meta.model().num_hidden_layers());
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      full_rows.emplace_back(shape.row_length(steps - 1));
      model.mean_row(layer, steps - 1, full_rows.back());
    }
  }
  const auto start = Clock::now();
  traces::TraceWriter writer(file, meta, options);
  writer.write_tokens(std::vector<std::int32_t>(writer.shape().tokens(), 1));
  for (std::uint32_t step = 0; step < steps; ++step) {
    const std::uint64_t length = writer.shape().row_length(step);
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      if (synthetic) {
        const std::vector<float>& full = full_rows[layer];
        writer.append_mean_row(layer,
                               std::span<const float>(full).subspan(full.size() - length, length));
        continue;
      }
      const std::uint64_t offset = offsets.uniform_below(spread);
      writer.append_mean_row(layer, std::span<const float>(pool).subspan(offset, length));
    }
  }
  writer.finish();
  const double elapsed = seconds_since(start);
  const double bytes = 2.0 * static_cast<double>(writer.shape().packed_elements()) * layers;
  std::cout << "{\"mode\": \"write\", \"data\": \"" << (synthetic ? "synthetic" : "noisy")
            << "\", \"deflate\": " << deflate
            << ", \"attention_bytes\": " << static_cast<std::uint64_t>(bytes)
            << ", \"seconds\": " << elapsed << ", \"mb_per_s\": " << bytes / elapsed / 1e6 << "}\n";
  return 0;
}

int read(const std::string& file, std::uint64_t block_elements) {
  const auto start = Clock::now();
  const traces::TraceReader reader(file);
  const traces::TraceShape& shape = reader.shape();
  double checksum = 0.0;
  std::uint64_t weights = 0;
  reader.stream_mean(shape.layers, {0, shape.steps}, block_elements,
                     [&](std::uint32_t, const traces::DenseRows& rows) {
                       checksum += rows.values.back();
                       weights += rows.values.size();
                     });
  const double elapsed = seconds_since(start);
  const double bytes = 2.0 * static_cast<double>(weights);
  std::cout << "{\"mode\": \"read\", \"attention_bytes\": " << static_cast<std::uint64_t>(bytes)
            << ", \"seconds\": " << elapsed << ", \"mb_per_s\": " << bytes / elapsed / 1e6
            << ", \"checksum\": " << checksum << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() >= 6 && args[0] == "write") {
      return write(args[1], args[2], static_cast<std::uint32_t>(std::stoul(args[3])),
                   static_cast<std::uint32_t>(std::stoul(args[4])),
                   static_cast<std::uint32_t>(std::stoul(args[5])),
                   args.size() > 6 ? std::stoi(args[6]) : 1,
                   args.size() > 7 && args[7] == "synthetic");
    }
    if (args.size() >= 2 && args[0] == "read") {
      return read(args[1], args.size() > 2 ? std::stoull(args[2]) : (1U << 22));
    }
    std::cerr << "usage: kvtier_bench_trace_io write FILE MODEL PROMPT STEPS LAYERS [DEFLATE "
                 "[noisy|synthetic]]\n"
                 "       kvtier_bench_trace_io read FILE [BLOCK_ELEMENTS]\n";
    return 2;
  } catch (const kvtier::Error& error) {
    for (const auto& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
}
