// The attention tracer and the capture loop (kernels/tracer.hpp, docs/ENGINE.md "The tracer").
#include "kernels/tracer.hpp"

#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "common/temporary_file.hpp"
#include "kernels/sampler.hpp"
#include "traces/meta.hpp"

namespace kvtier::kernels {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void misuse(const std::string& what) {
  throw std::logic_error("attention tracer: " + what);
}

// Detaches whatever observer the capture attached, also when an exception leaves it.
class ObserverScope {
 public:
  explicit ObserverScope(Engine& engine) : engine_(engine) {}
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;
  ObserverScope(ObserverScope&&) = delete;
  ObserverScope& operator=(ObserverScope&&) = delete;
  ~ObserverScope() { engine_.set_observer(nullptr); }

 private:
  Engine& engine_;
};

// Reports progress during the untraced generation of a two-pass capture: generate() has no
// callback of its own, but it runs the engine, whose observer sees each decode step.
class GenerationProgress final : public ForwardObserver {
 public:
  GenerationProgress(std::function<void(const CaptureProgress&)> report, int prompt_tokens,
                     int max_new_tokens, int last_layer)
      : report_(std::move(report)),
        prompt_tokens_(prompt_tokens),
        last_layer_(last_layer),
        start_(Clock::now()) {
    progress_.phase = CaptureProgress::Phase::kGenerating;
    progress_.tokens_total = max_new_tokens;
  }

  void on_attention(const AttentionStep& step) override {
    if (step.layer == last_layer_ && step.query_position >= prompt_tokens_) {
      progress_.tokens_done = step.query_position - prompt_tokens_ + 1;
      progress_.seconds = seconds_since(start_);
      report_(progress_);
    }
  }

 private:
  std::function<void(const CaptureProgress&)> report_;
  int prompt_tokens_;
  int last_layer_;
  Clock::time_point start_;
  CaptureProgress progress_;
};

}  // namespace

config::TraceMeta capture_meta(const config::ModelSpec& model, std::uint32_t prompt_tokens,
                               std::uint32_t steps, const TraceContents& contents,
                               const TraceProvenance& provenance) {
  if (!contents.mean && contents.top_k == 0) {
    throw ConfigError("a trace needs mean or top-k rows (per-head rows alone are not a trace)");
  }
  if (contents.dtype != config::FP16 && contents.dtype != config::FP32) {
    throw ConfigError("attention weights are stored as FP16 or FP32");
  }
  if (contents.top_k > traces::kMaxTopK) {
    throw ConfigError("top-k rows of " + std::to_string(contents.top_k) + " entries: at most " +
                      std::to_string(traces::kMaxTopK));
  }
  if (contents.prefill_window > prompt_tokens) {
    throw ConfigError("a prefill window of " + std::to_string(contents.prefill_window) +
                      " queries is longer than the " + std::to_string(prompt_tokens) +
                      "-token prompt");
  }
  config::TraceMeta meta;
  *meta.mutable_model() = model;
  meta.set_prompt_tokens(prompt_tokens);
  meta.set_steps(steps);
  meta.set_first_layer(0);
  meta.set_num_layers(model.num_hidden_layers());
  if (contents.mean) {
    meta.add_granularities(config::GRANULARITY_MEAN);
  }
  if (contents.heads) {
    meta.add_granularities(config::GRANULARITY_HEADS);
  }
  if (contents.top_k > 0) {
    meta.add_granularities(config::GRANULARITY_TOP_K);
    meta.set_top_k(contents.top_k);
  }
  if (contents.prefill_window > 0) {
    meta.add_granularities(config::GRANULARITY_PREFILL_WINDOW);
    meta.set_prefill_window(contents.prefill_window);
  }
  if (contents.key_norms) {
    meta.add_granularities(config::GRANULARITY_KEY_NORMS);
  }
  meta.set_attention_dtype(contents.dtype);
  *meta.mutable_sampling() = sampling_record(provenance.sampling);
  config::TraceSource& source = *meta.mutable_source();
  source.set_kind(config::SOURCE_CAPTURED);
  source.set_tool(provenance.tool);
  if (!provenance.description.empty()) {
    source.set_description(provenance.description);
  }
  return meta;
}

AttentionTracer::AttentionTracer(const std::filesystem::path& path, config::TraceMeta meta,
                                 traces::WriterOptions options)
    : writer_(path, std::move(meta), std::move(options)), shape_(writer_.shape()) {
  layer_steps_.assign(shape_.layers.count, 0);
  if (shape_.has_key_norms) {
    key_norms_.assign(
        static_cast<std::size_t>(shape_.layers.count) * shape_.kv_heads * shape_.tokens(), 0.0F);
  }
  if (shape_.has_prefill) {
    window_.assign(
        static_cast<std::size_t>(shape_.heads) * shape_.prefill_window * shape_.prompt_tokens,
        0.0F);
  }
  // Rows grow to tokens() weights; reserving now keeps the decode loop free of allocations.
  mean_.reserve(shape_.tokens());
  order_.reserve(shape_.has_topk ? shape_.tokens() : 0);
}

AttentionTracer::~AttentionTracer() = default;

std::uint32_t AttentionTracer::steps_done() const noexcept {
  return layer_steps_.empty() ? 0 : *std::min_element(layer_steps_.begin(), layer_steps_.end());
}

const traces::TraceShape& AttentionTracer::shape() const noexcept {
  return shape_;
}

void AttentionTracer::on_key_value(const KeyValueWrite& write) {
  if (!shape_.has_key_norms) {
    return;
  }
  const auto layer = static_cast<std::uint32_t>(write.layer);
  const auto position = static_cast<std::uint64_t>(write.position);
  if (write.layer < 0 || !shape_.has_layer(layer) || write.position < 0 ||
      position >= shape_.tokens() ||
      static_cast<std::uint32_t>(write.kv_heads) != shape_.kv_heads ||
      write.keys.size() != static_cast<std::size_t>(write.kv_heads) * write.head_dim) {
    misuse("key of layer " + std::to_string(write.layer) + " at position " +
           std::to_string(write.position) + " is outside the declared trace");
  }
  const auto dim = static_cast<std::size_t>(write.head_dim);
  const std::uint64_t tokens = shape_.tokens();
  float* norms = key_norms_.data() +
                 static_cast<std::size_t>(layer - shape_.layers.first) * shape_.kv_heads * tokens;
  for (std::uint32_t head = 0; head < shape_.kv_heads; ++head) {
    const Eigen::Map<const Eigen::VectorXf> key(write.keys.data() + head * dim,
                                                static_cast<Eigen::Index>(dim));
    norms[head * tokens + position] = key.norm();
  }
}

void AttentionTracer::on_attention(const AttentionStep& step) {
  const auto layer = static_cast<std::uint32_t>(step.layer);
  if (step.layer < 0 || !shape_.has_layer(layer) ||
      static_cast<std::uint32_t>(step.query_heads) != shape_.heads ||
      step.first_key_position + step.key_count != step.query_position + 1) {
    misuse("attention of layer " + std::to_string(step.layer) + " at position " +
           std::to_string(step.query_position) + " does not fit the declared model");
  }
  // Queries are told apart by position, not by the engine call: positions before
  // prompt_tokens are the prompt, the others decode steps (a prefill of forced tokens past the
  // prompt gives the same causal attention as decoding them one by one).
  if (static_cast<std::uint32_t>(step.query_position) < shape_.prompt_tokens) {
    if (shape_.has_prefill) {
      record_prefill_window(step);
    }
    return;
  }
  record_decode_step(step);
}

void AttentionTracer::record_prefill_window(const AttentionStep& step) {
  const std::uint32_t prompt = shape_.prompt_tokens;
  const std::uint32_t window = shape_.prefill_window;
  const auto query = static_cast<std::uint32_t>(step.query_position);
  if (query < prompt - window) {
    return;
  }
  // One layer's window is buffered at a time (heads × W × prompt can be large); the writer
  // takes it whole, and one prefill call runs each layer's queries together.
  if (window_layer_ != -1 && window_layer_ != step.layer) {
    misuse("prefill window queries of layer " + std::to_string(step.layer) +
           " arrived while layer " + std::to_string(window_layer_) +
           " was incomplete (run the prompt as one prefill)");
  }
  window_layer_ = step.layer;
  const std::uint32_t row = query - (prompt - window);
  for (std::uint32_t head = 0; head < shape_.heads; ++head) {
    const std::span<const float> weights = step.head_probabilities(static_cast<int>(head));
    // Positions before a sliding window and after the query stay zero.
    float* out = window_.data() + (static_cast<std::size_t>(head) * window + row) * prompt +
                 step.first_key_position;
    std::copy(weights.begin(), weights.end(), out);
  }
  if (query + 1 == prompt) {
    writer_.write_prefill_window(static_cast<std::uint32_t>(step.layer), window_);
    std::fill(window_.begin(), window_.end(), 0.0F);
    window_layer_ = -1;
  }
}

void AttentionTracer::record_decode_step(const AttentionStep& step) {
  const auto layer = static_cast<std::uint32_t>(step.layer);
  std::uint32_t& done = layer_steps_[layer - shape_.layers.first];
  const std::uint64_t t = static_cast<std::uint64_t>(step.query_position) - shape_.prompt_tokens;
  if (t != done || t >= shape_.steps) {
    misuse("layer " + std::to_string(layer) + " received decode step " + std::to_string(t) +
           " after " + std::to_string(done) + " of " + std::to_string(shape_.steps) + " steps");
  }
  const auto heads = static_cast<Eigen::Index>(shape_.heads);
  const auto row_length = static_cast<std::size_t>(step.query_position) + 1;
  const auto first = static_cast<std::size_t>(step.first_key_position);
  const auto keys = static_cast<Eigen::Index>(step.key_count);
  if (shape_.has_mean || shape_.has_topk) {
    // The head mean in float: the rows of the [heads × keys] probabilities added one after
    // another (contiguous, vectorised), then scaled once.
    mean_.resize(row_length);
    std::fill_n(mean_.begin(), first, 0.0F);  // before a sliding window
    Eigen::Map<Eigen::VectorXf> mean(mean_.data() + first, keys);
    mean = Eigen::Map<const Eigen::VectorXf>(step.probabilities.data(), keys);
    for (Eigen::Index head = 1; head < heads; ++head) {
      mean += Eigen::Map<const Eigen::VectorXf>(step.probabilities.data() + head * keys, keys);
    }
    mean *= 1.0F / static_cast<float>(heads);
    if (shape_.has_mean) {
      writer_.append_mean_row(layer, mean_);
    }
    if (shape_.has_topk) {
      write_topk(layer, mean_);
    }
  }
  if (shape_.has_heads) {
    if (first == 0) {
      writer_.append_head_rows(layer, step.probabilities);
    } else {  // a sliding window: zeros before it
      heads_.assign(static_cast<std::size_t>(heads) * row_length, 0.0F);
      for (Eigen::Index head = 0; head < heads; ++head) {
        const std::span<const float> weights = step.head_probabilities(static_cast<int>(head));
        std::copy(weights.begin(), weights.end(),
                  heads_.begin() + static_cast<std::ptrdiff_t>(
                                       static_cast<std::size_t>(head) * row_length + first));
      }
      writer_.append_head_rows(layer, heads_);
    }
  }
  ++done;
}

// The K largest weights in decreasing order (ties: lower position first), padded with
// kTopKPadIndex and 0 when the row is shorter, and the mass of every other position.
void AttentionTracer::write_topk(std::uint32_t layer, std::span<const float> mean_row) {
  const std::size_t k = shape_.top_k;
  const std::size_t n = mean_row.size();
  const std::size_t kept = std::min(k, n);
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0U);
  const auto heavier = [&](std::uint32_t a, std::uint32_t b) {
    return mean_row[a] != mean_row[b] ? mean_row[a] > mean_row[b] : a < b;
  };
  const auto cut = order_.begin() + static_cast<std::ptrdiff_t>(kept);
  // Selection is O(n) and sorting the K kept entries O(K log K): far cheaper than sorting a
  // row of thousands of positions for K of a few dozen.
  std::nth_element(order_.begin(), cut, order_.end(), heavier);
  std::sort(order_.begin(), cut, heavier);
  topk_indices_.assign(k, traces::kTopKPadIndex);
  topk_weights_.assign(k, 0.0F);
  for (std::size_t i = 0; i < kept; ++i) {
    topk_indices_[i] = static_cast<std::int32_t>(order_[i]);
    topk_weights_[i] = mean_row[order_[i]];
  }
  double residual = 0.0;
  for (auto it = cut; it != order_.end(); ++it) {
    residual += mean_row[*it];
  }
  writer_.append_topk_row(layer, topk_indices_, topk_weights_, static_cast<float>(residual));
}

void AttentionTracer::finish(std::span<const std::int32_t> tokens) {
  for (std::uint32_t i = 0; i < shape_.layers.count; ++i) {
    if (layer_steps_[i] != shape_.steps) {
      misuse("layer " + std::to_string(shape_.layers.first + i) + " has " +
             std::to_string(layer_steps_[i]) + " of the " + std::to_string(shape_.steps) +
             " declared decode steps");
    }
  }
  if (window_layer_ != -1) {
    misuse("the prefill window of layer " + std::to_string(window_layer_) + " is incomplete");
  }
  if (tokens.size() != shape_.tokens()) {
    misuse(std::to_string(tokens.size()) + " tokens for a trace of " +
           std::to_string(shape_.tokens()) + " positions");
  }
  writer_.write_tokens(tokens);
  if (shape_.has_key_norms) {
    const std::size_t per_layer = static_cast<std::size_t>(shape_.kv_heads) * shape_.tokens();
    for (std::uint32_t i = 0; i < shape_.layers.count; ++i) {
      writer_.write_key_norms(shape_.layers.first + i,
                              std::span<const float>(key_norms_).subspan(i * per_layer, per_layer));
    }
  }
  writer_.finish();
}

CaptureResult capture_trace(Engine& engine, std::span<const std::int32_t> prompt,
                            const CaptureOptions& options, const std::filesystem::path& path) {
  const config::ModelSpec& spec = engine.spec();
  const int new_tokens = options.generation.max_new_tokens;
  if (new_tokens < 1) {
    throw ConfigError("a trace needs at least one new token (max_new_tokens >= 1)");
  }
  if (prompt.empty()) {
    throw ConfigError("the prompt needs at least one token");
  }
  const std::int64_t positions = spec.max_position_embeddings();
  const auto prompt_tokens = static_cast<std::int64_t>(prompt.size());
  if (prompt_tokens >= positions) {
    throw DataError("the prompt's " + std::to_string(prompt_tokens) +
                        " tokens leave no position for a decode step in the model's " +
                        std::to_string(positions) + " (max_position_embeddings)",
                    spec.name());
  }
  if (prompt_tokens + new_tokens > positions) {
    throw ConfigError(std::to_string(new_tokens) + " new tokens after a " +
                          std::to_string(prompt_tokens) + "-token prompt pass the model's " +
                          std::to_string(positions) +
                          " positions (max_position_embeddings); at most " +
                          std::to_string(positions - prompt_tokens) + " fit",
                      spec.name());
  }
  const TraceProvenance provenance{options.generation.sampling, options.tool, options.description};
  // Checked before any work — the contents, the sampling options, then every rule of the schema
  // the writer applies — so that a bad capture fails at once, not after a long generation pass.
  const config::TraceMeta planned =
      capture_meta(spec, static_cast<std::uint32_t>(prompt_tokens),
                   static_cast<std::uint32_t>(new_tokens), options.contents, provenance);
  Sampler sampler(options.generation.sampling);
  static_cast<void>(traces::checked_shape(planned, path.string() + ", /meta"));
  // Before the guard, so that it detaches the engine (pending CUDA deliveries) before they go.
  std::optional<GenerationProgress> generation_progress;
  std::optional<AttentionTracer> tracer;
  const ObserverScope detach(engine);

  CaptureResult result;
  std::vector<std::int32_t> forced;  // tokens generated before tracing (two passes)
  if (!options.generation.stop_tokens.empty()) {
    if (options.progress) {
      generation_progress.emplace(options.progress, static_cast<int>(prompt_tokens), new_tokens,
                                  static_cast<int>(spec.num_hidden_layers()) - 1);
    }
    engine.set_observer(generation_progress ? &*generation_progress : nullptr);
    result.generation = generate(engine, prompt, options.generation);
    engine.set_observer(nullptr);
    const auto generated = result.generation.generated();
    forced.assign(generated.begin(), generated.end());
    result.two_passes = true;
  }
  const auto steps = static_cast<std::uint32_t>(result.two_passes ? forced.size() : new_tokens);

  tracer.emplace(path,
                 capture_meta(spec, static_cast<std::uint32_t>(prompt_tokens), steps,
                              options.contents, provenance),
                 options.writer);
  CaptureProgress progress;
  progress.phase = CaptureProgress::Phase::kTracing;
  progress.tokens_total = static_cast<int>(steps);
  // The writer's temporary name (docs/TRACE_FORMAT.md): FILE.tmp.PID.
  progress.partial_file = output_target(path).string() + ".tmp." + std::to_string(::getpid());
  const Clock::time_point start = Clock::now();

  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  tokens.reserve(tokens.size() + steps);
  engine.reset();
  engine.reserve(static_cast<int>(prompt_tokens) + static_cast<int>(steps));
  engine.set_observer(&*tracer);
  std::span<const float> logits = engine.prefill(prompt);
  for (std::uint32_t step = 0; step < steps; ++step) {
    // Step t runs the token sampled from the previous logits (the prefill's for t = 0).
    const std::int32_t token = result.two_passes ? forced[step] : sampler.sample(logits);
    tokens.push_back(token);
    logits = engine.decode(token);
    if (options.progress) {  // the clock is read only for a progress report
      progress.tokens_done = static_cast<int>(step) + 1;
      progress.seconds = seconds_since(start);
      options.progress(progress);
    }
  }
  engine.set_observer(nullptr);
  tracer->finish(tokens);

  if (!result.two_passes) {
    result.generation.prompt_tokens = static_cast<int>(prompt_tokens);
  }
  result.generation.tokens = std::move(tokens);
  result.steps = steps;
  return result;
}

}  // namespace kvtier::kernels
