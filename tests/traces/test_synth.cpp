// The synthetic generator: seeded and deterministic, rows are distributions with the declared
// component masses, top-k rows without dense rows, and `compute_stats` recovers the parameters.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/traces/trace_fixture.hpp"
#include "traces/reader.hpp"
#include "traces/stats.hpp"
#include "traces/synth.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;
using kvtier::test::trace_scratch;

traces::SynthOptions options_for(const std::string& pattern, std::uint32_t prompt,
                                 std::uint32_t steps, std::uint64_t seed = 7) {
  traces::SynthOptions options;
  options.model = kvtier::test::tiny_model();
  options.prompt_tokens = prompt;
  options.steps = steps;
  options.params = traces::synthetic_preset(pattern, seed);
  options.writer.created = "2026-01-01T00:00:00Z";
  return options;
}

traces::TraceShape shape_of(const traces::SynthOptions& options) {
  return traces::shape_from_meta(traces::synthetic_meta(options), "test");
}

}  // namespace

TEST_CASE("parameters are checked", "[traces][synth]") {
  CHECK_THROWS_AS(traces::synthetic_preset("poetry", 1), kvtier::ConfigError);
  config::SyntheticAttention params = traces::synthetic_preset("chat", 1);
  params.set_recency_mass(0.7);  // 0.25 + 0.7 + 0.15 > 1
  CHECK_THROWS_WITH(traces::check_synthetic(params), Catch::Contains("cannot exceed 1"));
  params = traces::synthetic_preset("reasoning", 1);
  params.set_reread_mass(0.4);  // more than the recency band holds
  CHECK_THROWS_WITH(traces::check_synthetic(params), Catch::Contains("recency"));
  params = traces::synthetic_preset("reasoning", 1);
  params.set_reread_delay_min_steps(2000);
  CHECK_THROWS_AS(traces::check_synthetic(params), kvtier::ConfigError);
  params = traces::synthetic_preset("reasoning", 1);
  params.set_recency_decay_tokens(0);
  CHECK_THROWS_AS(traces::check_synthetic(params), kvtier::ConfigError);
  for (const auto pattern : traces::synthetic_patterns()) {
    CHECK_NOTHROW(traces::check_synthetic(traces::synthetic_preset(pattern, 3)));
  }
}

TEST_CASE("rows are distributions with the declared masses", "[traces][synth]") {
  const auto options = options_for("reasoning", 200, 1500);
  const traces::TraceShape shape = shape_of(options);
  const traces::SyntheticAttentionModel model(options.params, shape, 5);
  const auto& p = options.params;
  std::vector<float> row;
  std::uint32_t burst_rows = 0;
  for (std::uint32_t step = 0; step < shape.steps; step += 7) {
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      row.resize(shape.row_length(step));
      model.mean_row(layer, step, row);
      const double sum = std::accumulate(row.begin(), row.end(), 0.0);
      REQUIRE(sum == Approx(1.0).margin(1e-5));
      REQUIRE(std::all_of(row.begin(), row.end(), [](float w) { return w > 0.0F; }));
      const traces::RowMasses m = model.masses(layer, step);
      REQUIRE(m.sink + m.recency + m.heavy + m.reread + m.background == Approx(1.0));
      REQUIRE(m.sink == Approx(p.sink_mass()));
      const double scale = model.is_local(layer) ? p.local_long_range_scale() : 1.0;
      REQUIRE(m.heavy == Approx(p.heavy_hitter_mass() * scale));
      const bool bursting = !model.active_notes(step).empty();
      burst_rows += bursting ? 1 : 0;
      REQUIRE(m.reread == Approx(bursting ? p.reread_mass() * scale : 0.0));
      // The sinks hold their mass plus their share of the background.
      double sinks = 0.0;
      for (std::uint32_t i = 0; i < p.sink_tokens(); ++i) {
        sinks += row[i];
      }
      REQUIRE(sinks == Approx(m.sink + m.background * p.sink_tokens() / row.size()).epsilon(1e-4));
    }
  }
  CHECK(burst_rows > 0);
}

TEST_CASE("re-reads come in bursts hundreds of steps after their note", "[traces][synth]") {
  const auto options = options_for("reasoning", 100, 6000);
  const traces::SyntheticAttentionModel model(options.params, shape_of(options), 5);
  const auto& p = options.params;
  REQUIRE(model.notes().size() > 40);
  REQUIRE(model.bursts().size() > 40);
  std::vector<std::uint32_t> delays;
  for (const auto& burst : model.bursts()) {
    const auto& note = model.notes()[burst.note];
    const std::uint32_t delay = burst.first_step - (note.first_step + p.note_tokens());
    CHECK(delay >= p.reread_delay_min_steps() - 1);
    CHECK(delay <= p.reread_delay_max_steps() + 1);
    delays.push_back(delay);
  }
  // Unpredictable: the delays spread over the whole range, not a fixed lag.
  std::sort(delays.begin(), delays.end());
  CHECK(delays.front() < 300);
  CHECK(delays.back() > 1000);
  // Mean gap between notes near note_interval_steps (+ the note itself).
  const double span = model.notes().back().first_step - model.notes().front().first_step;
  const double gap = span / static_cast<double>(model.notes().size() - 1);
  CHECK(gap == Approx(p.note_interval_steps() + p.note_tokens()).epsilon(0.25));
}

TEST_CASE("top-k rows are the k largest entries of the dense row", "[traces][synth]") {
  auto options = options_for("reasoning", 64, 900);
  options.params.set_head_variation(0.0);
  const traces::TraceShape shape = shape_of(options);
  const traces::SyntheticAttentionModel model(options.params, shape, 5);
  std::vector<float> row;
  std::vector<std::int32_t> indices(24);
  std::vector<float> weights(24);
  for (std::uint32_t step : {0U, 1U, 333U, 640U, 899U}) {
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      row.resize(shape.row_length(step));
      model.mean_row(layer, step, row);
      float residual = 0.0F;
      model.top_k_row(layer, step, 24, indices, weights, residual);
      std::vector<float> sorted = row;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      double kept = 0.0;
      for (std::size_t i = 0; i < 24; ++i) {
        REQUIRE(weights[i] == Approx(sorted[i]).epsilon(1e-5));
        REQUIRE(row[static_cast<std::size_t>(indices[i])] == Approx(weights[i]).epsilon(1e-5));
        kept += weights[i];
      }
      REQUIRE(kept + residual == Approx(1.0).margin(1e-5));
    }
  }
}

TEST_CASE("the same seed gives the same trace, another seed another", "[traces][synth]") {
  auto options = options_for("chat", 50, 80, 11);
  options.top_k = 8;
  options.heads = true;
  options.prefill_window = 6;
  options.key_norms = true;
  traces::write_synthetic_trace(trace_scratch() / "seed_a.h5", options);
  traces::write_synthetic_trace(trace_scratch() / "seed_b.h5", options);
  options.params.set_seed(12);
  traces::write_synthetic_trace(trace_scratch() / "seed_c.h5", options);
  const traces::TraceReader a(trace_scratch() / "seed_a.h5");
  const traces::TraceReader b(trace_scratch() / "seed_b.h5");
  const traces::TraceReader c(trace_scratch() / "seed_c.h5");
  CHECK(a.read_tokens() == b.read_tokens());
  CHECK(a.read_tokens() != c.read_tokens());
  traces::HeadRows rows_a;
  traces::HeadRows rows_b;
  traces::HeadRows rows_c;
  a.read_heads(3, {0, 80}, rows_a);
  b.read_heads(3, {0, 80}, rows_b);
  c.read_heads(3, {0, 80}, rows_c);
  CHECK(rows_a.values == rows_b.values);
  CHECK(rows_a.values != rows_c.values);
  CHECK(a.read_key_norms(1) == b.read_key_norms(1));
  CHECK(a.read_prefill_window(4) == b.read_prefill_window(4));
}

TEST_CASE("trace statistics recover the generator's parameters", "[traces][synth]") {
  auto options = options_for("reasoning", 400, 3000, 5);
  options.params.set_head_variation(0.0);  // a pure exponential, so the fitted decay is exact
  options.params.set_recency_decay_tokens(10.0);
  const auto path = trace_scratch() / "recover.h5";
  traces::write_synthetic_trace(path, options);
  const traces::TraceReader reader(path);
  const traces::SyntheticAttentionModel model(options.params, reader.shape(), 5);
  traces::StatsOptions stats_options;
  stats_options.sample_steps = 0;
  const traces::TraceStats stats = traces::compute_stats(reader, stats_options);
  REQUIRE(stats.layers.size() == 5);
  const auto& p = options.params;
  double bursting = 0;
  for (std::uint32_t step = 0; step < 3000; ++step) {
    bursting += model.active_notes(step).empty() ? 0.0 : 1.0;
  }
  bursting /= 3000.0;
  for (const auto& layer : stats.layers) {
    INFO("layer " << layer.layer << (model.is_local(layer.layer) ? " (local)" : " (global)"));
    // Sinks: their mass plus a sliver of background.
    CHECK(layer.sink_mass == Approx(p.sink_mass()).margin(0.01));
    CHECK(layer.recency_decay_tokens == Approx(10.0).epsilon(0.05));
    const double scale = model.is_local(layer.layer) ? p.local_long_range_scale() : 1.0;
    // Far mass (distance >= 256, sinks excluded): the re-read notes while bursting, plus heavy
    // hitters and background that far back (most of it here: 3,000 steps of a 400-token
    // prompt). At least the re-reads; and what the generator's own rows hold that far back,
    // to the FP16 rounding of the stored rows.
    const double rereads = bursting * p.reread_mass() * scale;
    CHECK(layer.far_mass >= rereads * 0.8);
    double far = 0.0;
    std::vector<float> row;
    for (std::uint32_t step = 0; step < 3000; ++step) {
      row.resize(reader.shape().row_length(step));
      model.mean_row(layer.layer, step, row);
      for (std::size_t position = stats_options.sink_tokens;
           position + stats_options.far_distance < row.size(); ++position) {
        far += row[position];
      }
    }
    CHECK(layer.far_mass == Approx(far / 3000.0).margin(1e-4));
  }
  // Local layers keep more mass near the newest token than global ones.
  double local_recent = 0, global_recent = 0, local_count = 0, global_count = 0;
  for (const auto& layer : stats.layers) {
    (model.is_local(layer.layer) ? local_recent : global_recent) += layer.recent_mass;
    (model.is_local(layer.layer) ? local_count : global_count) += 1;
  }
  REQUIRE(local_count > 0);
  REQUIRE(global_count > 0);
  CHECK(local_recent / local_count > global_recent / global_count + 0.03);
}

TEST_CASE("re-read bursts show up as attention far back", "[traces][synth]") {
  traces::StatsOptions stats_options;
  stats_options.sample_steps = 0;
  double far[2] = {0, 0};
  double expected = 0;
  for (const bool rereads : {false, true}) {
    auto options = options_for("reasoning", 300, 2500, 9);
    if (!rereads) {
      options.params.set_reread_mass(0.0);
    }
    const auto path = trace_scratch() / (rereads ? "reach_rereads.h5" : "reach_none.h5");
    traces::write_synthetic_trace(path, options);
    const traces::TraceReader reader(path);
    const traces::TraceStats stats = traces::compute_stats(reader, stats_options);
    const traces::SyntheticAttentionModel model(options.params, reader.shape(), 5);
    for (const auto& layer : stats.layers) {
      far[rereads ? 1 : 0] += layer.far_mass / 5.0;
    }
    if (rereads) {
      // Re-read mass that lies 256 or more tokens back, averaged over steps and layers.
      const auto& p = options.params;
      for (std::uint32_t step = 0; step < 2500; ++step) {
        const auto active = model.active_notes(step);
        const std::uint64_t newest = reader.shape().row_length(step) - 1;
        for (const std::uint32_t note : active) {
          const std::uint64_t start = model.notes()[note].first_position;
          std::uint32_t far_tokens = 0;
          for (std::uint64_t t = start; t < start + p.note_tokens(); ++t) {
            far_tokens += newest - t >= 256 ? 1 : 0;
          }
          for (std::uint32_t layer = 0; layer < 5; ++layer) {
            const double scale = model.is_local(layer) ? p.local_long_range_scale() : 1.0;
            expected += p.reread_mass() * scale / static_cast<double>(active.size()) * far_tokens /
                        p.note_tokens() / 5.0 / 2500.0;
          }
        }
      }
    }
  }
  INFO("far mass without re-reads " << far[0] << ", with " << far[1] << ", re-reads far "
                                    << expected);
  REQUIRE(expected > 0.01);
  CHECK(far[1] - far[0] > 0.5 * expected);
  CHECK(far[1] - far[0] < 1.05 * expected);
}

TEST_CASE("32k+ steps through top-k rows alone", "[traces][synth]") {
  auto options = options_for("reasoning", 512, 33000, 3);
  options.mean = false;
  options.top_k = 16;
  const auto path = trace_scratch() / "long_topk.h5";
  traces::write_synthetic_trace(path, options);
  const traces::TraceReader reader(path);
  CHECK(reader.shape().steps == 33000);
  CHECK_FALSE(reader.shape().has_mean);
  traces::TopKRows rows;
  reader.read_topk(4, {32990, 10}, rows);
  for (std::uint32_t i = 0; i < 10; ++i) {
    double total = rows.residual[i];
    for (std::uint32_t j = 0; j < 16; ++j) {
      total += rows.weights[i * 16 + j];
      CHECK(rows.indices[i * 16 + j] < static_cast<std::int32_t>(512 + 32990 + i + 1));
    }
    CHECK(total == Approx(1.0).margin(2e-3));
  }
  traces::StatsOptions stats_options;
  stats_options.sample_steps = 200;
  const traces::TraceStats stats = traces::compute_stats(reader, stats_options);
  CHECK(stats.from_topk);
  // The sinks are among the top 16 in every row, so their mass is seen whole.
  CHECK(stats.layers[0].sink_mass == Approx(options.params.sink_mass()).margin(0.01));
}
