// TraceAttention: replay's AttentionSource over HDF5 trace files. Rows must be the reader's rows
// exactly, whatever the block size; sliced traces map layers; top-k traces are reconstructed;
// replay from a file equals replay from memory.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "replay/trace_source.hpp"
#include "tests/traces/trace_fixture.hpp"
#include "traces/reader.hpp"
#include "traces/synth.hpp"

namespace {

using kvtier::DataError;
using kvtier::replay::TraceAttention;
using kvtier::replay::TraceAttentionOptions;
namespace config = kvtier::config;
namespace replay = kvtier::replay;
namespace traces = kvtier::traces;
using kvtier::test::tiny_meta;
using kvtier::test::trace_scratch;

std::filesystem::path write_trace(const std::string& name, const config::TraceMeta& meta) {
  const auto path = trace_scratch() / name;
  traces::WriterOptions options;
  options.chunk_elements = 64;  // rows cross chunk boundaries
  options.compression_threads = 0;
  kvtier::test::write_test_trace(path, meta, options);
  return path;
}

config::TraceMeta every_granularity(std::uint32_t prompt, std::uint32_t steps) {
  config::TraceMeta meta =
      tiny_meta(prompt, steps,
                {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_TOP_K,
                 config::GRANULARITY_PREFILL_WINDOW, config::GRANULARITY_KEY_NORMS});
  meta.set_top_k(5);
  meta.set_prefill_window(3);
  return meta;
}

// The reader's mean rows of one layer, every step.
std::vector<std::vector<float>> reader_rows(const traces::TraceReader& reader,
                                            std::uint32_t model_layer) {
  traces::DenseRows rows;
  reader.read_mean(model_layer, {0, reader.shape().steps}, rows);
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < reader.shape().steps; ++i) {
    const auto row = rows.row(i);
    out.emplace_back(row.begin(), row.end());
  }
  return out;
}

// Every field of two demands is equal.
void require_same_demand(const replay::ReplayDemand& a, const replay::ReplayDemand& b) {
  REQUIRE(a.steps() == b.steps());
  REQUIRE(a.layers() == b.layers());
  CHECK(a.compressed_format() == b.compressed_format());
  for (std::uint64_t step = 0; step < a.steps(); ++step) {
    for (std::uint32_t layer = 0; layer < a.layers(); ++layer) {
      INFO("step " << step << ", layer " << layer);
      const replay::StepLayerRecord& x = a.at(step, layer);
      const replay::StepLayerRecord& y = b.at(step, layer);
      REQUIRE(x.tokens == y.tokens);
      REQUIRE(x.mass == y.mass);
      REQUIRE(x.promoted == y.promoted);
      REQUIRE(x.demoted == y.demoted);
      REQUIRE(x.compressed == y.compressed);
      REQUIRE(x.evicted == y.evicted);
      REQUIRE(x.newly_host == y.newly_host);
      REQUIRE(x == y);
    }
  }
}

}  // namespace

TEST_CASE("trace rows equal the reader's rows, whatever the block size", "[replay][trace]") {
  const auto path = write_trace("every.h5", every_granularity(11, 37));
  const traces::TraceReader reader(path);
  // 1: one step per block; 200: a few steps; default: the whole trace in one block.
  for (const std::uint64_t block :
       {std::uint64_t{1}, std::uint64_t{200}, TraceAttentionOptions{}.block_elements}) {
    INFO("block_elements " << block);
    TraceAttention source(path, TraceAttentionOptions{block});
    REQUIRE(source.layers() == 5);
    REQUIRE(source.prompt_tokens() == 11);
    REQUIRE(source.steps() == 37);
    CHECK(source.name() == path.string());
    CHECK_FALSE(source.from_topk());
    std::vector<std::vector<std::vector<float>>> expected;
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      expected.push_back(reader_rows(reader, layer));
    }
    std::vector<std::vector<float>> rows;
    for (std::uint64_t step = 0; step < 37; ++step) {
      source.read_step(step, rows);
      REQUIRE(rows.size() == 5);
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        REQUIRE(rows[layer] == expected[layer][step]);
      }
    }
    // Backwards (random access) reads the same rows.
    for (std::uint64_t step = 37; step-- > 0;) {
      source.read_step(step, rows);
      REQUIRE(rows[3] == expected[3][step]);
    }
  }
}

TEST_CASE("per-head rows, prefill window and key norms are forwarded", "[replay][trace]") {
  const auto path = write_trace("forward.h5", every_granularity(11, 20));
  const traces::TraceReader reader(path);
  TraceAttention source(path, TraceAttentionOptions{300});
  const std::uint32_t heads = reader.shape().heads;
  REQUIRE(source.heads() == heads);
  REQUIRE(source.prefill_window() == 3);
  REQUIRE(source.kv_heads() == reader.shape().kv_heads);
  traces::HeadRows expected;
  std::vector<std::vector<float>> rows;
  for (std::uint64_t step = 0; step < 20; ++step) {
    source.read_head_step(step, rows);
    REQUIRE(rows.size() == 5);
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      reader.read_heads(layer, {static_cast<std::uint32_t>(step), 1}, expected);
      REQUIRE(rows[layer].size() == heads * (11 + step + 1));
      for (std::uint32_t head = 0; head < heads; ++head) {
        const auto row = expected.row(head, 0);
        REQUIRE(std::equal(row.begin(), row.end(),
                           rows[layer].begin() + static_cast<std::ptrdiff_t>(head * row.size())));
      }
    }
  }
  for (std::uint32_t layer = 0; layer < 5; ++layer) {
    CHECK(source.read_prefill_window(layer) == reader.read_prefill_window(layer));
    CHECK(source.read_key_norms(layer) == reader.read_key_norms(layer));
  }
}

TEST_CASE("a trace without optional data says so", "[replay][trace]") {
  const auto path = write_trace("mean_only.h5", tiny_meta(6, 4, {config::GRANULARITY_MEAN}));
  TraceAttention source(path);
  CHECK(source.heads() == 0);
  CHECK(source.prefill_window() == 0);
  CHECK(source.kv_heads() == 0);
  std::vector<std::vector<float>> rows;
  CHECK_THROWS_AS(source.read_head_step(0, rows), DataError);
  CHECK_THROWS_AS(source.read_prefill_window(0), DataError);
  CHECK_THROWS_AS(source.read_key_norms(0), DataError);
  CHECK_THROWS_AS(source.read_step(4, rows), DataError);  // past the last step
}

TEST_CASE("a sliced trace maps source layer l to model layer first + l", "[replay][trace]") {
  config::TraceMeta meta = tiny_meta(
      9, 12, {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_KEY_NORMS});
  meta.set_first_layer(2);
  meta.set_num_layers(3);
  const auto path = write_trace("sliced.h5", meta);
  const traces::TraceReader reader(path);
  TraceAttention source(path, TraceAttentionOptions{100});
  REQUIRE(source.layers() == 3);
  CHECK(source.first_layer() == 2);
  std::vector<std::vector<float>> rows;
  for (std::uint32_t l = 0; l < 3; ++l) {
    const auto expected = reader_rows(reader, 2 + l);
    for (std::uint64_t step = 0; step < 12; ++step) {
      source.read_step(step, rows);
      REQUIRE(rows[l] == expected[step]);
    }
    CHECK(source.read_key_norms(l) == reader.read_key_norms(2 + l));
  }
  // The data differ by layer (test_row depends on it), so a wrong mapping cannot pass.
  CHECK(reader_rows(reader, 2)[5] != reader_rows(reader, 3)[5]);
}

TEST_CASE("top-k traces are reconstructed: K entries, residual spread uniformly",
          "[replay][trace]") {
  config::TraceMeta meta = tiny_meta(4, 30, {config::GRANULARITY_TOP_K});
  meta.set_top_k(6);
  const auto path = write_trace("topk_only.h5", meta);
  const traces::TraceReader reader(path);
  for (const std::uint64_t block : {std::uint64_t{13}, std::uint64_t{1} << 20}) {
    TraceAttention source(path, TraceAttentionOptions{block});
    REQUIRE(source.from_topk());
    std::vector<std::vector<float>> rows;
    traces::TopKRows topk;
    for (std::uint64_t step = 0; step < 30; ++step) {
      source.read_step(step, rows);
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        INFO("step " << step << ", layer " << layer);
        const std::vector<float>& row = rows[layer];
        REQUIRE(row.size() == 4 + step + 1);
        const double sum = std::accumulate(row.begin(), row.end(), 0.0);
        CHECK(sum == Approx(1.0).margin(
                         traces::row_sum_tolerance(traces::WeightType::kFloat16, row.size())));
        reader.read_topk(layer, {static_cast<std::uint32_t>(step), 1}, topk);
        std::vector<bool> stored(row.size(), false);
        std::size_t count = 0;
        for (std::uint32_t j = 0; j < 6; ++j) {
          const std::int32_t index = topk.indices[j];
          if (index >= 0) {
            CHECK(row[static_cast<std::size_t>(index)] == topk.weights[j]);
            stored[static_cast<std::size_t>(index)] = true;
            ++count;
          }
        }
        CHECK(count == std::min<std::size_t>(6, row.size()));
        for (std::size_t p = 0; p < row.size(); ++p) {
          if (!stored[p]) {
            CHECK(row[p] == Approx(topk.residual[0] / static_cast<double>(row.size() - count)));
          }
        }
      }
    }
  }
}

TEST_CASE("a synthetic top-k-only trace replays and keeps its top-k mass", "[replay][trace]") {
  traces::SynthOptions options;
  options.model = kvtier::test::tiny_model();
  options.prompt_tokens = 32;
  options.steps = 64;
  options.params = traces::synthetic_preset("reasoning", 5);
  options.mean = false;
  options.top_k = 16;
  options.writer.compression_threads = 0;
  const auto path = trace_scratch() / "synth_topk.h5";
  traces::write_synthetic_trace(path, options);
  TraceAttention source(path);
  REQUIRE(source.from_topk());
  auto policy = replay::builtin_policies().create(replay::parse_policy_string("full"),
                                                  {source.layers(), 32, 64});
  const replay::ReplayDemand demand = replay::replay(source, *policy);
  CHECK(demand.summary().mean_kept_mass == Approx(1.0).margin(1e-3));
}

TEST_CASE("replay from a trace file equals replay from the same rows in memory",
          "[replay][trace]") {
  traces::SynthOptions options;
  options.model = kvtier::test::tiny_model();
  options.prompt_tokens = 40;
  options.steps = 150;
  options.params = traces::synthetic_preset("reasoning", 11);
  options.heads = true;
  options.key_norms = true;
  options.prefill_window = 8;
  options.writer.compression_threads = 0;
  const auto path = trace_scratch() / "synth_equal.h5";
  traces::write_synthetic_trace(path, options);
  const traces::TraceReader reader(path);
  const traces::TraceShape& shape = reader.shape();

  // The same rows, read by the reader, held in memory.
  std::vector<std::vector<std::vector<float>>> rows(shape.steps);
  std::vector<std::vector<std::vector<float>>> head_rows(shape.steps);
  std::vector<std::vector<float>> window;
  std::vector<std::vector<float>> norms;
  for (std::uint32_t layer = 0; layer < shape.layers.count; ++layer) {
    const auto layer_rows = reader_rows(reader, layer);
    traces::HeadRows heads;
    reader.read_heads(layer, {0, shape.steps}, heads);
    for (std::uint32_t step = 0; step < shape.steps; ++step) {
      rows[step].push_back(layer_rows[step]);
      std::vector<float> all;
      for (std::uint32_t head = 0; head < shape.heads; ++head) {
        const auto row = heads.row(head, step);
        all.insert(all.end(), row.begin(), row.end());
      }
      head_rows[step].push_back(std::move(all));
    }
    window.push_back(reader.read_prefill_window(layer));
    norms.push_back(reader.read_key_norms(layer));
  }
  replay::InMemoryAttention memory(shape.layers.count, shape.prompt_tokens, rows);
  memory.set_head_rows(shape.heads, head_rows);
  memory.set_prefill_window(shape.prefill_window, window);
  memory.set_key_norms(shape.kv_heads, norms);

  const replay::PolicyRegistry registry = replay::builtin_policies();
  const replay::ReplayShape replay_shape{shape.layers.count, shape.prompt_tokens, shape.steps};
  std::vector<std::string> policies = {"full", "tiered:hbm=0.3,evict=0.2,delta=16,recent=32",
                                       "streaming:window=48", "h2o:budget=40", "tova:budget=40"};
  // Policies that read the prefill window, per-head rows or key norms (added as they land).
  for (const char* text :
       {"snapkv:budget=40,window=8", "adakv:budget=40,window=8", "knorm:budget=40"}) {
    if (registry.find(replay::parse_policy_string(text).name()) != nullptr) {
      policies.emplace_back(text);
    }
  }
  for (const std::string& text : policies) {
    INFO(text);
    const config::PolicySpec spec = replay::parse_policy_string(text);
    TraceAttention file(path, TraceAttentionOptions{5000});  // many blocks
    auto from_file = registry.create(spec, replay_shape);
    auto from_memory = registry.create(spec, replay_shape);
    const replay::ReplayDemand a = replay::replay(file, *from_file);
    const replay::ReplayDemand b = replay::replay(memory, *from_memory);
    require_same_demand(a, b);
  }
}
