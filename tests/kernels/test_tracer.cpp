// The attention tracer writes what the forward pass computed: rows recomputed independently
// from the cached keys and the queries (softmax(q·k/√d) in double, averaged over heads) match
// the stored ones; top-k rows are the K largest of the mean row; the prefill window and key
// norms hold what they should; capture_trace's tokens are generate()'s, stop tokens end the
// trace with the right step count, and the files pass `trace validate`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/tokenizer.hpp"
#include "kernels/tracer.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "traces/reader.hpp"
#include "traces/validate.hpp"

namespace kk = kvtier::kernels;
using kvtier::kernels::testing::stories_model;
namespace kt = kvtier::traces;
namespace fs = std::filesystem;

namespace {

std::vector<std::int32_t> stories_prompt() {
  return kk::testing::stories_prompt("Once upon a time, there was a little");
}

// Passes everything on to the tracer and keeps a copy of every key and query, by (layer,
// position), for the independent recomputation.
class Recorder final : public kk::ForwardObserver {
 public:
  explicit Recorder(kk::ForwardObserver& next) : next_(next) {}

  void on_key_value(const kk::KeyValueWrite& write) override {
    keys[{write.layer, write.position}] = {write.keys.begin(), write.keys.end()};
    head_dim = write.head_dim;
    kv_heads = write.kv_heads;
    next_.on_key_value(write);
  }
  void on_attention(const kk::AttentionStep& step) override {
    queries[{step.layer, step.query_position}] = {step.queries.begin(), step.queries.end()};
    first_key[{step.layer, step.query_position}] = step.first_key_position;
    heads = step.query_heads;
    next_.on_attention(step);
  }

  // Head `head`'s attention of the query at `position` over positions 0 .. position (zero
  // before a sliding window), from scratch in double.
  [[nodiscard]] std::vector<double> attention(int layer, int position, int head) const {
    const std::vector<float>& q = queries.at({layer, position});
    const int first = first_key.at({layer, position});
    const int kv_head = head / (heads / kv_heads);
    std::vector<double> scores(static_cast<std::size_t>(position) + 1, 0.0);
    double largest = -1e300;
    for (int key = first; key <= position; ++key) {
      const std::vector<float>& k = keys.at({layer, key});
      double dot = 0.0;
      for (int i = 0; i < head_dim; ++i) {
        dot += static_cast<double>(q[static_cast<std::size_t>(head * head_dim + i)]) *
               k[static_cast<std::size_t>(kv_head * head_dim + i)];
      }
      scores[static_cast<std::size_t>(key)] = dot / std::sqrt(static_cast<double>(head_dim));
      largest = std::max(largest, scores[static_cast<std::size_t>(key)]);
    }
    double total = 0.0;
    for (int key = first; key <= position; ++key) {
      auto& score = scores[static_cast<std::size_t>(key)];
      score = std::exp(score - largest);
      total += score;
    }
    for (int key = first; key <= position; ++key) {
      scores[static_cast<std::size_t>(key)] /= total;
    }
    return scores;
  }

  [[nodiscard]] std::vector<double> mean_attention(int layer, int position) const {
    std::vector<double> mean(static_cast<std::size_t>(position) + 1, 0.0);
    for (int head = 0; head < heads; ++head) {
      const std::vector<double> row = attention(layer, position, head);
      for (std::size_t i = 0; i < row.size(); ++i) {
        mean[i] += row[i] / heads;
      }
    }
    return mean;
  }

  std::map<std::pair<int, int>, std::vector<float>> keys;
  std::map<std::pair<int, int>, std::vector<float>> queries;
  std::map<std::pair<int, int>, int> first_key;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;

 private:
  kk::ForwardObserver& next_;
};

// Stored weights against recomputed ones: FP32 keeps the engine's float rounding only; FP16
// rounds each weight to 11 significant bits (relative 2^-11, absolute 2^-25 for subnormals).
void check_row(std::span<const float> stored, const std::vector<double>& expected,
               kvtier::config::DType dtype) {
  REQUIRE(stored.size() == expected.size());
  const double relative = dtype == kvtier::config::FP16 ? 1.0 / 2048 : 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("position " << i);
    CHECK(stored[i] == Approx(expected[i]).epsilon(relative).margin(2e-6));
  }
}

kk::TraceProvenance provenance() {
  return {kk::SamplingOptions::greedy(), "kvtier test", "test_tracer"};
}

kt::WriterOptions fixed_writer() {
  kt::WriterOptions options;
  options.created = "2026-01-01T00:00:00Z";  // so that two writes can be compared byte for byte
  options.producer = "kvtier test";
  return options;
}

// Runs `prompt` as one prefill, then `steps` greedy decode steps with `observer` attached, as
// the capture loop does; returns prompt + the tokens run.
std::vector<std::int32_t> run_greedy(kk::Engine& engine, std::span<const std::int32_t> prompt,
                                     int steps, kk::ForwardObserver& observer) {
  engine.reset();
  engine.set_observer(&observer);
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  std::span<const float> logits = engine.prefill(prompt);
  for (int step = 0; step < steps; ++step) {
    tokens.push_back(kk::argmax(logits));
    logits = engine.decode(tokens.back());
  }
  engine.set_observer(nullptr);
  return tokens;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("stored rows equal attention recomputed from the cached keys and queries",
          "[kernels][tracer]") {
  const auto dtype = GENERATE(kvtier::config::FP32, kvtier::config::FP16);
  INFO("dtype " << kvtier::config::DType_Name(dtype));
  const kk::testing::TempDir temp("tracer-rows");
  const fs::path file = temp.path() / "trace.h5";
  const auto engine = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> prompt = stories_prompt();
  const auto prompt_tokens = static_cast<std::uint32_t>(prompt.size());
  constexpr std::uint32_t kSteps = 24;
  constexpr std::uint32_t kTopK = 6;
  constexpr std::uint32_t kWindow = 4;
  kk::TraceContents contents;
  contents.heads = true;
  contents.top_k = kTopK;
  contents.prefill_window = kWindow;
  contents.key_norms = true;
  contents.dtype = dtype;
  kk::AttentionTracer tracer(
      file, kk::capture_meta(stories_model()->spec, prompt_tokens, kSteps, contents, provenance()));
  Recorder recorder(tracer);
  const std::vector<std::int32_t> tokens = run_greedy(*engine, prompt, kSteps, recorder);
  CHECK(tracer.steps_done() == kSteps);
  CHECK_FALSE(fs::exists(file));  // under its temporary name until finish()
  tracer.finish(tokens);
  REQUIRE(fs::exists(file));
  const kt::ValidationReport report = kt::validate_trace(file);
  CHECK(report.valid());
  const kt::TraceReader reader(file);
  const kt::TraceShape& shape = reader.shape();
  CHECK(shape.prompt_tokens == prompt_tokens);
  CHECK(shape.steps == kSteps);
  CHECK(reader.read_tokens() == tokens);
  CHECK(reader.meta().source().kind() == kvtier::config::SOURCE_CAPTURED);

  kt::DenseRows mean;
  kt::HeadRows heads;
  kt::TopKRows topk;
  for (std::uint32_t layer = 0; layer < 5; ++layer) {
    reader.read_mean(layer, {0, kSteps}, mean);
    reader.read_heads(layer, {0, kSteps}, heads);
    reader.read_topk(layer, {0, kSteps}, topk);
    for (const std::uint32_t step : {0U, 1U, 11U, kSteps - 1}) {
      INFO("layer " << layer << ", step " << step);
      // Step t runs the token at position prompt + t: its row has prompt + t + 1 weights.
      const int position = static_cast<int>(prompt_tokens + step);
      REQUIRE(mean.row(step).size() == prompt_tokens + step + 1);
      check_row(mean.row(step), recorder.mean_attention(static_cast<int>(layer), position), dtype);
      for (std::uint32_t head = 0; head < 8; ++head) {
        check_row(heads.row(head, step),
                  recorder.attention(static_cast<int>(layer), position, static_cast<int>(head)),
                  dtype);
      }
    }
    // Top-k: the K heaviest entries of the stored mean row, heaviest first, and the rest as
    // the residual. Rounding to FP16 keeps order (a <= b stays so), ties aside.
    for (std::uint32_t step = 0; step < kSteps; ++step) {
      INFO("layer " << layer << ", top-k step " << step);
      const std::span<const float> row = mean.row(step);
      const auto first = static_cast<std::size_t>(step) * kTopK;
      std::vector<bool> chosen(row.size(), false);
      double kept = 0.0;
      for (std::size_t i = 0; i < kTopK; ++i) {
        const std::int32_t index = topk.indices[first + i];
        REQUIRE(index >= 0);
        REQUIRE(static_cast<std::size_t>(index) < row.size());
        CHECK_FALSE(chosen[static_cast<std::size_t>(index)]);
        chosen[static_cast<std::size_t>(index)] = true;
        CHECK(topk.weights[first + i] == row[static_cast<std::size_t>(index)]);
        if (i > 0) {
          CHECK(topk.weights[first + i] <= topk.weights[first + i - 1]);
        }
        kept += topk.weights[first + i];
      }
      const float lightest_kept = topk.weights[first + kTopK - 1];
      double rest = 0.0;
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (!chosen[i]) {
          CHECK(row[i] <= lightest_kept);
          rest += row[i];
        }
      }
      const double tolerance = dtype == kvtier::config::FP16 ? 2e-3 : 1e-5;
      CHECK(topk.residual[step] == Approx(rest).margin(tolerance));
      CHECK(kept + topk.residual[step] == Approx(1.0).margin(tolerance));
    }
    // Prefill window: query i is prompt position prompt - W + i; zeros after it.
    const std::vector<float> window = reader.read_prefill_window(layer);
    REQUIRE(window.size() == 8U * kWindow * prompt_tokens);
    for (std::uint32_t head = 0; head < 8; ++head) {
      for (std::uint32_t i = 0; i < kWindow; ++i) {
        const std::uint32_t query = prompt_tokens - kWindow + i;
        INFO("layer " << layer << ", window head " << head << ", query " << query);
        const std::span<const float> stored(
            window.data() + (static_cast<std::size_t>(head) * kWindow + i) * prompt_tokens,
            prompt_tokens);
        check_row(stored.first(query + 1),
                  recorder.attention(static_cast<int>(layer), static_cast<int>(query),
                                     static_cast<int>(head)),
                  dtype);
        for (std::uint32_t p = query + 1; p < prompt_tokens; ++p) {
          CHECK(stored[p] == 0.0F);
        }
      }
    }
    // Key norms: every position, prompt and decode steps alike.
    const std::vector<float> norms = reader.read_key_norms(layer);
    const std::size_t positions = prompt_tokens + kSteps;
    REQUIRE(norms.size() == 4 * positions);
    for (std::size_t kv = 0; kv < 4; ++kv) {
      for (std::size_t p = 0; p < positions; ++p) {
        const std::vector<float>& key =
            recorder.keys.at({static_cast<int>(layer), static_cast<int>(p)});
        double squares = 0.0;
        for (std::size_t i = 0; i < 8; ++i) {
          squares += static_cast<double>(key[kv * 8 + i]) * key[kv * 8 + i];
        }
        CHECK(norms[kv * positions + p] == Approx(std::sqrt(squares)).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("capture_trace runs generate()'s tokens, each through a decode step",
          "[kernels][tracer]") {
  const kk::testing::TempDir temp("tracer-capture");
  const auto engine = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> prompt = stories_prompt();
  kk::GenerationOptions greedy;
  greedy.max_new_tokens = 40;
  const kk::GenerationResult expected = kk::generate(*engine, prompt, greedy);
  REQUIRE(expected.generated().size() == 40);

  kk::CaptureOptions options;
  options.generation = greedy;
  options.contents.key_norms = true;
  options.writer = fixed_writer();
  options.tool = "kvtier test";
  int last_progress = 0;
  options.progress = [&](const kk::CaptureProgress& progress) {
    CHECK(progress.phase == kk::CaptureProgress::Phase::kTracing);
    CHECK(progress.tokens_done == last_progress + 1);
    CHECK(progress.tokens_total == 40);
    last_progress = progress.tokens_done;
  };
  const fs::path one_pass = temp.path() / "one_pass.h5";
  const kk::CaptureResult result = kk::capture_trace(*engine, prompt, options, one_pass);
  CHECK(last_progress == 40);
  CHECK_FALSE(result.two_passes);
  CHECK(result.steps == 40);
  CHECK(result.generation.tokens == expected.tokens);
  CHECK(result.generation.prompt_tokens == static_cast<int>(prompt.size()));
  CHECK(engine->position() == static_cast<int>(prompt.size()) + 40);  // the last token ran too
  {
    const kt::TraceReader reader(one_pass);
    CHECK(reader.read_tokens() == expected.tokens);
    CHECK(reader.shape().steps == 40);
    CHECK(reader.meta().sampling().temperature() == 0.0);
    CHECK(reader.meta().source().tool() == "kvtier test");
    // The key of the last generated token is there: it ran through a decode step.
    CHECK(reader.read_key_norms(0).back() > 0.0F);
  }
  CHECK(kt::validate_trace(one_pass).valid());

  SECTION("a stop token that never comes: two passes, the same file byte for byte") {
    std::int32_t absent = 0;
    while (std::find(expected.tokens.begin(), expected.tokens.end(), absent) !=
           expected.tokens.end()) {
      ++absent;
    }
    options.generation.stop_tokens = {absent};
    int generating = 0;
    options.progress = [&](const kk::CaptureProgress& progress) {
      generating += progress.phase == kk::CaptureProgress::Phase::kGenerating ? 1 : 0;
    };
    const fs::path two_passes = temp.path() / "two_passes.h5";
    const kk::CaptureResult again = kk::capture_trace(*engine, prompt, options, two_passes);
    CHECK(again.two_passes);
    CHECK(generating == 39);  // generate() runs 39 decode steps; its last token is not run
    CHECK_FALSE(again.generation.stopped);
    CHECK(again.generation.tokens == expected.tokens);
    CHECK(slurp(two_passes) == slurp(one_pass));
  }

  SECTION("a stop token ends the trace after the step that runs it") {
    // The 13th generated token, at its first occurrence, becomes the stop token.
    const std::int32_t stop = expected.generated()[12];
    const auto at = static_cast<std::size_t>(
        std::find(expected.generated().begin(), expected.generated().end(), stop) -
        expected.generated().begin());
    options.generation.stop_tokens = {stop};
    options.generation.max_new_tokens = 100;
    options.contents.top_k = 4;
    options.contents.heads = true;
    options.progress = nullptr;
    const fs::path stopped = temp.path() / "stopped.h5";
    const kk::CaptureResult early = kk::capture_trace(*engine, prompt, options, stopped);
    kk::GenerationOptions stopping = greedy;
    stopping.max_new_tokens = 100;
    stopping.stop_tokens = {stop};
    const kk::GenerationResult plain = kk::generate(*engine, prompt, stopping);
    CHECK(early.two_passes);
    CHECK(early.generation.stopped);
    CHECK(early.generation.tokens == plain.tokens);
    CHECK(early.steps == at + 1);
    CHECK(early.generation.tokens.back() == stop);
    const kt::TraceReader reader(stopped);
    CHECK(reader.shape().steps == at + 1);
    CHECK(reader.meta().steps() == at + 1);
    CHECK(reader.read_tokens() == plain.tokens);
    CHECK(reader.read_key_norms(4).size() == 4 * (prompt.size() + at + 1));
    // The first steps' rows are those of the full run: the same tokens, the same attention.
    const kt::TraceReader full(one_pass);
    kt::DenseRows a;
    kt::DenseRows b;
    reader.read_mean(2, {0, static_cast<std::uint32_t>(at + 1)}, a);
    full.read_mean(2, {0, static_cast<std::uint32_t>(at + 1)}, b);
    CHECK(a.values == b.values);
    CHECK(kt::validate_trace(stopped).valid());
  }
}

TEST_CASE("a sliding window leaves zeros before it in every row", "[kernels][tracer]") {
  const kk::testing::TempDir temp("tracer-window");
  const auto spec = kk::testing::small_spec(kvtier::config::MISTRAL);  // window of 4 tokens
  kk::testing::write_random_hf_model(spec, temp.path() / "model", 5);
  const auto weights =
      std::make_shared<const kk::ModelWeights>(kk::load_hf_checkpoint(temp.path() / "model"));
  const auto engine = kk::make_cpu_engine(weights);
  const std::vector<std::int32_t> prompt = {1, 7, 9, 11, 13, 15};
  kk::TraceContents contents;
  contents.heads = true;
  contents.top_k = 3;
  contents.prefill_window = 6;
  contents.dtype = kvtier::config::FP32;
  const fs::path file = temp.path() / "window.h5";
  kk::AttentionTracer tracer(file, kk::capture_meta(weights->spec, 6, 10, contents, provenance()));
  Recorder recorder(tracer);
  tracer.finish(run_greedy(*engine, prompt, 10, recorder));
  CHECK(kt::validate_trace(file).valid());
  const kt::TraceReader reader(file);
  const auto heads = static_cast<int>(spec.num_attention_heads());
  kt::DenseRows mean;
  kt::HeadRows rows;
  for (std::uint32_t layer = 0; layer < spec.num_hidden_layers(); ++layer) {
    reader.read_mean(layer, {0, 10}, mean);
    reader.read_heads(layer, {0, 10}, rows);
    for (std::uint32_t step = 0; step < 10; ++step) {
      INFO("layer " << layer << ", step " << step);
      const int position = 6 + static_cast<int>(step);
      check_row(mean.row(step), recorder.mean_attention(static_cast<int>(layer), position),
                kvtier::config::FP32);
      for (int head = 0; head < heads; ++head) {
        const std::span<const float> row = rows.row(static_cast<std::uint32_t>(head), step);
        check_row(row, recorder.attention(static_cast<int>(layer), position, head),
                  kvtier::config::FP32);
        CHECK(std::all_of(row.begin(), row.begin() + (position - 3),
                          [](float w) { return w == 0.0F; }));
      }
    }
    const std::vector<float> window = reader.read_prefill_window(layer);
    for (int head = 0; head < heads; ++head) {
      for (int query = 0; query < 6; ++query) {
        const std::span<const float> stored(window.data() + (head * 6 + query) * 6, 6);
        const std::vector<double> expected =
            recorder.attention(static_cast<int>(layer), query, head);
        for (int p = 0; p < 6; ++p) {
          CHECK(stored[static_cast<std::size_t>(p)] ==
                Approx(p <= query ? expected[static_cast<std::size_t>(p)] : 0.0).margin(2e-6));
        }
      }
    }
  }
}

TEST_CASE("bad capture requests fail before writing anything", "[kernels][tracer]") {
  const kk::testing::TempDir temp("tracer-errors");
  const fs::path file = temp.path() / "bad.h5";
  const auto engine = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> prompt = stories_prompt();
  kk::CaptureOptions options;
  options.generation.max_new_tokens = 8;
  options.tool = "kvtier test";

  SECTION("no new tokens") {
    options.generation.max_new_tokens = 0;
    CHECK_THROWS_AS(kk::capture_trace(*engine, prompt, options, file), kvtier::ConfigError);
  }
  SECTION("a prompt that fills every position") {
    const std::vector<std::int32_t> long_prompt(512, 5);
    CHECK_THROWS_WITH(kk::capture_trace(*engine, long_prompt, options, file),
                      Catch::Contains("no position for a decode step"));
    CHECK_THROWS_AS(kk::capture_trace(*engine, long_prompt, options, file), kvtier::DataError);
  }
  SECTION("new tokens past the positions") {
    // generate() could run 512 - prompt + 1 new tokens; a trace runs its last one too.
    options.generation.max_new_tokens = 512 - static_cast<int>(prompt.size()) + 1;
    CHECK_THROWS_WITH(kk::capture_trace(*engine, prompt, options, file),
                      Catch::Contains("at most " + std::to_string(512 - prompt.size())));
  }
  SECTION("per-head rows alone") {
    options.contents.mean = false;
    options.contents.heads = true;
    CHECK_THROWS_AS(kk::capture_trace(*engine, prompt, options, file), kvtier::ConfigError);
  }
  SECTION("a window longer than the prompt") {
    options.contents.prefill_window = static_cast<std::uint32_t>(prompt.size()) + 1;
    CHECK_THROWS_WITH(kk::capture_trace(*engine, prompt, options, file),
                      Catch::Contains("longer than the"));
  }
  SECTION("bad sampling") {
    options.generation.sampling = kk::SamplingOptions::nucleus(1.0F, 1.5F, 1);
    CHECK_THROWS_AS(kk::capture_trace(*engine, prompt, options, file), kvtier::ConfigError);
  }
  CHECK(fs::is_empty(temp.path()));
  CHECK(engine->position() == 0);
}

TEST_CASE("the tracer refuses a run that does not fit its /meta", "[kernels][tracer]") {
  const kk::testing::TempDir temp("tracer-misuse");
  const fs::path file = temp.path() / "misuse.h5";
  const auto engine = kk::make_cpu_engine(stories_model());
  const std::vector<std::int32_t> prompt = stories_prompt();
  const auto prompt_tokens = static_cast<std::uint32_t>(prompt.size());
  {
    kk::AttentionTracer tracer(
        file, kk::capture_meta(stories_model()->spec, prompt_tokens, 3, {}, provenance()));
    engine->set_observer(&tracer);
    const std::span<const float> logits = engine->prefill(prompt);
    for (int step = 0; step < 3; ++step) {
      static_cast<void>(engine->decode(kk::argmax(logits)));
    }
    CHECK(tracer.steps_done() == 3);
    // A fourth step was not declared.
    CHECK_THROWS_AS(engine->decode(5), std::logic_error);
    engine->set_observer(nullptr);
  }
  {
    kk::AttentionTracer tracer(
        file, kk::capture_meta(stories_model()->spec, prompt_tokens, 3, {}, provenance()));
    engine->reset();
    engine->set_observer(&tracer);
    static_cast<void>(engine->prefill(prompt));
    static_cast<void>(engine->decode(5));
    engine->set_observer(nullptr);
    std::vector<std::int32_t> tokens = prompt;
    tokens.insert(tokens.end(), {5, 5, 5});
    CHECK_THROWS_WITH(tracer.finish(tokens), Catch::Contains("1 of the 3"));
  }
  CHECK(fs::is_empty(temp.path()));  // no trace left behind, not even a temporary one
}
