#include "hwmodels/pipeline_cost.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"
#include "configs/dtype.hpp"
#include "hwmodels/collectives.hpp"

namespace kvtier::hw {
std::vector<BatchShape> split_into_micro_batches(const BatchShape& batch, std::uint32_t parts,
                                                 std::uint64_t tokens_per_part) {
  std::vector<BatchShape> micro(parts);
  std::vector<std::uint64_t> load(parts, 0);
  std::uint64_t context_left = batch.decode_context_tokens;
  std::uint64_t global_left = batch.decode_global_context_tokens;
  // Micro-batch m's share of a context sum, the last taking what is left.
  const auto share = [&](std::uint64_t sum, std::uint64_t left, std::uint32_t m) {
    return m + 1 == parts             ? left
           : batch.decode_tokens == 0 ? 0
                                      : sum * micro[m].decode_tokens / batch.decode_tokens;
  };
  for (std::uint32_t m = 0; m < parts; ++m) {
    BatchShape& part = micro[m];
    part.decode_tokens = micro_batch_decodes(batch.decode_tokens, parts, m);
    part.decode_context_tokens = share(batch.decode_context_tokens, context_left, m);
    context_left -= part.decode_context_tokens;
    part.decode_global_context_tokens = share(batch.decode_global_context_tokens, global_left, m);
    global_left -= part.decode_global_context_tokens;
    part.logits_tokens = part.decode_tokens;
    load[m] = part.decode_tokens;
  }
  std::vector<std::uint32_t> chunks_in(parts, 0);
  for (const PrefillChunk& chunk : batch.prefill) {
    if (chunk.micro_batch < parts) {
      micro[chunk.micro_batch].prefill.push_back(chunk);
      load[chunk.micro_batch] += chunk.tokens;
      ++chunks_in[chunk.micro_batch];
      continue;
    }
    auto chosen = static_cast<std::uint32_t>(
        std::find_if(load.begin(), load.end(),
                     [&](std::uint64_t tokens) {
                       return tokens_per_part > 0 && tokens + chunk.tokens <= tokens_per_part;
                     }) -
        load.begin());
    if (chosen == parts) {
      chosen =
          static_cast<std::uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    }
    micro[chosen].prefill.push_back(chunk);
    load[chosen] += chunk.tokens;
    ++chunks_in[chosen];
  }
  // The logits of prompts that finish (which chunks those are the shape does not say).
  std::uint64_t finishing =
      batch.logits_tokens - std::min(batch.logits_tokens, batch.decode_tokens);
  while (finishing > 0) {
    bool dealt = false;
    for (std::uint32_t m = 0; m < parts && finishing > 0; ++m) {
      if (micro[m].logits_tokens - micro[m].decode_tokens < chunks_in[m]) {
        ++micro[m].logits_tokens;
        --finishing;
        dealt = true;
      }
    }
    if (!dealt) {
      throw std::logic_error("a batch finishes more prompts than it has chunks");
    }
  }
  return micro;
}

PipelineCostModel::PipelineCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                     const GroupLinks& links, const Parallelism& parallelism,
                                     std::uint64_t micro_batch_tokens)
    : stages_(parallelism.pipeline_stages),
      micro_batch_tokens_(micro_batch_tokens),
      tp_(parallelism.gpus),
      hidden_(model.hidden_size()) {
  if (stages_ <= 1) {
    kinds_.push_back({IterationCostModel(model, gpu, links, parallelism), 1, true,
                      model.num_hidden_layers(), 0});
    return;
  }
  if (has_hybrid_attention(model)) {
    // A stage's share of the global layers depends on where it starts, which a stage's model
    // (pipeline_stage_model) does not say.
    throw ConfigError("pipeline stages are not modelled with hybrid attention (model " +
                          model.name() + " has sliding_window_pattern " +
                          std::to_string(model.sliding_window_pattern()) + ")",
                      "field pipeline_parallel_degree");
  }
  if (links.gpu_link != nullptr) {
    gpu_link_ = *links.gpu_link;
  }
  if (links.network != nullptr) {
    network_ = *links.network;
  }
  // Hidden states cross in the activations' format, 16 bits when the GEMMs run in FP8.
  activation_bytes_ = std::max(config::dtype_bytes(model.activation_dtype()), 2.0);
  Parallelism stage = parallelism;
  stage.pipeline_stages = 1;
  const std::uint32_t per_node = links.gpus_per_node;
  const bool spans_nodes = per_node > 0 && tp_ * stages_ > per_node;
  std::uint32_t layers_before = 0;
  for (std::uint32_t s = 0; s < stages_; ++s) {
    const config::ModelSpec part = pipeline_stage_model(model, stages_, s);
    const bool last = s + 1 == stages_;
    const std::uint32_t dense = part.moe().first_dense_layers();
    const auto same = std::find_if(kinds_.begin(), kinds_.end(), [&](const StageKind& kind) {
      return kind.last == last && kind.layers == part.num_hidden_layers() && kind.dense == dense;
    });
    first_layer_of_stage_.push_back(layers_before);
    layers_before += part.num_hidden_layers();
    if (same != kinds_.end()) {
      ++same->count;
      kind_of_stage_.push_back(static_cast<std::uint32_t>(same - kinds_.begin()));
    } else {
      kind_of_stage_.push_back(static_cast<std::uint32_t>(kinds_.size()));
      kinds_.push_back(
          {IterationCostModel(part, gpu, links, stage), 1, last, part.num_hidden_layers(), dense});
    }
    if (s > 0 && spans_nodes && (s * tp_) % per_node == 0) {
      ++crossings_;
    }
  }
  if ((crossings_ > 0 && links.network == nullptr) ||
      (crossings_ + 1 < stages_ && links.gpu_link == nullptr) ||
      (tp_ > 1 && links.gpu_link == nullptr)) {
    throw std::logic_error("pipeline stages need the links between them");
  }
}

sim::Tick PipelineCostModel::send_time(const config::LinkSpec& link, double tokens) const {
  // Hidden states and residual: each GPU sends its slice, the next stage gathers them.
  const double bytes = 2.0 * tokens * hidden_ * activation_bytes_;
  return point_to_point_time(link, bytes / tp_) + ring_all_gather_time(gpu_link_, tp_, bytes);
}

IterationCost PipelineCostModel::cost(const BatchShape& batch, const StageTimer& time_stage) const {
  if (stages_ <= 1) {
    return kinds_.front().model.cost(batch);
  }
  const std::vector<BatchShape> micro =
      split_into_micro_batches(batch, stages_, micro_batch_tokens_);
  std::vector<sim::Tick> occupancy(stages_);
  std::vector<IterationCost> sums(kinds_.size());
  std::vector<IterationCost> kind_costs(kinds_.size());
  sim::Tick longest_trip;
  double sent_per_gpu = 0.0;  // one stage's GPU, all micro-batches
  std::uint32_t with_work = 0;
  for (std::uint32_t m = 0; m < micro.size(); ++m) {
    const BatchShape& part = micro[m];
    if (part.tokens() == 0) {
      continue;
    }
    ++with_work;
    sim::Tick trip;
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      IterationCost& c = kind_costs[k];
      c = kinds_[k].model.cost(part);
      if (!kinds_[k].last) {
        // No LM head here (its embedding lookup, a sliver, stays on the first stage's count).
        c.total -= c.head;
        c.gemm -= c.head_gemm;
        c.elementwise -= c.head - c.head_gemm;
        c.flops -= c.head_flops;
        c.hbm_bytes -= c.head_hbm_bytes;
        c.kernels -= c.head_kernels;
        c.head = c.head_gemm = sim::Tick::zero();
        c.head_flops = c.head_hbm_bytes = 0.0;
        c.head_kernels = 0;
      }
      IterationCost& sum = sums[k];
      sum.gemm += c.gemm;
      sum.attention += c.attention;
      sum.elementwise += c.elementwise;
      sum.all_reduce += c.all_reduce;
      sum.layer += c.layer;
      sum.layer_attention += c.layer_attention;
      sum.head += c.head;
      sum.head_gemm += c.head_gemm;
      sum.head_flops += c.head_flops;
      sum.head_hbm_bytes += c.head_hbm_bytes;
      sum.head_kernels += c.head_kernels;
      sum.flops += c.flops;
      sum.hbm_bytes += c.hbm_bytes;
      sum.interconnect_bytes += c.interconnect_bytes;
      sum.network_bytes += c.network_bytes;
      sum.kernels += c.kernels;
    }
    for (std::uint32_t stage = 0; stage < stages_; ++stage) {
      const IterationCost& compute = kind_costs[kind_of_stage_[stage]];
      const sim::Tick busy =
          time_stage ? time_stage(StageWork{stage, first_layer_of_stage_[stage],
                                            kinds_[kind_of_stage_[stage]].layers, m, &compute})
                     : compute.total;
      occupancy[stage] += busy;
      trip += busy;
    }
    const auto tokens = static_cast<double>(part.tokens());
    const auto within = static_cast<std::int64_t>(stages_ - 1 - crossings_);
    trip += send_time(gpu_link_, tokens) * within;
    if (crossings_ > 0) {
      trip += send_time(network_, tokens) * static_cast<std::int64_t>(crossings_);
    }
    longest_trip = std::max(longest_trip, trip);
    sent_per_gpu += 2.0 * tokens * hidden_ * activation_bytes_ / tp_;
  }
  const auto busiest = static_cast<std::size_t>(
      std::max_element(occupancy.begin(), occupancy.end()) - occupancy.begin());
  IterationCost round = sums[kind_of_stage_[busiest]];
  round.total = std::max(occupancy[busiest], longest_trip);
  round.micro_batches = with_work;
  // Sends and gathers, the mean GPU's: every stage but the last sends each micro-batch on, every
  // stage but the first gathers it.
  const double sending = (stages_ - 1.0) / stages_;
  const double gathered = sent_per_gpu * (tp_ - 1.0) * sending;
  round.interconnect_bytes += sent_per_gpu * (stages_ - 1.0 - crossings_) / stages_ + gathered;
  round.network_bytes += sent_per_gpu * crossings_ / stages_;
  return round;
}

}  // namespace kvtier::hw
