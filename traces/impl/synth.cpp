// Synthetic trace presets, parameter checks and the writer loop of `kvtier trace synth`.

#include <array>
#include <cmath>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "configs/validate.hpp"
#include "sim/random.hpp"
#include "traces/synth.hpp"

namespace kvtier::traces {
namespace {

constexpr std::array<std::string_view, 3> kPatterns = {"reasoning", "chat", "retrieval"};

enum Stream : std::uint64_t { kTokens = 5, kKeyNorms = 6 };

struct Preset {
  std::uint32_t sink_tokens;
  double sink_mass, recency_mass, decay;
  std::uint32_t band, heavy_count;
  double heavy_mass, zipf, reread_mass;
  std::uint32_t note_tokens;
  double note_interval;
  std::uint32_t rereads, burst;
  double delay_min, delay_max, local_fraction, local_scale, head_variation;
};

// Starting points chosen to resemble published attention maps (StreamingLLM's sinks, H2O's
// heavy hitters, the long-range re-reads of reasoning models); each is documented in
// docs/TRACE_FORMAT.md and can be changed with --set.
Preset preset_values(std::string_view pattern) {
  if (pattern == "chat") {
    return {4, 0.25, 0.40, 16, 512, 32, 0.15, 1.0, 0.0, 16, 64, 0, 4, 100, 1000, 0.5, 0.3, 0.5};
  }
  if (pattern == "retrieval") {
    return {4, 0.15, 0.25, 8, 256, 64, 0.40, 0.8, 0.0, 16, 64, 0, 4, 100, 1000, 0.4, 0.5, 0.5};
  }
  return {4, 0.20, 0.35, 12, 512, 16, 0.10, 1.1, 0.25, 24, 48, 2, 6, 150, 1500, 0.5, 0.3, 0.5};
}

}  // namespace

std::span<const std::string_view> synthetic_patterns() {
  return kPatterns;
}

config::SyntheticAttention synthetic_preset(std::string_view pattern, std::uint64_t seed) {
  if (std::find(kPatterns.begin(), kPatterns.end(), pattern) == kPatterns.end()) {
    throw ConfigError("unknown --pattern '" + std::string(pattern) +
                      "': expected reasoning, chat or retrieval");
  }
  const Preset p = preset_values(pattern);
  config::SyntheticAttention params;
  params.set_pattern(std::string(pattern));
  params.set_seed(seed);
  params.set_sink_tokens(p.sink_tokens);
  params.set_sink_mass(p.sink_mass);
  params.set_recency_mass(p.recency_mass);
  params.set_recency_decay_tokens(p.decay);
  params.set_recency_band_tokens(p.band);
  params.set_heavy_hitter_count(p.heavy_count);
  params.set_heavy_hitter_mass(p.heavy_mass);
  params.set_heavy_hitter_zipf_exponent(p.zipf);
  params.set_reread_mass(p.reread_mass);
  params.set_note_tokens(p.note_tokens);
  params.set_note_interval_steps(p.note_interval);
  params.set_rereads_per_note(p.rereads);
  params.set_reread_burst_steps(p.burst);
  params.set_reread_delay_min_steps(p.delay_min);
  params.set_reread_delay_max_steps(p.delay_max);
  params.set_local_layer_fraction(p.local_fraction);
  params.set_local_long_range_scale(p.local_scale);
  params.set_head_variation(p.head_variation);
  return params;
}

void check_synthetic(const config::SyntheticAttention& params) {
  const config::PresetRegistry no_presets({});
  const config::ConfigLoader loader(no_presets);
  const std::vector<config::Problem> problems =
      config::validate(params, loader, config::LocationMap("synthetic parameters"));
  if (!problems.empty()) {
    throw ConfigError(problems.front().what, "synthetic parameter " + problems.front().path);
  }
  const double total = params.sink_mass() + params.recency_mass() + params.heavy_hitter_mass();
  if (total > 1.0 + 1e-12) {
    throw ConfigError("sink_mass + recency_mass + heavy_hitter_mass is " + format_double(total) +
                          "; a row's masses cannot exceed 1",
                      "synthetic parameters");
  }
  if (params.reread_mass() > params.recency_mass()) {
    throw ConfigError(
        "reread_mass exceeds recency_mass: a re-read takes its mass from the "
        "recency band",
        "synthetic parameters");
  }
  if (params.reread_delay_min_steps() > params.reread_delay_max_steps()) {
    throw ConfigError("reread_delay_min_steps exceeds reread_delay_max_steps",
                      "synthetic parameters");
  }
}

config::TraceMeta synthetic_meta(const SynthOptions& options) {
  check_synthetic(options.params);
  config::TraceMeta meta;
  *meta.mutable_model() = options.model;
  meta.set_prompt_tokens(options.prompt_tokens);
  meta.set_steps(options.steps);
  meta.set_first_layer(0);
  meta.set_num_layers(options.model.num_hidden_layers());
  if (options.mean) {
    meta.add_granularities(config::GRANULARITY_MEAN);
  }
  if (options.heads) {
    meta.add_granularities(config::GRANULARITY_HEADS);
  }
  if (options.top_k > 0) {
    meta.add_granularities(config::GRANULARITY_TOP_K);
    meta.set_top_k(options.top_k);
  }
  if (options.prefill_window > 0) {
    meta.add_granularities(config::GRANULARITY_PREFILL_WINDOW);
    meta.set_prefill_window(options.prefill_window);
  }
  if (options.key_norms) {
    meta.add_granularities(config::GRANULARITY_KEY_NORMS);
  }
  meta.set_attention_dtype(options.dtype);
  config::TraceSource& source = *meta.mutable_source();
  source.set_kind(config::SOURCE_SYNTHETIC);
  source.set_tool(options.tool);
  if (!options.description.empty()) {
    source.set_description(options.description);
  }
  *source.mutable_synthetic() = options.params;
  return meta;
}

void write_synthetic_trace(const std::filesystem::path& path, const SynthOptions& options) {
  TraceWriter writer(path, synthetic_meta(options), options.writer);
  const TraceShape& shape = writer.shape();
  const SyntheticAttentionModel model(options.params, shape, options.model.num_hidden_layers());
  const std::uint64_t seed = options.params.seed();

  sim::RandomStream token_stream(seed, kTokens);
  std::vector<std::int32_t> tokens(shape.tokens());
  for (auto& token : tokens) {
    token = static_cast<std::int32_t>(token_stream.uniform_below(shape.vocab_size));
  }
  writer.write_tokens(tokens);

  std::vector<float> row;
  std::vector<float> heads;
  std::vector<std::int32_t> indices(shape.top_k);
  std::vector<float> weights(shape.top_k);
  for (std::uint32_t step = 0; step < shape.steps; ++step) {
    const std::uint64_t length = shape.row_length(step);
    for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
      if (shape.has_mean) {
        row.resize(length);
        model.mean_row(layer, step, row);
        writer.append_mean_row(layer, row);
      }
      if (shape.has_heads) {
        heads.resize(length * shape.heads);
        for (std::uint32_t head = 0; head < shape.heads; ++head) {
          model.head_row(layer, step, head, std::span<float>(heads).subspan(head * length, length));
        }
        writer.append_head_rows(layer, heads);
      }
      if (shape.has_topk) {
        float residual = 0.0F;
        model.top_k_row(layer, step, shape.top_k, indices, weights, residual);
        writer.append_topk_row(layer, indices, weights, residual);
      }
    }
  }
  sim::RandomStream norm_stream(seed, kKeyNorms);
  for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
    if (shape.has_prefill) {
      const std::uint64_t window = shape.prefill_window;
      const std::uint64_t prompt = shape.prompt_tokens;
      std::vector<float> block(shape.heads * window * prompt, 0.0F);
      for (std::uint32_t head = 0; head < shape.heads; ++head) {
        for (std::uint64_t query = 0; query < window; ++query) {
          const std::uint64_t position = prompt - window + query;
          model.prefill_row(
              layer, head, position,
              std::span<float>(block).subspan((head * window + query) * prompt, position + 1));
        }
      }
      writer.write_prefill_window(layer, block);
    }
    if (shape.has_key_norms) {
      // A synthetic convention, not a measurement: norms around 10 with about ±6% spread, the
      // sink positions' keys five times smaller.
      std::vector<float> norms(shape.kv_heads * shape.tokens());
      for (std::size_t i = 0; i < norms.size(); ++i) {
        const double spread = std::exp(0.25 * (norm_stream.uniform_01() - 0.5));
        const bool sink = i % shape.tokens() < options.params.sink_tokens();
        norms[i] = static_cast<float>(10.0 * spread * (sink ? 0.2 : 1.0));
      }
      writer.write_key_norms(layer, norms);
    }
  }
  writer.finish();
}

}  // namespace kvtier::traces
