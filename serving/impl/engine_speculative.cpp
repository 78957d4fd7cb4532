// Speculative decoding in the serving engine (engine.speculative): a drafter of the target's
// shape drafts tokens one pass at a time, the target verifies them in one forward pass, and each
// request's step gives the drafts it accepts in a row and one token more.

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/errors.hpp"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "sim/random.hpp"

namespace kvtier::serving {
namespace {

// One stream per request and step (RandomStream's purpose ids), so that what a step accepts
// depends on the run's seed, the request and how far it has got, not on the batch around it.
constexpr std::uint64_t kSpeculationStream = 0x5bec0de5;

}  // namespace

double draft_acceptance(const config::SpeculativeDecoding& speculative, std::uint32_t draft) {
  const auto& by_position = speculative.acceptance_by_position();
  if (!by_position.empty()) {
    return by_position[std::min<int>(static_cast<int>(draft), by_position.size() - 1)];
  }
  const double decay = speculative.has_acceptance_decay() ? speculative.acceptance_decay() : 1.0;
  // A multiplication a draft, in order, so that a rate is the same bits however it is asked for.
  double rate = speculative.acceptance_rate();
  for (std::uint32_t earlier = 0; earlier < draft; ++earlier) {
    rate *= decay;
  }
  return rate;
}

void ServingEngine::start_speculating(const config::RunSpec& run) {
  // Checked with the config (configs/impl/consistency.cpp); a run built in code is held to it
  // here.
  const auto refuse = [](const std::string& what) {
    throw ConfigError("speculative decoding with " + what + " is not modelled",
                      "field engine.speculative");
  };
  const config::SpeculativeDecoding& speculative = run.engine().speculative();
  const bool by_position = speculative.acceptance_by_position_size() > 0;
  if (speculative.has_acceptance_rate() == by_position ||
      (by_position && speculative.has_acceptance_decay())) {
    throw ConfigError(
        "speculative decoding needs exactly one of acceptance_rate and acceptance_by_position, "
        "acceptance_decay only with the rate",
        "field engine.speculative.acceptance_rate");
  }
  if (pipeline_stages(run) > 1) {
    refuse("pipeline_parallel_degree " + std::to_string(pipeline_stages(run)));
  }
  speculative_ = run.engine().speculative();
}

std::uint64_t ServingEngine::drafts(const Request& request) const {
  if (!speculative_) {
    return 0;
  }
  const std::uint64_t left = request.spec.output_tokens - request.generated;
  return std::min<std::uint64_t>(speculative_->draft_tokens(), left > 0 ? left - 1 : 0);
}

std::uint64_t ServingEngine::step_tokens(std::uint32_t id, const Request& request) const {
  const std::uint64_t drafted = drafts(request);
  if (drafted == 0) {
    return 1;
  }
  sim::RandomStream draws(run_.seed(),
                          kSpeculationStream ^ ((std::uint64_t{id} << 32) | request.generated));
  std::uint64_t accepted = 0;
  while (accepted < drafted &&
         draws.uniform_01() <
             draft_acceptance(*speculative_, static_cast<std::uint32_t>(accepted))) {
    ++accepted;
  }
  return accepted + 1;
}

sim::Tick ServingEngine::draft_passes(hw::IterationCost& cost) {
  const auto layers = static_cast<double>(run_.model().num_hidden_layers());
  const auto draft_layers = static_cast<std::int64_t>(speculative_->draft_layers());
  const double share = static_cast<double>(draft_layers) / layers;
  // Pass j drafts the (j + 1)-th token of the requests drafting that many, each attending its
  // context and the j tokens drafted before (the drafter's own KV of them).
  sim::Tick drafting = sim::Tick::zero();
  for (std::uint32_t pass = 0; pass < speculative_->draft_tokens(); ++pass) {
    hw::BatchShape step;
    prepare_gpu_decodes(step);
    for (const std::uint32_t id : decoding_now_) {
      const Request& request = requests_[id];
      if (drafts(request) > pass) {
        ++step.decode_tokens;
        add_decode_context(request, pass, step);
      }
    }
    if (step.decode_tokens == 0) {
      break;
    }
    step.logits_tokens = step.decode_tokens;
    const hw::IterationCost draft = cost_model_.cost(step);
    drafting += draft.layer * draft_layers + draft.head;
    cost.flops += (draft.flops - draft.head_flops) * share + draft.head_flops;
    cost.hbm_bytes += (draft.hbm_bytes - draft.head_hbm_bytes) * share + draft.head_hbm_bytes;
    cost.interconnect_bytes += draft.interconnect_bytes * share;
    cost.network_bytes += draft.network_bytes * share;
  }
  totals_.draft_busy += drafting;
  return drafting;
}

}  // namespace kvtier::serving
