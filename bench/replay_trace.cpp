// Replay from an HDF5 trace file against replay from the same rows in memory, and the demand
// cache's miss and hit. Writes a synthetic reasoning trace (FP16 head-mean rows, default 4,096
// decode steps of Qwen2.5-7B's 28 layers after a 512-token prompt, the shape of
// bench/replay_throughput.cpp) to a temporary folder, then times, in this order:
//   stream  every layer's rows through TraceReader::stream_mean (the reader alone);
//   read    every step's rows through TraceAttention, no policy (the source alone);
//   file    replay(TraceAttention, policy);
//   memory  replay(InMemoryAttention of the same rows, policy);
//   miss    cached_replay into an empty cache folder (hash + replay + demand file);
//   hit     cached_replay again (hash remembered; the demand file read and checked).
// Prints one JSON line; the folder is removed at the end.
//
//   kvtier_bench_replay_trace POLICY [steps] [model] [prompt] [block_elements]

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "replay/demand_cache.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"
#include "replay/trace_source.hpp"
#include "traces/reader.hpp"
#include "traces/synth.hpp"

namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Removes the scratch folder however the benchmark ends.
struct Scratch {
  Scratch() {
    std::string pattern = (fs::temp_directory_path() / "kvtier-bench-replay-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot create a temporary folder");
    }
    path = pattern;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kvtier_bench_replay_trace POLICY [steps] [model] [prompt] "
                 "[block_elements]\n";
    return 2;
  }
  const auto steps =
      static_cast<std::uint32_t>(argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4096);
  const std::string model = argc > 3 ? argv[3] : "Qwen2.5-7B";
  const auto prompt =
      static_cast<std::uint32_t>(argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 512);
  kvtier::replay::TraceAttentionOptions blocks;
  if (argc > 5) {
    blocks.block_elements = std::strtoull(argv[5], nullptr, 10);
  }
  try {
    namespace replay = kvtier::replay;
    const Scratch scratch;
    const fs::path trace = scratch.path / "trace.h5";
    const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
    const kvtier::config::ConfigLoader loader(presets);
    kvtier::traces::SynthOptions options;
    (void)loader.load_text("preset: \"" + model + "\"", "bench", options.model, {});
    options.prompt_tokens = prompt;
    options.steps = steps;
    options.params = kvtier::traces::synthetic_preset("reasoning", 1);
    auto start = std::chrono::steady_clock::now();
    kvtier::traces::write_synthetic_trace(trace, options);
    const double write_s = seconds_since(start);

    // A fresh source for each pass, so that no pass finds the previous one's block in memory.
    const std::uint32_t layers = replay::TraceAttention(trace).layers();
    const double entries =
        static_cast<double>(layers) *
        (static_cast<double>(steps) * prompt + static_cast<double>(steps) * (steps + 1.0) / 2.0);
    const auto registry = replay::builtin_policies();
    const auto spec = replay::parse_policy_string(argv[1]);
    std::string canonical;
    const replay::ReplayShape shape{layers, prompt, steps};

    // The reader alone, streaming every layer's rows in blocks of 4M weights.
    start = std::chrono::steady_clock::now();
    {
      const kvtier::traces::TraceReader reader(trace);
      double sum = 0.0;
      reader.stream_mean({0, layers}, {0, steps}, std::uint64_t{1} << 22,
                         [&sum](std::uint32_t, const kvtier::traces::DenseRows& block) {
                           sum += block.values.back();
                         });
      if (!(sum > 0.0)) {
        throw std::runtime_error("no rows streamed");
      }
    }
    const double stream_s = seconds_since(start);

    std::vector<std::vector<float>> step_rows;
    start = std::chrono::steady_clock::now();
    {
      replay::TraceAttention source(trace, blocks);
      for (std::uint32_t step = 0; step < steps; ++step) {
        source.read_step(step, step_rows);
      }
    }
    const double read_s = seconds_since(start);

    auto policy = registry.create(spec, shape, &canonical);
    start = std::chrono::steady_clock::now();
    replay::TraceAttention file_source(trace, blocks);
    const replay::ReplayDemand from_file = replay::replay(file_source, *policy);
    const double file_s = seconds_since(start);

    std::vector<std::vector<std::vector<float>>> rows(steps);
    replay::TraceAttention copy_source(trace);
    for (std::uint32_t step = 0; step < steps; ++step) {
      copy_source.read_step(step, rows[step]);
    }
    replay::InMemoryAttention memory(layers, prompt, std::move(rows));
    policy = registry.create(spec, shape);
    start = std::chrono::steady_clock::now();
    const replay::ReplayDemand from_memory = replay::replay(memory, *policy);
    const double memory_s = seconds_since(start);

    start = std::chrono::steady_clock::now();
    const replay::CachedReplay miss = replay::cached_replay(trace, spec, scratch.path / "cache");
    const double miss_s = seconds_since(start);
    start = std::chrono::steady_clock::now();
    const replay::CachedReplay hit = replay::cached_replay(trace, spec, scratch.path / "cache");
    const double hit_s = seconds_since(start);

    const bool same = from_file.summary().mean_kept_mass == from_memory.summary().mean_kept_mass &&
                      hit.hit() &&
                      hit.demand.summary().mean_kept_mass == miss.demand.summary().mean_kept_mass;
    std::cout << "{\"policy\": \"" << canonical << "\", \"model\": \"" << model
              << "\", \"steps\": " << steps << ", \"layers\": " << layers
              << ", \"prompt\": " << prompt << ", \"block_elements\": " << blocks.block_elements
              << ", \"entries\": " << entries << ", \"trace_bytes\": " << fs::file_size(trace)
              << ", \"write_s\": " << write_s << ", \"stream_s\": " << stream_s
              << ", \"read_s\": " << read_s << ", \"file_s\": " << file_s
              << ", \"memory_s\": " << memory_s << ", \"miss_s\": " << miss_s
              << ", \"hit_s\": " << hit_s << ", \"stream_entries_per_s\": " << entries / stream_s
              << ", \"read_entries_per_s\": " << entries / read_s
              << ", \"file_entries_per_s\": " << entries / file_s
              << ", \"memory_entries_per_s\": " << entries / memory_s
              << ", \"demand_bytes\": " << fs::file_size(hit.file)
              << ", \"same_demand\": " << (same ? "true" : "false") << "}\n";
  } catch (const kvtier::Error& error) {
    std::cerr << error.lines().front() << "\n";
    return static_cast<int>(error.exit_code());
  } catch (const std::exception& error) {
    std::cerr << "kvtier_bench_replay_trace: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
