#include "replay/attention.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"

namespace kvtier::replay {

std::vector<std::uint32_t> project_layers(std::uint32_t source, std::uint32_t target) {
  std::vector<std::uint32_t> map(target, 0);
  if (target > 1) {
    for (std::uint32_t layer = 0; layer < target; ++layer) {
      map[layer] = static_cast<std::uint32_t>(
          std::llround(static_cast<double>(layer) * (source - 1) / (target - 1)));
    }
  }
  return map;
}

void AttentionSource::read_head_step(std::uint64_t /*step*/,
                                     std::vector<std::vector<float>>& /*rows*/) {
  throw DataError(name() + ": no per-head attention rows");
}

std::vector<float> AttentionSource::read_prefill_window(std::uint32_t /*layer*/) {
  throw DataError(name() + ": no prefill window attention");
}

std::vector<float> AttentionSource::read_key_norms(std::uint32_t /*layer*/) {
  throw DataError(name() + ": no key norms");
}

InMemoryAttention::InMemoryAttention(std::uint32_t layers, std::uint64_t prompt_tokens,
                                     std::vector<std::vector<std::vector<float>>> rows)
    : layers_(layers), prompt_tokens_(prompt_tokens), rows_(std::move(rows)) {
  for (std::size_t step = 0; step < rows_.size(); ++step) {
    if (rows_[step].size() != layers_) {
      throw std::invalid_argument("step " + std::to_string(step) + " has " +
                                  std::to_string(rows_[step].size()) + " layers, expected " +
                                  std::to_string(layers_));
    }
    for (const auto& row : rows_[step]) {
      if (row.size() != prompt_tokens_ + step + 1) {
        throw std::invalid_argument("step " + std::to_string(step) + " row has " +
                                    std::to_string(row.size()) + " entries, expected " +
                                    std::to_string(prompt_tokens_ + step + 1));
      }
    }
  }
}

void InMemoryAttention::read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  rows = rows_.at(step);
}

void InMemoryAttention::set_head_rows(std::uint32_t heads,
                                      std::vector<std::vector<std::vector<float>>> head_rows) {
  if (head_rows.size() != rows_.size()) {
    throw std::invalid_argument("head rows cover " + std::to_string(head_rows.size()) +
                                " steps, expected " + std::to_string(rows_.size()));
  }
  for (std::size_t step = 0; step < head_rows.size(); ++step) {
    for (const auto& layer : head_rows[step]) {
      if (layer.size() != heads * (prompt_tokens_ + step + 1)) {
        throw std::invalid_argument("step " + std::to_string(step) +
                                    " head rows have the wrong length");
      }
    }
  }
  heads_ = heads;
  head_rows_ = std::move(head_rows);
}

void InMemoryAttention::set_prefill_window(std::uint32_t window,
                                           std::vector<std::vector<float>> window_weights) {
  if (window_weights.size() != layers_) {
    throw std::invalid_argument("prefill window needs one entry per layer");
  }
  window_ = window;
  window_weights_ = std::move(window_weights);
}

void InMemoryAttention::set_key_norms(std::uint32_t kv_heads,
                                      std::vector<std::vector<float>> norms) {
  for (const auto& layer : norms) {
    if (layer.size() != kv_heads * (prompt_tokens_ + rows_.size())) {
      throw std::invalid_argument("key norms need kv_heads x tokens values per layer");
    }
  }
  if (norms.size() != layers_) {
    throw std::invalid_argument("key norms need one entry per layer");
  }
  kv_heads_ = kv_heads;
  key_norms_ = std::move(norms);
}

void InMemoryAttention::read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  if (heads_ == 0) {
    AttentionSource::read_head_step(step, rows);
  }
  rows = head_rows_.at(step);
}

std::vector<float> InMemoryAttention::read_prefill_window(std::uint32_t layer) {
  if (window_ == 0) {
    return AttentionSource::read_prefill_window(layer);
  }
  return window_weights_.at(layer);
}

std::vector<float> InMemoryAttention::read_key_norms(std::uint32_t layer) {
  if (kv_heads_ == 0) {
    return AttentionSource::read_key_norms(layer);
  }
  return key_norms_.at(layer);
}

}  // namespace kvtier::replay
