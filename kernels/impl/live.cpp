// A live run with the tiered KV cache (kernels/live.hpp, docs/LIVE.md).
#include "kernels/live.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "common/errors.hpp"
#include "common/nearest_rank.hpp"
#include "kernels/divergence.hpp"
#include "replay/engine.hpp"
#include "replay/parameters.hpp"
#include "replay/policy.hpp"
#include "replay/registry.hpp"

namespace kvtier::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// Collects each decode step's attention as the replay's rows: per layer, the head mean of the
// probabilities over positions 0 .. query_position (zeros outside a sliding window and on
// evicted tokens), added head after head in float and scaled once, as the tracer does.
class StepRows final : public ForwardObserver {
 public:
  explicit StepRows(int layers) : rows(static_cast<std::size_t>(layers)) {}

  void on_attention(const AttentionStep& step) override {
    if (step.prefill) {
      return;
    }
    std::vector<float>& row = rows[static_cast<std::size_t>(step.layer)];
    row.assign(static_cast<std::size_t>(step.query_position) + 1, 0.0F);
    float* target = row.data() + step.first_key_position;
    for (int head = 0; head < step.query_heads; ++head) {
      const std::span<const float> weights = step.head_probabilities(head);
      for (int key = 0; key < step.key_count; ++key) {
        target[key] += weights[static_cast<std::size_t>(key)];
      }
    }
    const float scale = 1.0F / static_cast<float>(step.query_heads);
    for (int key = 0; key < step.key_count; ++key) {
      target[key] *= scale;
    }
  }

  std::vector<std::vector<float>> rows;
};

// Detaches the cache and observer however the run ends.
class Attachment {
 public:
  Attachment(Engine& engine, LiveKvCache& cache, ForwardObserver* observer)
      : engine_(engine), cache_(cache) {
    engine_.reset();
    cache_.attach(engine_);
    engine_.set_observer(observer);
  }
  ~Attachment() {
    // Detaching does not throw (the CUDA engine only waits for pending observer calls, which
    // run synchronously in a live run); an engine that did would terminate here.
    try {
      engine_.set_observer(nullptr);
      cache_.detach(engine_);
      engine_.reset();
    } catch (...) {
      std::terminate();
    }
  }
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;
  Attachment(Attachment&&) = delete;
  Attachment& operator=(Attachment&&) = delete;

 private:
  Engine& engine_;
  LiveKvCache& cache_;
};

PrefetchMode prefetch_of(const std::string& canonical) {
  return canonical.find("prefetch=differential") != std::string::npos ? PrefetchMode::kDifferential
                                                                      : PrefetchMode::kFull;
}

// The host tiers a live policy can place tokens in (T1, T2), from its canonical string:
// `tiered` offloads below hbm=1, to T2 the compress share and to T1 the rest; `monarch` pages
// cold tokens to T2; the others keep or evict.
std::pair<bool, bool> host_tiers_of(const std::string& canonical) {
  const config::PolicySpec policy = replay::parse_policy_string(canonical);
  const auto value = [&](const char* key, double otherwise) {
    for (const config::PolicyParam& param : policy.param()) {
      if (param.name() == key) {
        return param.has_integer()  ? static_cast<double>(param.integer())
               : param.has_number() ? param.number()
                                    : otherwise;
      }
    }
    return otherwise;
  };
  if (policy.name() == "tiered") {
    const bool offloads = value("hbm", 1.0) < 1.0;
    const double compress = value("compress", 0.0);
    return {offloads && compress < 1.0, offloads && compress > 0.0};
  }
  return {false, policy.name() == "monarch"};
}

}  // namespace

void check_live_policy(const std::string& name) {
  static const std::vector<std::string> supported = {"full", "tiered",  "streaming", "h2o",
                                                     "tova", "monarch", "dms"};
  if (std::find(supported.begin(), supported.end(), name) == supported.end()) {
    throw ConfigError("policy '" + name +
                      "' cannot run on the live cache (it runs: full, tiered, streaming, h2o, "
                      "tova, monarch:attend=all,compression=int8, dms)");
  }
}

double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  return values[nearest_rank_index(fraction, values.size())];
}

namespace {

// The follow mode's checks: the source and forced tokens must fit the run.
void check_follow(const LiveOptions& options, std::span<const std::int32_t> prompt) {
  const replay::AttentionSource& source = *options.follow;
  if (options.sampling.temperature != 0.0F) {
    throw ConfigError("a followed trace's tokens are forced: sampling does not apply to it");
  }
  if (prompt.size() != source.prompt_tokens()) {
    throw ConfigError(source.name() + " holds " + std::to_string(source.prompt_tokens()) +
                      " prompt tokens; the followed run was given " +
                      std::to_string(prompt.size()));
  }
  if (static_cast<std::uint64_t>(options.max_new_tokens) > source.steps()) {
    throw ConfigError(source.name() + " holds " + std::to_string(source.steps()) +
                      " decode steps; cannot follow it for " +
                      std::to_string(options.max_new_tokens) + " new tokens");
  }
  if (options.forced_tokens.size() != static_cast<std::size_t>(options.max_new_tokens)) {
    throw std::logic_error("run_live: follow mode needs one forced token per decode step");
  }
}

}  // namespace

LiveResult run_live(Engine& engine, Engine* reference, std::span<const std::int32_t> prompt,
                    const LiveOptions& options) {
  const config::ModelSpec& spec = engine.spec();
  if (options.max_new_tokens < 1) {
    throw ConfigError("max_new_tokens must be at least 1");
  }
  if (prompt.empty()) {
    throw ConfigError("the prompt holds no token");
  }
  const std::uint64_t positions =
      prompt.size() + static_cast<std::uint64_t>(options.max_new_tokens);
  if (positions > spec.max_position_embeddings()) {
    throw ConfigError(std::to_string(prompt.size()) + " prompt tokens + " +
                      std::to_string(options.max_new_tokens) +
                      " new tokens pass the model's max_position_embeddings (" +
                      std::to_string(spec.max_position_embeddings()) + ")");
  }
  if (reference == &engine) {
    throw std::logic_error("run_live: the reference must be another engine");
  }
  if (options.follow != nullptr) {
    check_follow(options, prompt);
  }
  Sampler sampler(options.sampling);
  Sampler reference_sampler(options.sampling);
  check_live_policy(options.policy.name());
  const auto layers = static_cast<std::uint32_t>(spec.num_hidden_layers());
  const replay::ReplayShape shape{layers, prompt.size(),
                                  static_cast<std::uint64_t>(options.max_new_tokens)};
  LiveResult result;
  const std::unique_ptr<replay::Policy> policy =
      replay::builtin_policies().create(options.policy, shape, &result.policy);
  if (!policy->inputs().empty()) {
    throw ConfigError("policy '" + result.policy + "' reads " +
                      std::string(replay::describe(policy->inputs().front())) +
                      ", which a live run does not provide");
  }
  if (options.policy.name() == "monarch" && result.policy.find("attend=all") == std::string::npos) {
    throw ConfigError(
        "monarch:attend=hot leaves cold pages out of attention, which the live "
        "cache does not model (it reads T2): use monarch:attend=all,compression=int8");
  }
  result.prefetch = prefetch_of(result.policy);
  result.prompt_tokens = prompt.size();
  result.followed_trace = options.follow != nullptr;
  result.demand = replay::ReplayDemand(layers, shape.steps);
  // The cache stores T2 in one format; a policy declaring another would be measured as if it
  // were this one.
  if (policy->compressed_format() != replay::kInt8HeadScaled) {
    throw ConfigError("policy '" + result.policy +
                      "' stores T2 in a format the live cache does not (it stores int8 codes "
                      "with a float32 scale per head vector; monarch: compression=int8)");
  }
  result.demand.set_compressed_format(policy->compressed_format());

  TieredCacheOptions cache_options;
  cache_options.prefetch = result.prefetch;
  cache_options.t0_budget_bytes = options.t0_budget_bytes;
  cache_options.max_positions = positions;
  cache_options.copies = options.copies;
  cache_options.recode_threads = options.recode_threads;
  cache_options.staging_lookahead = options.staging_lookahead;
  std::tie(cache_options.reserve_t1, cache_options.reserve_t2) = host_tiers_of(result.policy);
  const std::unique_ptr<LiveKvCache> owned_cache = make_live_cache(engine, cache_options);
  LiveKvCache& cache = *owned_cache;
  result.t0_budget_bytes = cache.t0_budget_bytes();
  // A followed run's policy reads the trace, so the engine's attention is not observed (its
  // copies would only add to the measured step).
  StepRows live_rows(static_cast<int>(layers));
  const Attachment attachment(engine, cache, options.follow != nullptr ? nullptr : &live_rows);
  if (reference != nullptr) {
    reference->reset();
    reference->reserve(static_cast<int>(positions));
  }
  // Follow mode: the source's rows, projected onto the model's layers.
  std::vector<std::uint32_t> layer_map;
  std::vector<std::vector<float>> source_rows;
  std::vector<std::vector<float>> followed_rows;
  if (options.follow != nullptr) {
    layer_map = replay::project_layers(options.follow->layers(), layers);
    followed_rows.resize(layers);
  }

  const auto prefill_start = Clock::now();
  std::span<const float> logits = engine.prefill(prompt);
  // The tiered run's own choice: the token it runs next, unless it follows a trace.
  std::int32_t choice = sampler.sample(logits);
  std::int32_t token = options.follow != nullptr ? options.forced_tokens.front() : choice;
  policy->start(shape, cache.placement());
  result.demand.record_start(cache.placement());
  cache.apply_placement();
  result.prefill_seconds = std::chrono::duration<double>(Clock::now() - prefill_start).count();
  std::span<const float> reference_logits;
  if (reference != nullptr) {
    reference_logits = reference->prefill(prompt);
    result.has_reference = true;
  }
  bool agreeing = reference == nullptr || reference_sampler.sample(reference_logits) == choice;
  if (agreeing && reference != nullptr) {
    result.agreement = 1;
  }

  replay::ReplayStepper stepper(*policy, layers);
  const std::vector<std::vector<float>> no_head_rows;
  double kl_sum = 0.0;
  for (int step = 0; step < options.max_new_tokens; ++step) {
    const auto step_index = static_cast<std::uint64_t>(step);
    result.tokens.push_back(token);
    const TieredCacheStats before = cache.stats();
    // Reading the followed trace is not part of the step: it stands in for the model's attention.
    const std::vector<std::vector<float>>* rows = &live_rows.rows;
    if (options.follow != nullptr) {
      options.follow->read_step(step_index, source_rows);
      for (std::uint32_t l = 0; l < layers; ++l) {
        followed_rows[l] = source_rows[layer_map[l]];
      }
      rows = &followed_rows;
    }
    const auto start = Clock::now();
    logits = engine.decode(token);
    const std::span<replay::StepLayerRecord> records = result.demand.step_records(step_index);
    stepper.step(step_index, *rows, no_head_rows, 0, cache.placement(), records, false);
    cache.apply_placement();
    // The CUDA backend's stats() waits for the step's copies, which belong to the step.
    const TieredCacheStats& after = cache.stats();
    result.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    LiveStep& figures = result.steps.emplace_back();
    figures.h2d_bytes = after.h2d().bytes - before.h2d().bytes;
    figures.d2h_bytes = after.d2h_offload.bytes - before.d2h_offload.bytes;
    figures.h2d_seconds = after.h2d().seconds - before.h2d().seconds;
    figures.d2h_seconds = after.d2h_offload.seconds - before.d2h_offload.seconds;
    for (const replay::StepLayerRecord& record : records) {
      for (std::size_t tier = 0; tier < replay::kTierCount; ++tier) {
        figures.tier_token_layers[tier] += record.tokens[tier];
      }
      figures.kept_mass += record.kept_share();
    }
    figures.kept_mass /= static_cast<double>(layers);

    choice = sampler.sample(logits);
    const std::int32_t next = options.follow != nullptr && step + 1 < options.max_new_tokens
                                  ? options.forced_tokens[static_cast<std::size_t>(step) + 1]
                                  : choice;
    if (options.keep_logits) {
      result.logits.emplace_back(logits.begin(), logits.end());
    }
    if (reference != nullptr) {
      reference_logits = reference->decode(token);
      const double kl = kl_divergence(reference_logits, logits);
      kl_sum += kl;
      result.max_kl = std::max(result.max_kl, kl);
      if (std::equal(logits.begin(), logits.end(), reference_logits.begin(),
                     reference_logits.end())) {
        ++result.identical_logit_steps;
      }
      // The choice after step + 1 agrees while every earlier one did; until then both samplers
      // have drawn the same numbers.
      agreeing = agreeing && reference_sampler.sample(reference_logits) == choice;
      if (agreeing && step + 1 < options.max_new_tokens) {
        ++result.agreement;
      }
    }
    token = next;
  }
  if (reference != nullptr) {
    result.mean_kl = kl_sum / static_cast<double>(options.max_new_tokens);
  }
  result.cache = cache.stats();
  result.allocation = cache.allocation();
  for (std::uint32_t l = 0; l < layers; ++l) {
    for (std::size_t tier = 0; tier < replay::kTierCount; ++tier) {
      result.final_tier_tokens[tier] += cache.placement()[l].count(static_cast<replay::Tier>(tier));
    }
  }
  return result;
}

}  // namespace kvtier::kernels
