#pragma once
// Small attention sources for policy tests: sinks, a recency band and a few heavy hitters per
// layer, with seeded noise; each row sums to 1. `synthetic_attention` has head-mean rows only;
// `rich_attention` adds what some policies read: per-head rows, the prefill window and key
// norms.

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "replay/attention.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"
#include "sim/random.hpp"

namespace kvtier::test {

inline replay::InMemoryAttention synthetic_attention(std::uint32_t layers, std::uint64_t prompt,
                                                     std::uint64_t steps, std::uint64_t seed) {
  sim::RandomStream random(seed);
  std::vector<std::vector<std::vector<float>>> rows(steps);
  for (std::uint64_t step = 0; step < steps; ++step) {
    rows[step].resize(layers);
    const std::uint64_t visible = prompt + step + 1;
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      std::vector<double> weights(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        const double distance = static_cast<double>(visible - 1 - token);
        double weight = 0.05 * random.uniform_01() + std::exp(-distance / (8.0 + 4.0 * layer));
        if (token < 2) {
          weight += 2.0;  // sinks
        }
        if (token % 17 == 5) {
          weight += 0.5;  // heavy hitters
        }
        weights[token] = weight;
      }
      double total = 0.0;
      for (const double w : weights) {
        total += w;
      }
      rows[step][layer].resize(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        rows[step][layer][token] = static_cast<float>(weights[token] / total);
      }
    }
  }
  return replay::InMemoryAttention(layers, prompt, std::move(rows));
}

// One head's attention from the query at `query` over positions 0 .. query: heads differ in
// their recency scale and in where their heavy hitters sit.
inline std::vector<double> synthetic_head_weights(std::uint64_t query, std::uint32_t layer,
                                                  std::uint32_t head, sim::RandomStream& random) {
  std::vector<double> weights(query + 1);
  double total = 0.0;
  for (std::uint64_t token = 0; token <= query; ++token) {
    const double distance = static_cast<double>(query - token);
    double weight = 0.05 * random.uniform_01() + std::exp(-distance / (4.0 + 6.0 * head + layer));
    if (token < 2) {
      weight += 2.0;  // sinks
    }
    if (token % (11 + 2 * head) == head + 3) {
      weight += 0.6 + 0.3 * head;  // this head's heavy hitters
    }
    weights[token] = weight;
    total += weight;
  }
  for (double& weight : weights) {
    weight /= total;
  }
  return weights;
}

struct RichShape {
  std::uint32_t layers = 3;
  std::uint64_t prompt = 120;
  std::uint64_t steps = 60;
  std::uint32_t heads = 4;
  std::uint32_t window = 32;   // prefill window (0: none)
  std::uint32_t kv_heads = 2;  // key norms (0: none)
  bool head_rows = true;
  bool same_heads = false;  // every head attends like head 0
};

// Head-mean rows are the mean of the per-head rows, as a captured trace's are.
inline replay::InMemoryAttention rich_attention(const RichShape& shape, std::uint64_t seed) {
  sim::RandomStream random(seed);
  std::vector<std::vector<std::vector<float>>> rows(shape.steps);
  std::vector<std::vector<std::vector<float>>> head_rows(shape.steps);
  for (std::uint64_t step = 0; step < shape.steps; ++step) {
    rows[step].resize(shape.layers);
    head_rows[step].resize(shape.layers);
    const std::uint64_t query = shape.prompt + step;
    for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
      std::vector<double> mean(query + 1, 0.0);
      std::vector<double> weights;
      for (std::uint32_t head = 0; head < shape.heads; ++head) {
        if (head == 0 || !shape.same_heads) {
          weights = synthetic_head_weights(query, layer, head, random);
        }
        for (std::uint64_t token = 0; token <= query; ++token) {
          mean[token] += weights[token] / shape.heads;
          head_rows[step][layer].push_back(static_cast<float>(weights[token]));
        }
      }
      rows[step][layer].assign(mean.begin(), mean.end());
    }
  }
  replay::InMemoryAttention source(shape.layers, shape.prompt, std::move(rows));
  if (shape.head_rows) {
    source.set_head_rows(shape.heads, std::move(head_rows));
  }
  if (shape.window > 0) {
    std::vector<std::vector<float>> window(shape.layers);
    for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
      for (std::uint32_t head = 0; head < shape.heads; ++head) {
        if (head > 0 && shape.same_heads) {
          const std::size_t one_head = static_cast<std::size_t>(shape.window) * shape.prompt;
          const std::vector<float> first(
              window[layer].begin(), window[layer].begin() + static_cast<std::ptrdiff_t>(one_head));
          window[layer].insert(window[layer].end(), first.begin(), first.end());
          continue;
        }
        for (std::uint32_t i = 0; i < shape.window; ++i) {
          const std::uint64_t query = shape.prompt - shape.window + i;
          auto weights = synthetic_head_weights(query, layer, head, random);
          weights.resize(shape.prompt, 0.0);  // zeros after the query's own position
          window[layer].insert(window[layer].end(), weights.begin(), weights.end());
        }
      }
    }
    source.set_prefill_window(shape.window, std::move(window));
  }
  if (shape.kv_heads > 0) {
    std::vector<std::vector<float>> norms(shape.layers);
    for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
      for (std::uint32_t head = 0; head < shape.kv_heads; ++head) {
        for (std::uint64_t token = 0; token < shape.prompt + shape.steps; ++token) {
          const double norm = 4.0 + 3.0 * random.uniform_01() + (token % 13 == 0 ? 5.0 : 0.0);
          norms[layer].push_back(static_cast<float>(norm));
        }
      }
    }
    source.set_key_norms(shape.kv_heads, std::move(norms));
  }
  return source;
}

// Wraps a policy so that tests can look at every token, not only the counts: `after` gets the
// placement after start() (step -1) and after every observe(); `before` gets the placement a
// step's attention ran against, before the policy moves tokens.
class CheckedPolicy final : public replay::Policy {
 public:
  using Placement = std::vector<replay::LayerPlacement>;
  using After = std::function<void(std::int64_t step, const Placement& placement)>;
  using Before = std::function<void(const replay::StepView& view, const Placement& placement)>;

  CheckedPolicy(std::unique_ptr<replay::Policy> inner, After after, Before before = nullptr)
      : inner_(std::move(inner)), after_(std::move(after)), before_(std::move(before)) {}

  [[nodiscard]] std::vector<replay::PolicyInput> inputs() const override {
    return inner_->inputs();
  }
  void load_inputs(replay::AttentionSource& source) override { inner_->load_inputs(source); }
  void start(const replay::ReplayShape& shape, Placement& placement) override {
    inner_->start(shape, placement);
    after_(-1, placement);
  }
  void observe(const replay::StepView& view, Placement& placement) override {
    if (before_) {
      before_(view, placement);
    }
    inner_->observe(view, placement);
    after_(static_cast<std::int64_t>(view.step), placement);
  }
  [[nodiscard]] double own_kept_mass(const replay::StepView& view,
                                     std::uint32_t layer) const override {
    return inner_->own_kept_mass(view, layer);
  }
  [[nodiscard]] replay::CompressedFormat compressed_format() const override {
    return inner_->compressed_format();
  }

 private:
  std::unique_ptr<replay::Policy> inner_;
  After after_;
  Before before_;
};

inline std::unique_ptr<replay::Policy> make_policy(const std::string& text,
                                                   const replay::AttentionSource& source,
                                                   std::string* canonical = nullptr) {
  const auto registry = replay::builtin_policies();
  return registry.create(replay::parse_policy_string(text),
                         {source.layers(), source.prompt_tokens(), source.steps()}, canonical);
}

inline replay::ReplayDemand run_policy(replay::AttentionSource& source, const std::string& text) {
  auto policy = make_policy(text, source);
  return replay::replay(source, *policy);
}

// A policy's per-layer budgets as its parameters spell them.
inline std::vector<std::uint64_t> budgets_of(
    const std::string& text, std::uint32_t layers,
    std::optional<std::uint64_t> compressed_prompt = std::nullopt) {
  const auto registry = replay::builtin_policies();
  const auto spec = replay::parse_policy_string(text);
  replay::PolicyParameters params(spec.name(), registry.find(spec.name())->params, spec);
  return replay::layer_budgets(params, layers, compressed_prompt);
}

// Attention kept at a step (T0–T2).
inline double kept_mass(const replay::ReplayDemand& demand, std::uint64_t step,
                        std::uint32_t layer) {
  return demand.at(step, layer).kept_share();
}

inline std::uint64_t held_tokens(const replay::ReplayDemand& demand, std::uint64_t step,
                                 std::uint32_t layer) {
  const auto& tokens = demand.at(step, layer).tokens;
  return tokens[0] + tokens[1] + tokens[2];
}

// The most any placement holding `held` earlier tokens keeps of `row`: the step's own token plus
// the `held` largest weights on earlier ones.
inline double oracle_bound(std::vector<float> row, std::uint64_t held) {
  const float own = row.back();
  row.pop_back();
  held = std::min<std::uint64_t>(held, row.size());
  std::nth_element(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(held), row.end(),
                   std::greater<>());
  double kept = own;
  for (std::uint64_t i = 0; i < held; ++i) {
    kept += row[i];
  }
  return kept;
}

}  // namespace kvtier::test
