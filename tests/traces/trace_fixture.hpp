#pragma once
// Shared pieces of the trace tests: a scratch folder, small trace descriptions and
// deterministic rows that are valid probability distributions.

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "configs/schema/model.pb.h"
#include "configs/schema/trace.pb.h"
#include "tests/support/config_fixture.hpp"
#include "traces/format.hpp"

namespace kvtier::test {

// One folder per test process under the system's temporary folder.
inline std::filesystem::path trace_scratch() {
  static const std::filesystem::path dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "kvtier-traces-XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    REQUIRE(made != nullptr);
    return std::filesystem::path(made);
  }();
  return dir;
}

// stories260K: 5 layers, 8 heads, 4 KV heads, vocabulary 512.
inline config::ModelSpec tiny_model() {
  return load_spec<config::ModelSpec>("preset: \"stories260K\"");
}

inline config::TraceMeta tiny_meta(std::uint32_t prompt, std::uint32_t steps,
                                   std::vector<config::TraceGranularity> granularities,
                                   config::DType dtype = config::FP16) {
  config::TraceMeta meta;
  *meta.mutable_model() = tiny_model();
  meta.set_prompt_tokens(prompt);
  meta.set_steps(steps);
  meta.set_first_layer(0);
  meta.set_num_layers(meta.model().num_hidden_layers());
  for (const auto granularity : granularities) {
    meta.add_granularities(granularity);
  }
  meta.set_attention_dtype(dtype);
  meta.mutable_source()->set_kind(config::SOURCE_CAPTURED);
  meta.mutable_source()->set_tool("kvtier tests");
  return meta;
}

// A distribution over `length` positions that differs by layer, step and head: weight
// proportional to 1 + ((position * 7 + layer * 3 + step + head * 5) % 11), normalised.
inline std::vector<float> test_row(std::uint32_t layer, std::uint32_t step, std::uint32_t head,
                                   std::uint64_t length) {
  std::vector<float> row(length);
  double total = 0.0;
  for (std::uint64_t i = 0; i < length; ++i) {
    row[i] = static_cast<float>(1 + ((i * 7 + layer * 3 + step + head * 5) % 11));
    total += row[i];
  }
  for (auto& value : row) {
    value = static_cast<float>(value / total);
  }
  return row;
}

}  // namespace kvtier::test

#include <algorithm>
#include <numeric>

#include "traces/writer.hpp"

namespace kvtier::test {

inline constexpr std::uint32_t kMeanHead = 99;  // test_row's head argument for mean rows

// The top `k` entries of `row` by weight (ties: lower position first), padded with -1 / 0.
inline void top_entries(const std::vector<float>& row, std::uint32_t k,
                        std::vector<std::int32_t>& indices, std::vector<float>& weights,
                        float& residual) {
  std::vector<std::int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return row[static_cast<std::size_t>(a)] > row[static_cast<std::size_t>(b)];
  });
  indices.assign(k, traces::kTopKPadIndex);
  weights.assign(k, 0.0F);
  double kept = 0.0;
  double total = 0.0;
  for (const float w : row) {
    total += w;
  }
  for (std::uint32_t i = 0; i < k && i < order.size(); ++i) {
    indices[i] = order[i];
    weights[i] = row[static_cast<std::size_t>(order[i])];
    kept += weights[i];
  }
  residual = static_cast<float>(std::max(0.0, total - kept));
}

// Writes a trace holding every granularity `meta` declares, with test_row data.
inline void write_test_trace(const std::filesystem::path& path, const config::TraceMeta& meta,
                             traces::WriterOptions options = {}) {
  traces::TraceWriter writer(path, meta, options);
  const traces::TraceShape& shape = writer.shape();
  std::vector<std::int32_t> tokens(shape.tokens());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 37) % shape.vocab_size);
  }
  writer.write_tokens(tokens);
  std::vector<std::int32_t> indices;
  std::vector<float> weights;
  for (std::uint32_t step = 0; step < shape.steps; ++step) {
    const std::uint64_t n = shape.row_length(step);
    for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
      const std::vector<float> mean = test_row(layer, step, kMeanHead, n);
      if (shape.has_mean) {
        writer.append_mean_row(layer, mean);
      }
      if (shape.has_heads) {
        std::vector<float> heads;
        for (std::uint32_t head = 0; head < shape.heads; ++head) {
          const std::vector<float> row = test_row(layer, step, head, n);
          heads.insert(heads.end(), row.begin(), row.end());
        }
        writer.append_head_rows(layer, heads);
      }
      if (shape.has_topk) {
        float residual = 0.0F;
        top_entries(mean, shape.top_k, indices, weights, residual);
        writer.append_topk_row(layer, indices, weights, residual);
      }
    }
  }
  for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
    if (shape.has_prefill) {
      std::vector<float> window(static_cast<std::size_t>(shape.heads) * shape.prefill_window *
                                shape.prompt_tokens);
      for (std::uint32_t head = 0; head < shape.heads; ++head) {
        for (std::uint32_t query = 0; query < shape.prefill_window; ++query) {
          const std::uint64_t position = shape.prompt_tokens - shape.prefill_window + query;
          const std::vector<float> row = test_row(layer, query, head, position + 1);
          std::copy(
              row.begin(), row.end(),
              window.begin() + static_cast<std::ptrdiff_t>((head * shape.prefill_window + query) *
                                                           std::uint64_t{shape.prompt_tokens}));
        }
      }
      writer.write_prefill_window(layer, window);
    }
    if (shape.has_key_norms) {
      std::vector<float> norms(shape.kv_heads * shape.tokens());
      for (std::size_t i = 0; i < norms.size(); ++i) {
        norms[i] = static_cast<float>(layer) + 0.25F * static_cast<float>(i % 13);
      }
      writer.write_key_norms(layer, norms);
    }
  }
  writer.finish();
}

}  // namespace kvtier::test
