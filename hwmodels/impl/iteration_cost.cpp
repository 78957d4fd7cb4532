#include "hwmodels/iteration_cost.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "configs/dtype.hpp"
#include "hwmodels/collectives.hpp"
#include "hwmodels/model_shape.hpp"

namespace kvtier::hw {

struct IterationCostModel::Accumulator {
  sim::Tick gemm;
  sim::Tick attention;
  sim::Tick elementwise;
  sim::Tick all_reduce;
  double flops = 0.0;
  double hbm_bytes = 0.0;
  double interconnect_bytes = 0.0;
  std::uint32_t kernels = 0;

  void add(const GpuModel& gpu, OpKind kind, const OpCost& cost, config::DType math) {
    const sim::Tick time = gpu.op_time(kind, cost, math);
    (kind == OpKind::kGemm ? gemm : kind == OpKind::kAttention ? attention : elementwise) += time;
    flops += cost.flops;
    hbm_bytes += cost.bytes;
    ++kernels;
  }
};

IterationCostModel::IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                       const config::LinkSpec* gpu_link,
                                       std::uint32_t tensor_parallel)
    : model_(model),
      gpu_(gpu),
      tp_(tensor_parallel),
      weight_bytes_(config::dtype_bytes(model.weight_dtype())),
      activation_bytes_(config::dtype_bytes(model.activation_dtype())),
      kv_bytes_per_token_per_layer_(kv_bytes_per_token_per_layer(model)) {
  if (gpu_link != nullptr) {
    gpu_link_ = *gpu_link;
  } else if (tensor_parallel > 1) {
    throw ConfigError("tensor parallelism over " + std::to_string(tensor_parallel) +
                      " GPUs needs a GPU-to-GPU link (the node's gpu_link)");
  }
}

void IterationCostModel::add_layer(const BatchShape& batch, Accumulator& layer) const {
  const config::DType math = model_.activation_dtype();
  const double tp = tp_;
  double tokens = static_cast<double>(batch.decode_tokens);
  for (const auto& chunk : batch.prefill) {
    tokens += static_cast<double>(chunk.tokens);
  }
  const double hidden = model_.hidden_size();
  const double q_width = static_cast<double>(model_.num_attention_heads()) * model_.head_dim();
  const double kv_width = static_cast<double>(model_.num_key_value_heads()) * model_.head_dim();
  const double ffn = model_.intermediate_size();
  const double a = activation_bytes_;

  // A GEMM of `in` x `out` weights split over TP GPUs, applied to every token of the batch
  // (Megatron's split). Column-parallel (QKV, gate/up) reads the whole input and writes its slice
  // of the output; row-parallel (output, down projection) reads its slice of the input and writes
  // a whole partial output, which the all-reduce then sums.
  enum class Split { kColumns, kRows };
  auto gemm = [&](double in, double out, Split split) {
    const double weights = in * out / tp;
    const double activations = split == Split::kColumns ? in + out / tp : in / tp + out;
    layer.add(gpu_, OpKind::kGemm,
              OpCost{2.0 * tokens * weights, weights * weight_bytes_ + tokens * activations * a},
              math);
  };
  auto elementwise = [&](double elements_read, double elements_written) {
    layer.add(gpu_, OpKind::kElementwise, OpCost{0.0, (elements_read + elements_written) * a},
              math);
  };

  elementwise(tokens * hidden, tokens * hidden);          // input RMSNorm
  gemm(hidden, q_width + 2 * kv_width, Split::kColumns);  // fused QKV projection
  if (model_.qk_norm()) {
    elementwise(tokens * (q_width + kv_width) / tp, tokens * (q_width + kv_width) / tp);
  }
  elementwise(tokens * (q_width + kv_width) / tp, tokens * (q_width + kv_width) / tp);  // RoPE

  // Attention: decode tokens read their requests' whole KV; prefill chunks attend causally.
  const double heads = model_.num_attention_heads() / tp;
  const double kv_per_token = kv_bytes_per_token_per_layer_ / tp;
  if (batch.decode_tokens > 0) {
    const double context = static_cast<double>(batch.decode_context_tokens);
    const double decode = static_cast<double>(batch.decode_tokens);
    layer.add(
        gpu_, OpKind::kAttention,
        OpCost{4.0 * heads * model_.head_dim() * context,
               context * kv_per_token + decode * kv_per_token + 2.0 * decode * q_width / tp * a},
        math);
  }
  for (const auto& chunk : batch.prefill) {
    const double n = static_cast<double>(chunk.tokens);
    const double before = static_cast<double>(chunk.context_before);
    // Query i of the chunk (position before + i) attends min(before + i, W) keys; together the
    // chunk reads the keys from before + 1 − W on: min(before + n, W + n − 1) of them.
    double attended = n * (before + (n + 1.0) / 2.0);
    double keys_read = before + n;
    if (model_.has_sliding_window()) {
      const auto window = static_cast<double>(model_.sliding_window());
      const double unclipped = std::clamp(window - before, 0.0, n);  // queries with ≤ W keys
      attended =
          unclipped * before + unclipped * (unclipped + 1.0) / 2.0 + (n - unclipped) * window;
      keys_read = std::min(before + n, window + n - 1.0);
    }
    layer.add(gpu_, OpKind::kAttention,
              OpCost{4.0 * heads * model_.head_dim() * attended,
                     keys_read * kv_per_token + n * kv_per_token + 2.0 * n * q_width / tp * a},
              math);
  }

  gemm(q_width, hidden, Split::kRows);  // output projection
  if (tp_ > 1) {
    const double bytes = tokens * hidden * a;
    layer.all_reduce += ring_all_reduce_time(gpu_link_, tp_, bytes);
    layer.interconnect_bytes += ring_all_reduce_bytes_per_gpu(tp_, bytes);
  }
  elementwise(tokens * hidden, tokens * hidden);  // post-attention RMSNorm (+ residual)
  const auto dense_mlp = [&](double width) {
    gemm(hidden, 2 * width, Split::kColumns);                   // fused gate and up projections
    elementwise(2 * tokens * width / tp, tokens * width / tp);  // SiLU(gate) * up
    gemm(width, hidden, Split::kRows);                          // down projection
  };
  if (model_.has_moe()) {
    add_experts(tokens, layer);
    if (model_.moe().has_shared_expert_intermediate_size()) {
      dense_mlp(model_.moe().shared_expert_intermediate_size());
    }
  } else {
    dense_mlp(ffn);
  }
  if (tp_ > 1) {
    const double bytes = tokens * hidden * a;
    layer.all_reduce += ring_all_reduce_time(gpu_link_, tp_, bytes);
    layer.interconnect_bytes += ring_all_reduce_bytes_per_gpu(tp_, bytes);
  }
}

void IterationCostModel::add_experts(double tokens, Accumulator& layer) const {
  const config::DType math = model_.activation_dtype();
  const config::MixtureOfExperts& moe = model_.moe();
  const double tp = tp_;
  const double hidden = model_.hidden_size();
  const double experts = moe.num_experts();
  const double per_token = moe.experts_per_token();
  const double width = moe.expert_intermediate_size();
  const double a = activation_bytes_;
  // The router's logits, computed whole on every GPU (a replicated layer, as vLLM's), and the
  // top-k of each token's.
  layer.add(gpu_, OpKind::kGemm,
            OpCost{2.0 * tokens * hidden * experts,
                   hidden * experts * weight_bytes_ + tokens * (hidden + experts) * a},
            math);
  // Every token's hidden state goes to its k experts: T·k rows through grouped GEMMs that read
  // each expert a row goes to once. Routed evenly, T tokens reach E·(1 − (1 − k/E)^T) distinct
  // experts in expectation: k of them for one token, nearly all of them for a large batch.
  // Tensor parallelism splits every expert (vLLM's fused MoE without expert parallelism).
  const double rows = tokens * per_token;
  const double reached = experts * (1.0 - std::pow(1.0 - per_token / experts, tokens));
  const auto grouped = [&](double in, double out, bool split_columns) {
    const double weights = reached * in * out / tp;
    const double activations = split_columns ? in + out / tp : in / tp + out;
    layer.add(gpu_, OpKind::kGemm,
              OpCost{2.0 * rows * in * out / tp, weights * weight_bytes_ + rows * activations * a},
              math);
  };
  grouped(hidden, 2 * width, true);  // the experts' gate and up projections
  layer.add(gpu_, OpKind::kElementwise, OpCost{0.0, 3.0 * rows * width / tp * a},
            math);                // SiLU(gate) * up
  grouped(width, hidden, false);  // their down projections
  layer.add(gpu_, OpKind::kElementwise, OpCost{0.0, (rows + tokens) * hidden * a},
            math);  // the k outputs of each token weighted by the router and summed
}

void IterationCostModel::add_head(const BatchShape& batch, Accumulator& total) const {
  const config::DType math = model_.activation_dtype();
  const double hidden = model_.hidden_size();
  const double vocab = model_.vocab_size();
  double tokens = static_cast<double>(batch.decode_tokens);
  for (const auto& chunk : batch.prefill) {
    tokens += static_cast<double>(chunk.tokens);
  }
  total.add(gpu_, OpKind::kElementwise, OpCost{0.0, tokens * hidden * activation_bytes_},
            math);  // embedding lookup
  const double logits = static_cast<double>(batch.logits_tokens);
  if (logits > 0) {
    total.add(gpu_, OpKind::kElementwise, OpCost{0.0, 2.0 * logits * hidden * activation_bytes_},
              math);  // final norm
    const double weights = vocab * hidden / tp_;
    total.add(gpu_, OpKind::kGemm,
              OpCost{2.0 * logits * weights,
                     weights * weight_bytes_ + logits * (hidden + vocab / tp_) * activation_bytes_},
              math);
  }
}

IterationCost IterationCostModel::cost(const BatchShape& batch) const {
  Accumulator layer;
  add_layer(batch, layer);
  const auto layers = static_cast<std::int64_t>(model_.num_hidden_layers());
  Accumulator head;
  add_head(batch, head);
  IterationCost cost;
  cost.gemm = layer.gemm * layers + head.gemm;
  cost.attention = layer.attention * layers + head.attention;
  cost.elementwise = layer.elementwise * layers + head.elementwise;
  cost.all_reduce = layer.all_reduce * layers;
  cost.total = cost.gemm + cost.attention + cost.elementwise + cost.all_reduce;
  cost.layer = layer.gemm + layer.attention + layer.elementwise + layer.all_reduce;
  cost.layer_attention = layer.attention;
  cost.head = head.gemm + head.attention + head.elementwise;
  cost.flops = layer.flops * static_cast<double>(layers) + head.flops;
  cost.hbm_bytes = layer.hbm_bytes * static_cast<double>(layers) + head.hbm_bytes;
  cost.interconnect_bytes = layer.interconnect_bytes * static_cast<double>(layers);
  cost.kernels = layer.kernels * static_cast<std::uint32_t>(layers) + head.kernels;
  return cost;
}

}  // namespace kvtier::hw
