// Budget search speed: one whole MOSAIC-style search (replay/budget_search.hpp) over a set of
// 32-layer synthetic traces (Llama-3.1-8B's shape), at the default evaluation count, then the
// winner against uniform on a held-out trace. Traces are generated once into memory
// (replay::MemoryTrace), so the figure is the search: replays, classifier and DE.
//
//   kvtier_bench_budget_search [set=presets] [evaluations=180] [jobs=2] [prompt=1024]
//                              [steps=1024] [policy=h2o] [screening=1]
//
// Trace sets:
//   presets  `kvtier trace synth`'s generator: calibration a reasoning and a chat trace (seeds
//            1, 2), held-out a reasoning trace (seed 3);
//   split    five long-range layers (10, 14, 15, 16, 20, where MOSAIC's winners put their
//            budget) that spread attention over the whole context, the others local (a sink and
//            the last few tokens): the search has something to find. Calibration seeds 1, 2,
//            held-out seed 3.

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "replay/budget_search.hpp"
#include "replay/synthetic_attention.hpp"
#include "sim/random.hpp"
#include "traces/synth.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool long_range(std::uint32_t layer) {
  return layer == 10 || layer == 14 || layer == 15 || layer == 16 || layer == 20;
}

// Local layers: a sink and an exponential recency band (decay 4 tokens); long-range layers: a
// sink, a flat background and heavy hitters every 7th position. Weights are drawn from fixed
// patterns with seeded noise, each row normalised to 1.
kvtier::replay::MemoryTrace split(std::uint32_t layers, std::uint32_t prompt, std::uint32_t steps,
                                  std::uint64_t seed) {
  kvtier::sim::RandomStream random(seed);
  std::vector<std::vector<std::vector<float>>> rows(steps);
  for (std::uint32_t step = 0; step < steps; ++step) {
    const std::uint64_t visible = std::uint64_t{prompt} + step + 1;
    rows[step].resize(layers);
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      std::vector<float>& row = rows[step][layer];
      row.resize(visible);
      double total = 0.0;
      for (std::uint64_t token = 0; token < visible; ++token) {
        const auto distance = static_cast<double>(visible - 1 - token);
        const double noise = random.uniform_01();
        double weight = token == 0 ? 0.2 * static_cast<double>(visible) : 0.0;
        if (long_range(layer)) {
          weight += 1.0 + 0.2 * noise + (token % 7 == 3 ? 3.0 : 0.0);
        } else {
          weight += 0.01 * noise + 0.25 * static_cast<double>(visible) * std::exp(-distance / 4.0);
        }
        row[token] = static_cast<float>(weight);
        total += weight;
      }
      for (float& weight : row) {
        weight = static_cast<float>(weight / total);
      }
    }
  }
  return kvtier::replay::MemoryTrace(layers, prompt, std::move(rows),
                                     "split trace (seed " + std::to_string(seed) + ")");
}

kvtier::replay::MemoryTrace synthetic(const kvtier::config::ModelSpec& model,
                                      const std::string& pattern, std::uint64_t seed,
                                      std::uint32_t prompt, std::uint32_t steps) {
  kvtier::replay::SyntheticAttention source(model, prompt, steps,
                                            kvtier::traces::synthetic_preset(pattern, seed));
  return kvtier::replay::MemoryTrace(source);
}

// The share of the (mean budget ∈ [floor, cap]) × (recall ∈ [0, 1]) box the front dominates:
// one figure for how good the whole front is, comparable between runs of one trace set.
double hypervolume(const kvtier::replay::SearchResult& result,
                   const kvtier::replay::BudgetBounds& bounds) {
  double area = 0.0;
  auto previous = static_cast<double>(bounds.cap);
  for (auto point = result.front.rbegin(); point != result.front.rend(); ++point) {
    area += (previous - point->mean_budget) * point->recall;
    previous = point->mean_budget;
  }
  return area / static_cast<double>(bounds.cap - bounds.floor);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string set = argc > 1 ? argv[1] : "presets";
  const auto number = [&](int index, unsigned long fallback) {
    return argc > index ? std::strtoul(argv[index], nullptr, 10) : fallback;
  };
  const auto evaluations = static_cast<std::uint32_t>(number(2, 180));
  const auto jobs = static_cast<unsigned>(number(3, 2));
  const auto prompt = static_cast<std::uint32_t>(number(4, 1024));
  const auto steps = static_cast<std::uint32_t>(number(5, 1024));
  const std::string policy = argc > 6 ? argv[6] : "h2o";
  const bool screening = number(7, 1) != 0;
  if (set != "presets" && set != "split") {
    std::cerr << "unknown trace set '" << set << "': presets or split\n";
    return 2;
  }
  try {
    const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
    const kvtier::config::ConfigLoader loader(presets);
    kvtier::config::ModelSpec model;
    const kvtier::config::PresetFile* preset = presets.find("model", "Llama-3.1-8B");
    if (preset == nullptr) {
      std::cerr << "no Llama-3.1-8B preset\n";
      return 1;
    }
    (void)loader.load_preset(*preset, model, {});

    const auto generate_start = Clock::now();
    std::vector<kvtier::replay::SourceFactory> calibration;
    std::vector<kvtier::replay::SourceFactory> held_out;
    if (set == "presets") {
      calibration.push_back(synthetic(model, "reasoning", 1, prompt, steps).factory());
      calibration.push_back(synthetic(model, "chat", 2, prompt, steps).factory());
      held_out.push_back(synthetic(model, "reasoning", 3, prompt, steps).factory());
    } else {
      const std::uint32_t layers = model.num_hidden_layers();
      calibration.push_back(split(layers, prompt, steps, 1).factory());
      calibration.push_back(split(layers, prompt, steps, 2).factory());
      held_out.push_back(split(layers, prompt, steps, 3).factory());
    }
    const double generate_seconds = seconds_since(generate_start);

    const auto registry = kvtier::replay::builtin_policies();
    kvtier::replay::check_base_policy(registry, policy);
    const kvtier::replay::ReplayRecall recall(registry, policy, std::move(calibration));
    kvtier::replay::SearchOptions options;
    options.evaluations = evaluations;
    options.jobs = jobs;
    options.screening = screening;
    const auto search_start = Clock::now();
    const auto result = kvtier::replay::search_budgets(model.num_hidden_layers(), recall, options);
    const double search_seconds = seconds_since(search_start);

    const kvtier::replay::ReplayRecall held_out_recall(registry, policy, std::move(held_out));
    const std::vector<std::uint64_t> targets{128, 256, 512};
    const auto& winner = result.front[result.winner];
    const auto compare_start = Clock::now();
    const auto comparisons = kvtier::replay::compare_with_uniform(held_out_recall, winner.budgets,
                                                                  targets, options.bounds, jobs);
    const double compare_seconds = seconds_since(compare_start);

    std::cout << "{\"set\": \"" << set << "\", \"policy\": \"" << policy
              << "\", \"screening\": " << (screening ? "true" : "false")
              << ", \"layers\": " << model.num_hidden_layers() << ", \"prompt\": " << prompt
              << ", \"steps\": " << steps << ", \"evaluations\": " << result.evaluated.size()
              << ", \"jobs\": " << jobs
              << ", \"generate_s\": " << kvtier::format_fixed(generate_seconds, 3)
              << ", \"search_s\": " << kvtier::format_fixed(search_seconds, 3)
              << ", \"compare_s\": " << kvtier::format_fixed(compare_seconds, 3)
              << ", \"front\": " << result.front.size() << ", \"hypervolume\": "
              << kvtier::format_fixed(hypervolume(result, options.bounds), 5)
              << ", \"winner_mean\": " << kvtier::format_fixed(winner.mean_budget, 1)
              << ", \"winner_recall\": " << kvtier::format_fixed(winner.recall, 5)
              << ", \"winner\": \""
              << kvtier::replay::explicit_budget_policy(policy, winner.budgets)
              << "\", \"held_out\": [";
    for (std::size_t k = 0; k < comparisons.size(); ++k) {
      std::cout << (k == 0 ? "" : ", ") << "{\"mean\": " << comparisons[k].target_mean
                << ", \"searched\": " << kvtier::format_fixed(comparisons[k].searched_recall, 5)
                << ", \"uniform\": " << kvtier::format_fixed(comparisons[k].uniform_recall, 5)
                << "}";
    }
    std::cout << "]}\n";
  } catch (const kvtier::Error& error) {
    std::cerr << error.lines().front() << "\n";
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
