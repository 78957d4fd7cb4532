#include "traces/describe.hpp"

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <sstream>

#include "common/text_output.hpp"
#include "configs/dtype.hpp"

namespace kvtier::traces {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string granularities(const TraceShape& shape) {
  std::string text;
  auto add = [&](bool present, const std::string& name) {
    if (present) {
      text += (text.empty() ? "" : ", ") + name;
    }
  };
  add(shape.has_mean, "mean");
  add(shape.has_heads, "heads");
  add(shape.has_topk, "topk (k=" + std::to_string(shape.top_k) + ")");
  add(shape.has_prefill, "prefill_window (w=" + std::to_string(shape.prefill_window) + ")");
  add(shape.has_key_norms, "key_norms");
  return text;
}

std::string source_text(const config::TraceMeta& meta) {
  const config::TraceSource& source = meta.source();
  std::string text = config::TraceSourceKind_Name(source.kind()) + " by " + source.tool();
  if (source.has_synthetic()) {
    text += " (pattern " + source.synthetic().pattern() + ", seed " +
            std::to_string(source.synthetic().seed()) + ")";
  }
  if (source.has_converted_from()) {
    text += " from " + source.converted_from() + ": " + source.conversion();
  }
  return text;
}

double ratio(const TraceSummary& summary) {
  return summary.attention.stored_bytes > 0
             ? static_cast<double>(summary.attention.logical_bytes) /
                   static_cast<double>(summary.attention.stored_bytes)
             : 0.0;
}

std::string meta_json(const config::TraceMeta& meta) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(meta, &json, options);
  return json;
}

}  // namespace

TraceSummary summarize(const TraceReader& reader) {
  TraceSummary summary;
  std::error_code error;
  const auto size = std::filesystem::file_size(reader.file_name(), error);
  summary.file_bytes = error ? 0 : size;
  summary.attention = reader.attention_storage();
  return summary;
}

std::string reach_quantile(const LayerStats& layer, double share) {
  double cumulative = 0.0;
  for (std::size_t bin = 0; bin < kReachBins; ++bin) {
    cumulative += layer.reach[bin];
    if (cumulative >= share - 1e-12 && cumulative > 0.0) {
      return reach_bin_label(bin);
    }
  }
  return "-";
}

std::vector<std::pair<std::string, std::string>> describe_facts(const TraceReader& reader,
                                                                const TraceSummary& summary) {
  const TraceShape& shape = reader.shape();
  const config::TraceMeta& meta = reader.meta();
  return {{"format", "kvtier-attention-trace v1, producer " + reader.producer() + ", created " +
                         reader.created()},
          {"model", meta.model().name() + " (" + std::to_string(meta.model().num_hidden_layers()) +
                        " layers, " + std::to_string(shape.heads) + " heads, " +
                        std::to_string(shape.kv_heads) + " KV heads, vocabulary " +
                        std::to_string(shape.vocab_size) + ")"},
          {"prompt tokens", std::to_string(shape.prompt_tokens)},
          {"decode steps", std::to_string(shape.steps)},
          {"layers",
           std::to_string(shape.layers.first) + ".." + std::to_string(shape.layers.end() - 1)},
          {"granularities", granularities(shape)},
          {"attention dtype", std::string(config::dtype_name(meta.attention_dtype()))},
          {"source", source_text(meta)},
          {"file size", format_fixed(static_cast<double>(summary.file_bytes) / kMiB, 2) + " MiB"},
          {"attention data",
           format_fixed(static_cast<double>(summary.attention.logical_bytes) / kMiB, 2) +
               " MiB, stored in " +
               format_fixed(static_cast<double>(summary.attention.stored_bytes) / kMiB, 2) +
               " MiB (compression " + format_fixed(ratio(summary), 2) + "x)"}};
}

std::vector<std::vector<std::string>> layer_rows(const TraceStats& stats) {
  std::vector<std::vector<std::string>> rows;
  for (const LayerStats& layer : stats.layers) {
    rows.push_back({std::to_string(layer.layer), format_fixed(layer.sink_mass, 3),
                    format_fixed(layer.recent_mass, 3), format_fixed(layer.far_mass, 3),
                    format_fixed(layer.entropy_bits, 2),
                    format_fixed(layer.recency_decay_tokens, 1), reach_quantile(layer, 0.5),
                    reach_quantile(layer, 0.9), reach_quantile(layer, 0.99)});
  }
  return rows;
}

std::array<double, kReachBins> mean_reach(const TraceStats& stats) {
  std::array<double, kReachBins> reach{};
  for (const LayerStats& layer : stats.layers) {
    for (std::size_t bin = 0; bin < kReachBins; ++bin) {
      reach[bin] += layer.reach[bin] / static_cast<double>(stats.layers.size());
    }
  }
  return reach;
}

std::string describe_text(const TraceReader& reader, const TraceSummary& summary,
                          const TraceStats& stats, const StatsOptions& options) {
  const TraceShape& shape = reader.shape();
  const config::TraceMeta& meta = reader.meta();
  std::ostringstream out;
  out << "trace " << reader.file_name() << "\n\n";
  TextTable facts({"field", "value"});
  for (const auto& [field, value] : describe_facts(reader, summary)) {
    facts.add_row({field, value});
  }
  facts.render(out);
  if (meta.source().has_synthetic()) {
    const config::SyntheticAttention& p = meta.source().synthetic();
    out << "\nsynthetic parameters: sink_mass " << format_double(p.sink_mass()) << ", recency_mass "
        << format_double(p.recency_mass()) << ", recency_decay_tokens "
        << format_double(p.recency_decay_tokens()) << ", heavy_hitter_mass "
        << format_double(p.heavy_hitter_mass()) << ", reread_mass "
        << format_double(p.reread_mass()) << "\n";
  }
  out << "\nper-layer statistics over " << stats.steps.size() << " of " << shape.steps
      << " steps, from " << (stats.from_topk ? "top-k rows (masses are lower bounds)" : "mean rows")
      << "\n(sink: positions < " << options.sink_tokens << "; recent: distance < "
      << options.recent_window << "; far: distance >= " << options.far_distance
      << ", sinks excluded; reach: distance quantiles of non-sink weights >= "
      << format_double(options.reach_threshold) << ")\n\n";
  TextTable table(kLayerColumns, std::vector<bool>(kLayerColumns.size(), true));
  for (const auto& row : layer_rows(stats)) {
    table.add_row(row);
  }
  table.render(out);
  out << "\nreach histogram, mean over layers (share of non-sink weights >= "
      << format_double(options.reach_threshold) << " by distance):\n\n";
  TextTable histogram({"distance", "share"}, {true, true});
  const std::array<double, kReachBins> reach = mean_reach(stats);
  for (std::size_t bin = 0; bin < kReachBins; ++bin) {
    if (reach[bin] > 0.0) {
      histogram.add_row({reach_bin_label(bin), format_fixed(reach[bin], 4)});
    }
  }
  histogram.render(out);
  return out.str();
}

std::string describe_json(const TraceReader& reader, const TraceSummary& summary,
                          const TraceStats& stats, const StatsOptions& options) {
  const TraceShape& shape = reader.shape();
  std::ostringstream out;
  out << "{\"file\": " << json_escape(reader.file_name())
      << ", \"format\": \"kvtier-attention-trace\""
      << ", \"version\": 1, \"producer\": " << json_escape(reader.producer())
      << ", \"created\": " << json_escape(reader.created())
      << ",\n \"meta\": " << meta_json(reader.meta())
      << ",\n \"prompt_tokens\": " << shape.prompt_tokens << ", \"steps\": " << shape.steps
      << ", \"first_layer\": " << shape.layers.first << ", \"num_layers\": " << shape.layers.count
      << ", \"granularities\": " << json_escape(granularities(shape))
      << ",\n \"file_bytes\": " << summary.file_bytes
      << ", \"attention_logical_bytes\": " << summary.attention.logical_bytes
      << ", \"attention_stored_bytes\": " << summary.attention.stored_bytes
      << ", \"compression_ratio\": " << format_double(ratio(summary))
      << ",\n \"statistics\": {\"from\": " << (stats.from_topk ? "\"topk\"" : "\"mean\"")
      << ", \"sampled_steps\": " << stats.steps.size()
      << ", \"sink_tokens\": " << options.sink_tokens
      << ", \"recent_window\": " << options.recent_window
      << ", \"far_distance\": " << options.far_distance
      << ", \"reach_threshold\": " << format_double(options.reach_threshold)
      << ", \"reach_bins\": [";
  for (std::size_t bin = 0; bin < kReachBins; ++bin) {
    out << (bin == 0 ? "" : ", ") << json_escape(reach_bin_label(bin));
  }
  out << "],\n  \"layers\": [";
  for (std::size_t i = 0; i < stats.layers.size(); ++i) {
    const LayerStats& layer = stats.layers[i];
    out << (i == 0 ? "\n   " : ",\n   ") << "{\"layer\": " << layer.layer
        << ", \"rows\": " << layer.rows << ", \"sink_mass\": " << format_double(layer.sink_mass)
        << ", \"recent_mass\": " << format_double(layer.recent_mass)
        << ", \"far_mass\": " << format_double(layer.far_mass)
        << ", \"entropy_bits\": " << format_double(layer.entropy_bits)
        << ", \"recency_decay_tokens\": " << format_double(layer.recency_decay_tokens)
        << ", \"reach\": [";
    for (std::size_t bin = 0; bin < kReachBins; ++bin) {
      out << (bin == 0 ? "" : ", ") << format_double(layer.reach[bin]);
    }
    out << "]}";
  }
  out << "]}}\n";
  return out.str();
}

}  // namespace kvtier::traces
