#pragma once
// An engine iteration over pipeline stages (pipeline parallelism: vLLM's
// --pipeline-parallel-size). Each stage is a tensor-parallel group holding a contiguous slice of
// the layers (pipeline_stage_layers); the first holds the embedding, the last the LM head.
//
// An iteration's batch is split into as many micro-batches as there are stages. They follow one
// another through the stages, as vLLM V1 keeps that many batches in flight. Between stages a
// micro-batch's hidden states and residual cross: every GPU sends its 1/TP slice to its peer of
// the next stage, which all-gathers them. In steady state every micro-batch advances one step
// per round. A round lasts as long as the busiest stage takes for all the micro-batches, or as
// one micro-batch's trip through every stage and its sends, whichever is longer.

#include <cstdint>
#include <functional>
#include <vector>

#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"

namespace kvtier::hw {

// `batch` dealt out to `parts` micro-batches: decoding requests as evenly as whole ones go
// (their context in proportion, the first micro-batches taking one more), then each prefill
// chunk to the micro-batch the engine put it in (PrefillChunk::micro_batch), or when it chose
// none, in turn to the first micro-batch it fits beside what it holds, within
// `tokens_per_part` tokens (a micro-batch's budget, as the engine cut the chunks to fill them
// in order), or to the one with the fewest tokens when none has room or the budget is 0; the
// logits of prompts finishing dealt in turn to the micro-batches holding chunks. Micro-batch m is
// element m, empty or not.
// Of `decodes` decoding requests dealt out to `parts` micro-batches, micro-batch `part`'s: as
// evenly as whole requests go, the first ones taking one more. (The engine fills the
// micro-batches' budgets around them.)
[[nodiscard]] inline std::uint64_t micro_batch_decodes(std::uint64_t decodes, std::uint32_t parts,
                                                       std::uint32_t part) {
  return decodes / parts + (part < decodes % parts ? 1 : 0);
}

[[nodiscard]] std::vector<BatchShape> split_into_micro_batches(const BatchShape& batch,
                                                               std::uint32_t parts,
                                                               std::uint64_t tokens_per_part = 0);

// One stage's work on one micro-batch, for a caller that times it beyond its compute (the
// tier-aware engine, whose copies run over the stage's layers).
struct StageWork {
  std::uint32_t stage = 0;
  std::uint32_t first_layer = 0;  // the stage's layers: [first_layer, first_layer + layers)
  std::uint32_t layers = 0;
  std::uint32_t micro_batch = 0;           // element of split_into_micro_batches
  const IterationCost* compute = nullptr;  // the stage's own: the LM head on the last stage only
};
// How long a stage takes on a micro-batch: its compute's total, or with what the caller adds
// (the tier-aware engine's layer pipeline, which times the layers as `layers` x `layer`).
using StageTimer = std::function<sim::Tick(const StageWork&)>;

class PipelineCostModel {
 public:
  // `links`: the GPU link within a node and the network between nodes. With stages, every
  // stage's tensor-parallel group lies within a node (configs/impl/parallelism_checks.cpp); stages
  // meet over the GPU link within a node and over the network across nodes.
  // `micro_batch_tokens`: each micro-batch's token budget (0: none; split_into_micro_batches).
  PipelineCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                    const GroupLinks& links, const Parallelism& parallelism,
                    std::uint64_t micro_batch_tokens = 0);

  // A round of `batch` (one step of every request in it); with one stage, IterationCostModel's
  // cost of the iteration. Per-GPU figures are of the busiest stage's GPUs, but the sends
  // between stages, which are the mean GPU's; `micro_batches` counts those with work.
  // With `time_stage`, each stage's work on each micro-batch lasts what it says (the occupancy
  // and trips are of those times); without, its compute. With one stage it is not called: the
  // caller times the iteration's layers itself.
  [[nodiscard]] IterationCost cost(const BatchShape& batch,
                                   const StageTimer& time_stage = nullptr) const;
  [[nodiscard]] const GpuModel& gpu() const noexcept { return kinds_.front().model.gpu(); }
  [[nodiscard]] std::uint32_t stages() const noexcept { return stages_; }

 private:
  // Stages that cost alike: their layer count, dense layers and whether they hold the LM head.
  struct StageKind {
    IterationCostModel model;
    std::uint32_t count = 0;  // stages of this kind
    bool last = false;
    std::uint32_t layers = 0;
    std::uint32_t dense = 0;  // a mixture of experts' first dense layers among them
  };
  // One micro-batch's sends from a stage to the next, within a node or across.
  [[nodiscard]] sim::Tick send_time(const config::LinkSpec& link, double tokens) const;

  std::vector<StageKind> kinds_;
  std::vector<std::uint32_t> kind_of_stage_;  // index into kinds_
  std::vector<std::uint32_t> first_layer_of_stage_;
  std::uint32_t stages_ = 1;
  std::uint64_t micro_batch_tokens_ = 0;
  std::uint32_t tp_ = 1;
  double hidden_ = 0.0;
  double activation_bytes_ = 0.0;  // per value of the hidden states sent
  config::LinkSpec gpu_link_;
  config::LinkSpec network_;
  // Stage boundaries between nodes (the rest within one).
  std::uint32_t crossings_ = 0;
};

}  // namespace kvtier::hw
