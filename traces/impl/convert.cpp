#include "traces/convert.hpp"

#include <algorithm>
#include <numeric>

#include "common/errors.hpp"
#include "traces/reader.hpp"

namespace kvtier::traces {
namespace {

// What the output holds, decided from the input's shape and the options.
struct Plan {
  StepRange steps;
  LayerRange layers;
  bool mean_from_heads = false;  // output mean rows are the average of the input's head rows
  bool mean = false;
  bool heads = false;
  bool topk_from_dense = false;
  bool topk_copied = false;
  bool prefill = false;
  bool key_norms = false;
  std::string description;
};

Plan make_plan(const TraceShape& in, const ConvertOptions& options, const std::string& file) {
  Plan plan;
  plan.steps = options.steps.value_or(StepRange{0, in.steps});
  plan.layers = options.layers.value_or(in.layers);
  if (plan.steps.count == 0 || plan.steps.end() > in.steps || plan.steps.end() < plan.steps.first) {
    throw ConfigError("--steps is outside the trace's " + std::to_string(in.steps) + " steps",
                      file);
  }
  if (plan.layers.count == 0 || !in.has_layer(plan.layers.first) ||
      !in.has_layer(plan.layers.end() - 1)) {
    throw ConfigError("--layers is outside the trace's layers " + std::to_string(in.layers.first) +
                          ".." + std::to_string(in.layers.end() - 1),
                      file);
  }
  if (options.heads_to_mean && !in.has_heads) {
    throw ConfigError("the trace has no per-head rows to average", file);
  }
  if (options.top_k > kMaxTopK) {
    throw ConfigError(
        "--top-k " + std::to_string(options.top_k) + " is more than " + std::to_string(kMaxTopK),
        file);
  }
  if (options.top_k > 0 && !in.has_dense()) {
    throw ConfigError("top-k rows can only be computed from dense (mean or per-head) rows", file);
  }
  if (options.drop_dense && options.top_k == 0 && !in.has_topk) {
    throw ConfigError("dropping the dense rows would leave no attention rows", file);
  }
  const bool keep_dense = !options.drop_dense;
  plan.mean_from_heads = options.heads_to_mean || (!in.has_mean && options.top_k > 0);
  plan.mean = keep_dense && (in.has_mean || options.heads_to_mean);
  plan.heads = keep_dense && in.has_heads && !options.heads_to_mean;
  plan.topk_from_dense = options.top_k > 0;
  plan.topk_copied = options.top_k == 0 && in.has_topk;
  plan.prefill = in.has_prefill && plan.steps.first == 0;
  plan.key_norms = in.has_key_norms;
  auto note = [&](const std::string& text) {
    plan.description += (plan.description.empty() ? "" : "; ") + text;
  };
  if (options.heads_to_mean) {
    note("heads -> mean");
  }
  if (options.top_k > 0) {
    note("dense -> top-" + std::to_string(options.top_k) + (options.drop_dense ? " only" : ""));
  }
  if (options.steps) {
    note("steps " + std::to_string(plan.steps.first) + ".." + std::to_string(plan.steps.end() - 1));
  }
  if (options.layers) {
    note("layers " + std::to_string(plan.layers.first) + ".." +
         std::to_string(plan.layers.end() - 1));
  }
  note("deflate " + std::to_string(options.writer.deflate_level));
  return plan;
}

config::TraceMeta output_meta(const TraceReader& reader, const Plan& plan,
                              const ConvertOptions& options) {
  const TraceShape& in = reader.shape();
  config::TraceMeta meta = reader.meta();
  meta.set_prompt_tokens(in.prompt_tokens + plan.steps.first);
  meta.set_steps(plan.steps.count);
  meta.set_first_layer(plan.layers.first);
  meta.set_num_layers(plan.layers.count);
  meta.clear_granularities();
  meta.clear_top_k();
  meta.clear_prefill_window();
  if (plan.mean) {
    meta.add_granularities(config::GRANULARITY_MEAN);
  }
  if (plan.heads) {
    meta.add_granularities(config::GRANULARITY_HEADS);
  }
  if (plan.topk_from_dense || plan.topk_copied) {
    meta.add_granularities(config::GRANULARITY_TOP_K);
    meta.set_top_k(plan.topk_from_dense ? options.top_k : in.top_k);
  }
  if (plan.prefill) {
    meta.add_granularities(config::GRANULARITY_PREFILL_WINDOW);
    meta.set_prefill_window(in.prefill_window);
  }
  if (plan.key_norms) {
    meta.add_granularities(config::GRANULARITY_KEY_NORMS);
  }
  config::TraceSource source;
  source.set_kind(config::SOURCE_CONVERTED);
  source.set_tool(options.tool);
  source.set_converted_from(std::filesystem::path(reader.file_name()).filename().string());
  source.set_conversion(plan.description);
  if (reader.meta().source().has_synthetic()) {
    *source.mutable_synthetic() = reader.meta().source().synthetic();
  }
  *source.mutable_original() = reader.meta().source();
  *meta.mutable_source() = std::move(source);
  return meta;
}

// The k largest weights of `row` (weight descending, position ascending on ties), padded.
void top_k_of(std::span<const float> row, std::uint32_t k, std::vector<std::uint32_t>& order,
              std::vector<std::int32_t>& indices, std::vector<float>& weights, float& residual) {
  order.resize(row.size());
  std::iota(order.begin(), order.end(), 0U);
  const std::size_t kept = std::min<std::size_t>(k, row.size());
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(),
      [&](std::uint32_t a, std::uint32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
  indices.assign(k, kTopKPadIndex);
  weights.assign(k, 0.0F);
  double total = 0.0;
  double top = 0.0;
  for (const float w : row) {
    total += w;
  }
  for (std::size_t i = 0; i < kept; ++i) {
    indices[i] = static_cast<std::int32_t>(order[i]);
    weights[i] = row[order[i]];
    top += weights[i];
  }
  residual = static_cast<float>(std::max(0.0, total - top));
}

}  // namespace

std::string convert_trace(const std::filesystem::path& input, const std::filesystem::path& output,
                          const ConvertOptions& options) {
  const TraceReader reader(input);
  const TraceShape& in = reader.shape();
  const Plan plan = make_plan(in, options, input.string());
  TraceWriter writer(output, output_meta(reader, plan, options), options.writer);
  const TraceShape& out = writer.shape();

  std::vector<std::int32_t> tokens = reader.read_tokens();
  tokens.resize(out.tokens());
  writer.write_tokens(tokens);

  DenseRows mean;
  HeadRows heads;
  TopKRows topk;
  std::vector<float> averaged;
  std::vector<std::uint32_t> order;
  std::vector<std::int32_t> indices;
  std::vector<float> weights;
  const bool need_heads = plan.heads || plan.mean_from_heads;
  const bool need_mean = !plan.mean_from_heads && (plan.mean || plan.topk_from_dense);
  const std::uint64_t budget =
      std::max<std::uint64_t>(1, options.block_elements / (need_heads ? in.heads : 1));
  for (const StepRange block : reader.plan_blocks(plan.steps, budget)) {
    for (std::uint32_t layer = plan.layers.first; layer < plan.layers.end(); ++layer) {
      if (need_mean) {
        reader.read_mean(layer, block, mean);
      }
      if (need_heads) {
        reader.read_heads(layer, block, heads);
      }
      if (plan.topk_copied) {
        reader.read_topk(layer, block, topk);
      }
      for (std::uint32_t i = 0; i < block.count; ++i) {
        std::span<const float> mean_row;
        if (plan.mean_from_heads) {
          const std::size_t length = heads.row(0, i).size();
          averaged.assign(length, 0.0F);
          for (std::uint32_t head = 0; head < in.heads; ++head) {
            const std::span<const float> row = heads.row(head, i);
            for (std::size_t p = 0; p < length; ++p) {
              averaged[p] += row[p];
            }
          }
          for (float& w : averaged) {
            w /= static_cast<float>(in.heads);
          }
          mean_row = averaged;
        } else if (need_mean) {
          mean_row = mean.row(i);
        }
        if (plan.mean) {
          writer.append_mean_row(layer, mean_row);
        }
        if (plan.heads) {
          averaged.clear();
          for (std::uint32_t head = 0; head < in.heads; ++head) {
            const std::span<const float> row = heads.row(head, i);
            averaged.insert(averaged.end(), row.begin(), row.end());
          }
          writer.append_head_rows(layer, averaged);
        }
        if (plan.topk_from_dense) {
          float residual = 0.0F;
          top_k_of(mean_row, options.top_k, order, indices, weights, residual);
          writer.append_topk_row(layer, indices, weights, residual);
        }
        if (plan.topk_copied) {
          const std::size_t k = topk.k;
          writer.append_topk_row(layer, std::span(topk.indices).subspan(i * k, k),
                                 std::span(topk.weights).subspan(i * k, k), topk.residual[i]);
        }
      }
    }
  }
  for (std::uint32_t layer = plan.layers.first; layer < plan.layers.end(); ++layer) {
    if (plan.prefill) {
      writer.write_prefill_window(layer, reader.read_prefill_window(layer));
    }
    if (plan.key_norms) {
      const std::vector<float> norms = reader.read_key_norms(layer);
      std::vector<float> kept;
      for (std::uint32_t head = 0; head < in.kv_heads; ++head) {
        const auto begin = norms.begin() + static_cast<std::ptrdiff_t>(head * in.tokens());
        kept.insert(kept.end(), begin, begin + static_cast<std::ptrdiff_t>(out.tokens()));
      }
      writer.write_key_norms(layer, kept);
    }
  }
  writer.finish();
  return plan.description;
}

}  // namespace kvtier::traces
