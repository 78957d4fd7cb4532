// replay::MemoryTrace (declared in replay/budget_search.hpp): a trace read once and replayed
// many times, from several threads, by the budget search.

#include <algorithm>
#include <stdexcept>

#include "common/errors.hpp"
#include "replay/budget_search.hpp"

namespace kvtier::replay {

struct MemoryTrace::Data {
  std::string name;
  std::uint32_t layers = 0;
  std::uint64_t prompt = 0;
  std::vector<std::vector<std::vector<float>>> rows;  // [step][layer]
  std::uint32_t heads = 0;
  std::vector<std::vector<std::vector<float>>> head_rows;  // [step][layer], empty when absent
  std::uint32_t window = 0;
  std::vector<std::vector<float>> window_weights;  // [layer]
  std::uint32_t kv_heads = 0;
  std::vector<std::vector<float>> key_norms;  // [layer]
};

MemoryTrace::MemoryTrace(AttentionSource& source, std::span<const PolicyInput> inputs) {
  auto data = std::make_shared<Data>();
  data->name = source.name();
  data->layers = source.layers();
  data->prompt = source.prompt_tokens();
  data->rows.resize(source.steps());
  for (std::uint64_t step = 0; step < source.steps(); ++step) {
    source.read_step(step, data->rows[step]);
  }
  const auto wants = [&](PolicyInput input) {
    return std::find(inputs.begin(), inputs.end(), input) != inputs.end();
  };
  if (wants(PolicyInput::kHeadRows) && source.heads() > 0) {
    data->heads = source.heads();
    data->head_rows.resize(source.steps());
    for (std::uint64_t step = 0; step < source.steps(); ++step) {
      source.read_head_step(step, data->head_rows[step]);
    }
  }
  if (wants(PolicyInput::kPrefillWindow) && source.prefill_window() > 0) {
    data->window = source.prefill_window();
    for (std::uint32_t layer = 0; layer < data->layers; ++layer) {
      data->window_weights.push_back(source.read_prefill_window(layer));
    }
  }
  if (wants(PolicyInput::kKeyNorms) && source.kv_heads() > 0) {
    data->kv_heads = source.kv_heads();
    for (std::uint32_t layer = 0; layer < data->layers; ++layer) {
      data->key_norms.push_back(source.read_key_norms(layer));
    }
  }
  data_ = std::move(data);
}

MemoryTrace::MemoryTrace(std::uint32_t layers, std::uint64_t prompt_tokens,
                         std::vector<std::vector<std::vector<float>>> rows, std::string name) {
  for (std::size_t step = 0; step < rows.size(); ++step) {
    if (rows[step].size() != layers) {
      throw std::invalid_argument("MemoryTrace: step " + std::to_string(step) + " has " +
                                  std::to_string(rows[step].size()) + " layers");
    }
    for (const auto& row : rows[step]) {
      if (row.size() != prompt_tokens + step + 1) {
        throw std::invalid_argument("MemoryTrace: step " + std::to_string(step) +
                                    " has a row of the wrong length");
      }
    }
  }
  auto data = std::make_shared<Data>();
  data->name = std::move(name);
  data->layers = layers;
  data->prompt = prompt_tokens;
  data->rows = std::move(rows);
  data_ = std::move(data);
}

SourceFactory MemoryTrace::factory() const {
  return [copy = *this] { return std::make_unique<MemoryTrace>(copy); };
}

std::uint32_t MemoryTrace::layers() const {
  return data_->layers;
}
std::uint64_t MemoryTrace::prompt_tokens() const {
  return data_->prompt;
}
std::uint64_t MemoryTrace::steps() const {
  return data_->rows.size();
}
void MemoryTrace::read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  rows = data_->rows.at(step);
}
std::uint32_t MemoryTrace::heads() const {
  return data_->heads;
}
void MemoryTrace::read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  if (data_->heads == 0) {
    AttentionSource::read_head_step(step, rows);
    return;
  }
  rows = data_->head_rows.at(step);
}
std::uint32_t MemoryTrace::prefill_window() const {
  return data_->window;
}
std::vector<float> MemoryTrace::read_prefill_window(std::uint32_t layer) {
  if (data_->window == 0) {
    return AttentionSource::read_prefill_window(layer);
  }
  return data_->window_weights.at(layer);
}
std::uint32_t MemoryTrace::kv_heads() const {
  return data_->kv_heads;
}
std::vector<float> MemoryTrace::read_key_norms(std::uint32_t layer) {
  if (data_->kv_heads == 0) {
    return AttentionSource::read_key_norms(layer);
  }
  return data_->key_norms.at(layer);
}
std::string MemoryTrace::name() const {
  return data_->name;
}

}  // namespace kvtier::replay
