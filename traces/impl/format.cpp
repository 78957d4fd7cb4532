#include "traces/format.hpp"

#include <cmath>

#include "common/errors.hpp"
#include "configs/schema/dtype.pb.h"

namespace kvtier::traces {
namespace {

std::string group_member(std::string_view group, std::uint32_t layer) {
  std::string path(group);
  path += '/';
  path += layer_name(layer);
  return path;
}

bool has(const config::TraceMeta& meta, config::TraceGranularity granularity) {
  for (const int present : meta.granularities()) {
    if (present == granularity) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string layer_name(std::uint32_t layer) {
  std::string digits = std::to_string(layer);
  if (digits.size() < 3) {
    digits.insert(0, 3 - digits.size(), '0');
  }
  return "layer_" + digits;
}

std::string mean_path(std::uint32_t layer) {
  return group_member(kMeanGroup, layer);
}
std::string heads_path(std::uint32_t layer) {
  return group_member(kHeadsGroup, layer);
}
std::string topk_indices_path(std::uint32_t layer) {
  return group_member(kTopKGroup, layer) + "/indices";
}
std::string topk_weights_path(std::uint32_t layer) {
  return group_member(kTopKGroup, layer) + "/weights";
}
std::string topk_residual_path(std::uint32_t layer) {
  return group_member(kTopKGroup, layer) + "/residual";
}
std::string prefill_path(std::uint32_t layer) {
  return group_member(kPrefillGroup, layer);
}

std::string_view granularity_name(config::TraceGranularity granularity) {
  switch (granularity) {
    case config::GRANULARITY_MEAN: return "mean";
    case config::GRANULARITY_HEADS: return "heads";
    case config::GRANULARITY_TOP_K: return "topk";
    case config::GRANULARITY_PREFILL_WINDOW: return "prefill_window";
    case config::GRANULARITY_KEY_NORMS: return "key_norms";
    default: return "unknown";
  }
}

TraceShape shape_from_meta(const config::TraceMeta& meta, const std::string& where) {
  auto fail = [&](const std::string& what) { throw DataError(what, where); };
  if (!meta.has_model()) {
    fail("/meta has no model");
  }
  const config::ModelSpec& model = meta.model();
  TraceShape shape;
  shape.prompt_tokens = meta.prompt_tokens();
  shape.steps = meta.steps();
  shape.layers = {meta.first_layer(), meta.num_layers()};
  shape.heads = model.num_attention_heads();
  shape.kv_heads = model.num_key_value_heads();
  shape.vocab_size = model.vocab_size();
  if (shape.prompt_tokens == 0 || shape.steps == 0 || shape.layers.count == 0) {
    fail("/meta declares an empty trace (prompt_tokens, steps and num_layers must be at least 1)");
  }
  if (shape.heads == 0 || shape.kv_heads == 0 || shape.vocab_size == 0) {
    fail("/meta model has no heads, KV heads or vocabulary");
  }
  if (static_cast<std::uint64_t>(shape.layers.first) + shape.layers.count >
      model.num_hidden_layers()) {
    fail("/meta layers " + std::to_string(shape.layers.first) + ".." +
         std::to_string(shape.layers.end() - 1) + " are not all in the model's " +
         std::to_string(model.num_hidden_layers()) + " layers");
  }
  if (shape.tokens() > std::uint64_t{1} << 31) {
    fail("/meta declares more than 2^31 positions");
  }
  switch (meta.attention_dtype()) {
    case config::FP16: shape.weight_type = WeightType::kFloat16; break;
    case config::FP32: shape.weight_type = WeightType::kFloat32; break;
    default: fail("/meta attention_dtype must be FP16 or FP32");
  }
  for (const int granularity : meta.granularities()) {
    if (granularity < config::GRANULARITY_MEAN || granularity > config::GRANULARITY_KEY_NORMS) {
      fail("/meta lists an unknown granularity (" + std::to_string(granularity) + ")");
    }
  }
  shape.has_mean = has(meta, config::GRANULARITY_MEAN);
  shape.has_heads = has(meta, config::GRANULARITY_HEADS);
  shape.has_topk = has(meta, config::GRANULARITY_TOP_K);
  shape.has_prefill = has(meta, config::GRANULARITY_PREFILL_WINDOW);
  shape.has_key_norms = has(meta, config::GRANULARITY_KEY_NORMS);
  if (!shape.has_mean && !shape.has_topk) {
    fail("/meta granularities include neither mean nor topk; every trace needs one of them");
  }
  if (shape.has_topk != meta.has_top_k() || (shape.has_topk && meta.top_k() == 0)) {
    fail("/meta top_k must be given, and at least 1, exactly when the topk granularity is");
  }
  if (shape.has_topk && meta.top_k() > kMaxTopK) {
    fail("/meta top_k " + std::to_string(meta.top_k()) + " is more than " +
         std::to_string(kMaxTopK));
  }
  shape.top_k = shape.has_topk ? meta.top_k() : 0;
  if (shape.has_prefill != meta.has_prefill_window() ||
      (shape.has_prefill &&
       (meta.prefill_window() == 0 || meta.prefill_window() > shape.prompt_tokens))) {
    fail(
        "/meta prefill_window must be given, between 1 and prompt_tokens, exactly when the "
        "prefill_window granularity is");
  }
  shape.prefill_window = shape.has_prefill ? meta.prefill_window() : 0;
  return shape;
}

std::vector<StepRange> plan_step_blocks(const TraceShape& shape, StepRange steps,
                                        std::uint64_t max_elements) {
  std::vector<StepRange> blocks;
  std::uint32_t first = steps.first;
  while (first < steps.end()) {
    std::uint32_t count = 1;
    std::uint64_t elements = shape.row_length(first);
    while (first + count < steps.end() &&
           elements + shape.row_length(first + count) <= max_elements) {
      elements += shape.row_length(first + count);
      ++count;
    }
    blocks.push_back({first, count});
    first += count;
  }
  return blocks;
}

double row_sum_tolerance(WeightType type, std::uint64_t row_length) noexcept {
  const auto length = static_cast<double>(row_length);
  if (type == WeightType::kFloat16) {
    return 2.0 * (0x1.0p-11 + length * 0x1.0p-25);
  }
  return 2.0 * (0x1.0p-24 + length * 0x1.0p-24);
}

}  // namespace kvtier::traces
