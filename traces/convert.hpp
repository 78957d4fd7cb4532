#pragma once
// Trace conversions (`kvtier trace convert`): per-head rows to mean rows, dense rows to top-k
// rows, slicing steps and layers, and recompression. The input is streamed block by block, so
// a conversion needs memory for one block of one layer, never the whole trace.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "traces/format.hpp"
#include "traces/writer.hpp"

namespace kvtier::traces {

struct ConvertOptions {
  // Write mean rows averaged over the per-head rows, and drop the per-head rows.
  bool heads_to_mean = false;
  // Write top-k rows with this many entries, computed from the dense mean rows (or the mean
  // of the per-head rows); 0 keeps the input's top-k rows, if any, as they are.
  std::uint32_t top_k = 0;
  // With top_k: drop the dense rows (mean and heads), keeping only the top-k rows.
  bool drop_dense = false;
  // Keep only these steps: step a becomes step 0, and the prompt grows by a (row t of the
  // output is row a + t of the input, which attends to prompt + a + t + 1 positions). The
  // prefill window is kept only when a is 0.
  std::optional<StepRange> steps;
  // Keep only these model layers.
  std::optional<LayerRange> layers;
  // Chunking and compression of the output.
  WriterOptions writer;
  std::uint64_t block_elements = 1U << 22;
  std::string tool = "kvtier trace convert";
};

// Returns a description of what was done ("heads -> mean; steps 100..199").
std::string convert_trace(const std::filesystem::path& input, const std::filesystem::path& output,
                          const ConvertOptions& options);

}  // namespace kvtier::traces
