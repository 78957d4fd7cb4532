#include "replay/trace_source.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.hpp"
#include "traces/format.hpp"

namespace kvtier::replay {
namespace {

std::string step_where(const std::string& file, const std::string& dataset, std::uint64_t step) {
  return file + ", dataset " + dataset + ", step " + std::to_string(step);
}

}  // namespace

TraceAttention::TraceAttention(const std::filesystem::path& path, TraceAttentionOptions options)
    : reader_(path), options_(options) {
  const traces::TraceShape& trace = shape();
  // The reader refuses such a file already; checked again because replay cannot run without
  // one of the two, whatever a future reader accepts.
  if (!trace.has_mean && !trace.has_topk) {
    throw DataError("the trace holds neither mean nor top-k attention rows: nothing to replay",
                    reader_.file_name());
  }
  if (trace.layers.count == 0 || trace.steps == 0) {
    throw DataError("the trace holds no layers or no decode steps", reader_.file_name());
  }
  from_topk_ = !trace.has_mean;
  options_.block_elements = std::max<std::uint64_t>(options_.block_elements, 1);
  if (from_topk_) {
    topk_.resize(trace.layers.count);
  } else {
    mean_.resize(trace.layers.count);
  }
}

traces::StepRange TraceAttention::block_from(std::uint64_t step, std::uint64_t budget) const {
  // Consecutive steps from `step` whose rows hold at most `budget` weights, at least one.
  const traces::TraceShape& trace = shape();
  std::uint64_t end = step + 1;
  std::uint64_t elements = trace.row_length(step);
  while (end < trace.steps && elements + trace.row_length(end) <= budget) {
    elements += trace.row_length(end);
    ++end;
  }
  return {static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(end - step)};
}

void TraceAttention::check_step(std::uint64_t step) const {
  if (step >= shape().steps) {
    throw DataError("step " + std::to_string(step) + " is outside the trace (" +
                        std::to_string(shape().steps) + " steps)",
                    reader_.file_name());
  }
}

void TraceAttention::load_mean_block(std::uint64_t step) {
  const traces::TraceShape& trace = shape();
  // The budget is shared by all layers: each layer's block covers the same steps.
  const std::uint64_t per_layer = options_.block_elements / trace.layers.count;
  if (from_topk_) {
    // A top-k row costs K indices, K weights and a residual, whatever the row's length.
    const std::uint64_t per_row = 2 * std::uint64_t{trace.top_k} + 1;
    const std::uint64_t rows = std::max<std::uint64_t>(1, per_layer / per_row);
    const std::uint64_t count = std::min<std::uint64_t>(rows, trace.steps - step);
    mean_block_ = {static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(count)};
    for (std::uint32_t l = 0; l < trace.layers.count; ++l) {
      reader_.read_topk(trace.layers.first + l, mean_block_, topk_[l]);
    }
    return;
  }
  mean_block_ = block_from(step, per_layer);
  for (std::uint32_t l = 0; l < trace.layers.count; ++l) {
    reader_.read_mean(trace.layers.first + l, mean_block_, mean_[l]);
  }
}

void TraceAttention::reconstruct(std::uint32_t layer, std::uint64_t step,
                                 std::vector<float>& row) const {
  const traces::TraceShape& trace = shape();
  const traces::TopKRows& block = topk_[layer];
  const std::uint32_t model_layer = trace.layers.first + layer;
  const std::uint64_t i = step - block.steps.first;
  const std::uint64_t length = trace.row_length(step);
  const std::uint32_t k = block.k;
  const float residual = block.residual[i];
  if (!std::isfinite(residual) || residual < 0.0F) {
    throw DataError("top-k residual is negative or not finite",
                    step_where(reader_.file_name(), traces::topk_residual_path(model_layer), step));
  }
  // Stored entries first (validity checked on the way), then the residual over the others.
  std::uint64_t stored = 0;
  for (std::uint32_t j = 0; j < k; ++j) {
    const std::int32_t index = block.indices[i * k + j];
    if (index == traces::kTopKPadIndex) {
      continue;
    }
    if (index < 0 || static_cast<std::uint64_t>(index) >= length) {
      throw DataError(
          "top-k index " + std::to_string(index) + " is outside the row (" +
              std::to_string(length) + " positions)",
          step_where(reader_.file_name(), traces::topk_indices_path(model_layer), step));
    }
    ++stored;
  }
  const float spread =
      stored < length ? static_cast<float>(residual / static_cast<double>(length - stored)) : 0.0F;
  row.assign(length, spread);
  // A position named twice would count its weight once and lose the other: refused. The
  // marker is a NaN, which no stored weight is (the reader refuses NaN weights).
  const float marker = std::nanf("");
  for (std::uint32_t j = 0; j < k; ++j) {
    const std::int32_t index = block.indices[i * k + j];
    if (index == traces::kTopKPadIndex) {
      continue;
    }
    float& slot = row[static_cast<std::size_t>(index)];
    if (std::isnan(slot)) {
      throw DataError(
          "top-k index " + std::to_string(index) + " appears twice",
          step_where(reader_.file_name(), traces::topk_indices_path(model_layer), step));
    }
    slot = marker;
  }
  for (std::uint32_t j = 0; j < k; ++j) {
    const std::int32_t index = block.indices[i * k + j];
    if (index != traces::kTopKPadIndex) {
      row[static_cast<std::size_t>(index)] = block.weights[i * k + j];
    }
  }
}

void TraceAttention::read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  check_step(step);
  if (mean_block_.count == 0 || step < mean_block_.first || step >= mean_block_.end()) {
    load_mean_block(step);
  }
  const std::uint32_t count = layers();
  rows.resize(count);
  for (std::uint32_t l = 0; l < count; ++l) {
    if (from_topk_) {
      reconstruct(l, step, rows[l]);
    } else {
      const auto row = mean_[l].row(static_cast<std::uint32_t>(step - mean_block_.first));
      rows[l].assign(row.begin(), row.end());
    }
  }
}

std::uint32_t TraceAttention::heads() const {
  return shape().has_heads ? shape().heads : 0;
}

void TraceAttention::load_head_block(std::uint64_t step) {
  const traces::TraceShape& trace = shape();
  const std::uint64_t per_layer = options_.block_elements / trace.layers.count / trace.heads;
  head_block_ = block_from(step, per_layer);
  heads_.resize(trace.layers.count);
  for (std::uint32_t l = 0; l < trace.layers.count; ++l) {
    reader_.read_heads(trace.layers.first + l, head_block_, heads_[l]);
  }
}

void TraceAttention::read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  if (!shape().has_heads) {
    AttentionSource::read_head_step(step, rows);
    return;
  }
  check_step(step);
  if (head_block_.count == 0 || step < head_block_.first || step >= head_block_.end()) {
    load_head_block(step);
  }
  const std::uint32_t count = layers();
  const std::uint64_t length = shape().row_length(step);
  const auto i = static_cast<std::uint32_t>(step - head_block_.first);
  rows.resize(count);
  for (std::uint32_t l = 0; l < count; ++l) {
    rows[l].resize(length * shape().heads);
    auto out = rows[l].begin();
    for (std::uint32_t head = 0; head < shape().heads; ++head) {
      const auto row = heads_[l].row(head, i);
      out = std::copy(row.begin(), row.end(), out);
    }
  }
}

std::uint32_t TraceAttention::prefill_window() const {
  return shape().has_prefill ? shape().prefill_window : 0;
}

std::vector<float> TraceAttention::read_prefill_window(std::uint32_t layer) {
  if (!shape().has_prefill) {
    return AttentionSource::read_prefill_window(layer);
  }
  return reader_.read_prefill_window(shape().layers.first + layer);
}

std::uint32_t TraceAttention::kv_heads() const {
  return shape().has_key_norms ? shape().kv_heads : 0;
}

std::vector<float> TraceAttention::read_key_norms(std::uint32_t layer) {
  if (!shape().has_key_norms) {
    return AttentionSource::read_key_norms(layer);
  }
  return reader_.read_key_norms(shape().layers.first + layer);
}

}  // namespace kvtier::replay
