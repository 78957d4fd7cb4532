#pragma once
// Streaming writer of attention traces (format v1, docs/TRACE_FORMAT.md).
//
// Every dataset's size follows from the TraceMeta, so all are created when the writer opens;
// rows are then appended step by step, per layer, and only one chunk per dataset is held in
// memory. The file is written under a temporary name in the target folder and renamed by
// finish(); a writer destroyed without finish() removes it, so an interrupted run never leaves
// a trace that looks whole.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"

namespace kvtier::traces {

// One per core (std::thread::hardware_concurrency), at least 1.
[[nodiscard]] unsigned default_compression_threads();

struct WriterOptions {
  // zlib level 1..9 for shuffle + deflate; 0 stores chunks uncompressed (no filters).
  int deflate_level = 1;
  // Elements per chunk of the attention datasets (128 KiB of FP16 by default): large enough
  // for deflate to work well, small enough that reading one step decompresses little.
  std::uint32_t chunk_elements = 1U << 16;
  // Threads compressing chunks while the caller appends rows; 0 compresses on the caller's
  // thread. The file is the same byte for byte whatever the number.
  unsigned compression_threads = default_compression_threads();
  // Root attributes. `created` is an ISO 8601 UTC time; empty means now.
  std::string producer = "kvtier";
  std::string created;
};

// Now, as "2026-11-29T10:06:19Z"; `SOURCE_DATE_EPOCH` (reproducible builds' convention), when
// set to seconds since 1970, replaces the clock so that runs can produce identical files;
// ConfigError when it is set to anything else.
[[nodiscard]] std::string current_utc_time();

class TraceWriter {
 public:
  // Validates `meta` (DataError when it does not describe a trace) and creates every dataset.
  TraceWriter(std::filesystem::path path, config::TraceMeta meta, WriterOptions options = {});
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  ~TraceWriter();

  [[nodiscard]] const TraceShape& shape() const noexcept;
  [[nodiscard]] const config::TraceMeta& meta() const noexcept;

  // All prompt_tokens + steps token ids at once.
  void write_tokens(std::span<const std::int32_t> tokens);

  // The next decode row of `layer` (model layer index): row_length(t) weights for step t, where
  // t counts the rows this layer received so far.
  void append_mean_row(std::uint32_t layer, std::span<const float> row);
  // The next decode row of every head of `layer`: heads × row_length(t) weights, head-major.
  void append_head_rows(std::uint32_t layer, std::span<const float> rows);
  // The next top-k row of `layer`: exactly top_k entries (pad with kTopKPadIndex and weight 0
  // when the row is shorter than K) and the attention mass outside them.
  void append_topk_row(std::uint32_t layer, std::span<const std::int32_t> indices,
                       std::span<const float> weights, float residual);
  // The prefill window of `layer`: heads × prefill_window × prompt_tokens weights; query i
  // (position prompt_tokens - window + i) fills positions 0 .. its own, zeros after.
  void write_prefill_window(std::uint32_t layer, std::span<const float> weights);
  // Key norms of `layer`: kv_heads × tokens() values, head-major.
  void write_key_norms(std::uint32_t layer, std::span<const float> norms);

  // Checks that every declared dataset is complete, closes the file and renames it into place.
  void finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::traces
