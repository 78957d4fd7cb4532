#pragma once
// The attention tracer: a ForwardObserver that writes what the forward pass shows it as an
// attention trace (format v1, docs/TRACE_FORMAT.md), and capture_trace(), which runs a
// generation on an engine with the tracer attached (docs/ENGINE.md, "The tracer").
//
// Decode step t of a trace is the engine's (t+1)-th decode() call: it runs the token at position
// prompt + t (for t = 0 the token sampled from the prefill's logits, then the token sampled at
// step t - 1) and attends to positions 0 .. prompt + t. A capture of N steps therefore runs every
// generated token through decode(), the last one included, unlike generate(), which samples the
// last token without running it.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/trace.pb.h"
#include "kernels/engine.hpp"
#include "kernels/forward_observer.hpp"
#include "kernels/generate.hpp"
#include "traces/format.hpp"
#include "traces/writer.hpp"

namespace kvtier::kernels {

// What a trace records besides the tokens. It needs mean or top-k rows (or both).
struct TraceContents {
  bool mean = true;                    // /attention/mean: decode rows averaged over heads
  bool heads = false;                  // /attention/heads: every head's decode rows
  std::uint32_t top_k = 0;             // /attention/topk of K entries; 0: none
  std::uint32_t prefill_window = 0;    // /prefill/window of the last W prompt queries; 0: none
  bool key_norms = false;              // /keys/norm: L2 norm of every cached key
  config::DType dtype = config::FP16;  // storage of attention weights: FP16 or FP32
};

// How a trace was made, for its /meta.
struct TraceProvenance {
  SamplingOptions sampling;
  std::string tool;         // "kvtier 0.1.0 (commit …, CUDA off) trace capture"
  std::string description;  // the command line and where the prompt came from
};

// The /meta of a captured trace: every layer of `model`, source SOURCE_CAPTURED. Throws
// ConfigError when `contents` describes no trace (neither mean nor top-k rows, a dtype other
// than FP16/FP32) or a prefill window longer than the prompt.
[[nodiscard]] config::TraceMeta capture_meta(const config::ModelSpec& model,
                                             std::uint32_t prompt_tokens, std::uint32_t steps,
                                             const TraceContents& contents,
                                             const TraceProvenance& provenance);

// Writes the trace `meta` declares while an engine runs: attach it with Engine::set_observer,
// run the prompt as one prefill and then meta.steps() decode steps, and call finish() with the
// tokens. Rows stream to the TraceWriter as they come, so memory stays at one chunk per dataset
// plus the key norms (layers × KV heads × positions floats) and, with a prefill window, one
// layer's window (heads × W × prompt floats). Not copyable; one trace per tracer.
class AttentionTracer final : public ForwardObserver {
 public:
  // Creates the file (under a temporary name until finish()); DataError when `meta` is not a
  // trace description.
  AttentionTracer(const std::filesystem::path& path, config::TraceMeta meta,
                  traces::WriterOptions options = {});
  AttentionTracer(const AttentionTracer&) = delete;
  AttentionTracer& operator=(const AttentionTracer&) = delete;
  AttentionTracer(AttentionTracer&&) = delete;
  AttentionTracer& operator=(AttentionTracer&&) = delete;
  ~AttentionTracer() override;

  // Throw std::logic_error when the engine's calls do not fit the declared trace (a decode step
  // out of order or past the declared steps, a prompt query past the prompt, a model of another
  // shape): the caller drove the engine differently from what /meta says.
  void on_key_value(const KeyValueWrite& write) override;
  void on_attention(const AttentionStep& step) override;

  // Decode steps that every layer has completed.
  [[nodiscard]] std::uint32_t steps_done() const noexcept;
  [[nodiscard]] const traces::TraceShape& shape() const noexcept;

  // Writes the tokens (prompt + steps ids) and key norms, checks that every declared row was
  // written, and renames the file into place. std::logic_error when steps are missing.
  void finish(std::span<const std::int32_t> tokens);

 private:
  void record_prefill_window(const AttentionStep& step);
  void record_decode_step(const AttentionStep& step);
  void write_topk(std::uint32_t layer, std::span<const float> mean_row);

  traces::TraceWriter writer_;
  traces::TraceShape shape_;
  std::vector<std::uint32_t> layer_steps_;  // decode rows each layer received
  std::vector<float> key_norms_;            // [layer][kv_head][position]
  std::vector<float> window_;               // [head][W][prompt]: the layer being filled
  int window_layer_ = -1;                   // its model layer; -1 when none is being filled
  // Scratch reused by every step, so decoding allocates nothing once rows stop growing.
  std::vector<float> mean_;
  std::vector<float> heads_;
  std::vector<std::uint32_t> order_;
  std::vector<std::int32_t> topk_indices_;
  std::vector<float> topk_weights_;
};

struct CaptureProgress {
  enum class Phase { kGenerating, kTracing };
  Phase phase = Phase::kTracing;
  int tokens_done = 0;   // tokens generated (kGenerating) or decode steps traced (kTracing)
  int tokens_total = 0;  // the most this phase will do
  double seconds = 0.0;  // since the phase began
  // The trace being written (its temporary name), while tracing; empty before.
  std::filesystem::path partial_file;
};

struct CaptureOptions {
  // max_new_tokens: the most decode steps; stop tokens end the trace after running the stop
  // token (it is the trace's last step).
  GenerationOptions generation;
  TraceContents contents;
  std::string tool;
  std::string description;
  traces::WriterOptions writer;
  // Called after every generated or traced token (may be empty).
  std::function<void(const CaptureProgress&)> progress;
};

struct CaptureResult {
  GenerationResult generation;  // prompt + every token the trace ran (= its /tokens)
  std::uint32_t steps = 0;      // decode steps in the trace: the generated tokens
  bool two_passes = false;      // the tokens were generated first, then traced
};

// Generates up to max_new_tokens tokens after `prompt` and writes their trace to `path`.
//
// The writer needs the step count before the first row, and a stop token can end a run early.
// So when stop tokens are given the tokens are generated first without the tracer (the same
// generate() call a plain run makes), and then the prompt and those tokens are run again with
// the tracer attached, teacher-forced: every row streams to disk and memory stays bounded, at
// the price of a second forward pass. Without stop tokens the step count is max_new_tokens and
// the trace is written in the same pass that samples the tokens.
//
// Needs prompt + max_new_tokens positions (one more than generate(), whose last token is not
// run): DataError when the prompt alone fills the model's positions, ConfigError when the new
// tokens do not fit after it or max_new_tokens < 1. The engine's observer is detached on return.
CaptureResult capture_trace(Engine& engine, std::span<const std::int32_t> prompt,
                            const CaptureOptions& options, const std::filesystem::path& path);

}  // namespace kvtier::kernels
