#include "hwmodels/iteration_cost.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

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
  double network_bytes = 0.0;
  std::uint32_t kernels = 0;

  void add(const GpuModel& gpu, OpKind kind, const OpCost& cost, config::DType math) {
    const sim::Tick time = gpu.op_time(kind, cost, math);
    (kind == OpKind::kGemm ? gemm : kind == OpKind::kAttention ? attention : elementwise) += time;
    flops += cost.flops;
    hbm_bytes += cost.bytes;
    ++kernels;
  }

  void add_times(const Accumulator& other, std::int64_t times) {
    gemm += other.gemm * times;
    attention += other.attention * times;
    elementwise += other.elementwise * times;
    all_reduce += other.all_reduce * times;
    const auto scale = static_cast<double>(times);
    flops += other.flops * scale;
    hbm_bytes += other.hbm_bytes * scale;
    interconnect_bytes += other.interconnect_bytes * scale;
    network_bytes += other.network_bytes * scale;
    kernels += other.kernels * static_cast<std::uint32_t>(times);
  }
};

namespace {

// Engines that run their GEMMs in FP8 quantise each GEMM's input as they go and keep attention,
// norms and the activations between kernels in BF16 (vLLM's and SGLang's FP8 checkpoints, FP8
// Llama as DeepSeek-V3); other formats run throughout.
config::DType between_gemms(config::DType activation) {
  return activation == config::FP8_E4M3 || activation == config::FP8_E5M2 ? config::BF16
                                                                          : activation;
}

}  // namespace

IterationCostModel::IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                       const config::LinkSpec* gpu_link,
                                       std::uint32_t tensor_parallel)
    : IterationCostModel(model, gpu, gpu_link, tensor_parallel, AttentionSplit::kHeads) {}

IterationCostModel::IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                       const config::LinkSpec* gpu_link,
                                       std::uint32_t tensor_parallel, AttentionSplit split)
    : IterationCostModel(model, gpu, gpu_link, Parallelism{tensor_parallel, split}) {}

IterationCostModel::IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                       const config::LinkSpec* gpu_link,
                                       const Parallelism& parallelism)
    : IterationCostModel(model, gpu, GroupLinks{gpu_link}, parallelism) {}

IterationCostModel::IterationCostModel(const config::ModelSpec& model, const config::GpuSpec& gpu,
                                       const GroupLinks& links, const Parallelism& parallelism)
    : model_(model),
      gpu_(gpu),
      tp_(parallelism.gpus),
      split_(parallelism.attention),
      parallelism_(parallelism),
      weight_bytes_(config::dtype_bytes(model.weight_dtype())),
      expert_weight_bytes_(model.has_moe() &&
                                   model.moe().expert_weight_dtype() != config::DTYPE_UNSPECIFIED
                               ? config::dtype_bytes(model.moe().expert_weight_dtype())
                               : weight_bytes_),
      between_gemms_(between_gemms(model.activation_dtype())),
      activation_bytes_(config::dtype_bytes(between_gemms_)),
      kv_bytes_per_token_per_layer_(kv_bytes_per_token_per_layer(model)),
      gpus_per_node_(links.gpus_per_node == 0 ? parallelism.gpus
                                              : std::min(links.gpus_per_node, parallelism.gpus)),
      nodes_(1) {
  const std::uint32_t tensor_parallel = parallelism.gpus;
  if (parallelism.experts == ExpertSplit::kWhole && !model.has_moe()) {
    throw ConfigError("expert parallelism needs a mixture of experts (model.moe)",
                      "field engine.expert_parallel");
  }
  if (split_ == AttentionSplit::kRequests && !model.has_mla()) {
    throw ConfigError("data-parallel attention is modelled for latent attention (model.mla) only",
                      "field engine.data_parallel_attention");
  }
  if (links.gpu_link != nullptr) {
    gpu_link_ = *links.gpu_link;
  } else if (tensor_parallel > 1) {
    throw ConfigError("tensor parallelism over " + std::to_string(tensor_parallel) +
                      " GPUs needs a GPU-to-GPU link (the node's gpu_link)");
  }
  if (tensor_parallel > gpus_per_node_) {
    const std::string group = "tensor parallelism over " + std::to_string(tensor_parallel) +
                              " GPUs spans nodes of " + std::to_string(gpus_per_node_);
    if (tensor_parallel % gpus_per_node_ != 0) {
      throw ConfigError(group + ": it needs whole nodes", "field tensor_parallel_degree");
    }
    if (links.network == nullptr) {
      throw ConfigError(group + ": it needs the network between them", "field hardware.network");
    }
    network_ = *links.network;
    nodes_ = tensor_parallel / gpus_per_node_;
  }
}

void IterationCostModel::add_all_reduce(double bytes, Accumulator& layer) const {
  const double within = ring_all_reduce_bytes_per_gpu(gpus_per_node_, bytes);
  layer.interconnect_bytes += within;
  if (nodes_ == 1) {
    layer.all_reduce += ring_all_reduce_time(gpu_link_, gpus_per_node_, bytes);
    return;
  }
  layer.network_bytes += ring_all_reduce_bytes_per_gpu(nodes_, bytes / gpus_per_node_);
  layer.all_reduce +=
      hierarchical_all_reduce_time(gpu_link_, network_, gpus_per_node_, nodes_, bytes);
}

void IterationCostModel::add_all_to_all(double busiest_port_bytes, double sent,
                                        Accumulator& layer) const {
  if (nodes_ == 1) {
    layer.all_reduce += all_to_all_time(gpu_link_, tp_, busiest_port_bytes);
    layer.interconnect_bytes += sent;
    return;
  }
  // Of the other tp − 1 GPUs, gpus_per_node − 1 share the node; both parts move at once.
  const double others = tp_ - 1.0;
  const double within = (gpus_per_node_ - 1.0) / others;
  const sim::Tick nvlink = all_to_all_time(gpu_link_, gpus_per_node_, busiest_port_bytes * within);
  const sim::Tick network = all_to_all_time(network_, nodes_, busiest_port_bytes * (1.0 - within));
  layer.all_reduce += std::max(nvlink, network);
  layer.interconnect_bytes += sent * within;
  layer.network_bytes += sent * (1.0 - within);
}

// A layer's operations on the `tokens` of a batch, on one GPU of the tensor-parallel group.
struct IterationCostModel::LayerOps {
  const IterationCostModel& model;
  Accumulator& layer;
  double tokens;
  double gpus;  // how many GPUs split the weights of these operations

  // A GEMM of `in` x `out` weights split over TP GPUs, applied to `rows` tokens (Megatron's
  // split). Column-parallel (QKV, gate/up) reads the whole input and writes its slice of the
  // output; row-parallel (output, down projection) reads its slice of the input and writes a
  // whole partial output, which the all-reduce then sums. Replicated: every GPU computes it whole.
  enum class Split { kColumns, kRows, kReplicated };
  void gemm(double in, double out, Split split, double rows) const {
    const double tp = split == Split::kReplicated ? 1.0 : gpus;
    const double weights = in * out / tp;
    const double activations = split == Split::kRows ? in / tp + out : in + out / tp;
    layer.add(model.gpu_, OpKind::kGemm,
              OpCost{2.0 * rows * weights,
                     weights * model.weight_bytes_ + rows * activations * model.activation_bytes_},
              model.model_.activation_dtype());
  }
  void gemm(double in, double out, Split split) const { gemm(in, out, split, tokens); }
  // `heads` GEMMs of `in` x `out` weights each (one per head on this GPU), each applied to the
  // `rows` tokens' own slice of that head.
  void per_head_gemm(double heads, double in, double out, double rows) const {
    const double weights = heads * in * out;
    layer.add(model.gpu_, OpKind::kGemm,
              OpCost{2.0 * rows * weights, weights * model.weight_bytes_ +
                                               rows * heads * (in + out) * model.activation_bytes_},
              model.model_.activation_dtype());
  }
  void elementwise(double elements_read, double elements_written) const {
    layer.add(model.gpu_, OpKind::kElementwise,
              OpCost{0.0, (elements_read + elements_written) * model.activation_bytes_},
              model.model_.activation_dtype());
  }
  void attention(double flops, double bytes) const {
    layer.add(model.gpu_, OpKind::kAttention, OpCost{flops, bytes}, model.between_gemms_);
  }
  void all_reduce() const {
    if (model.tp_ > 1) {
      model.add_all_reduce(tokens * model.model_.hidden_size() * model.activation_bytes_, layer);
    }
  }
};

namespace {

// Query i of a prefill chunk (position before + i) attends min(before + i, W) keys; together
// the chunk reads the keys from before + 1 − W on: min(before + n, W + n − 1) of them.
struct ChunkReach {
  double attended = 0.0;  // (query, key) pairs
  double keys_read = 0.0;
};

// `global`: in a layer of a hybrid-attention model that attends the whole context.
ChunkReach chunk_reach(const config::ModelSpec& model, const PrefillChunk& chunk,
                       bool global = false) {
  const double n = static_cast<double>(chunk.tokens);
  const double before = static_cast<double>(chunk.context_before);
  if (!model.has_sliding_window() || global) {
    return {n * (before + (n + 1.0) / 2.0), before + n};
  }
  const auto window = static_cast<double>(model.sliding_window());
  const double unclipped = std::clamp(window - before, 0.0, n);  // queries with ≤ W keys
  return {unclipped * before + unclipped * (unclipped + 1.0) / 2.0 + (n - unclipped) * window,
          std::min(before + n, window + n - 1.0)};
}

double chunk_tokens(const std::vector<PrefillChunk>& chunks) {
  double tokens = 0.0;
  for (const auto& chunk : chunks) {
    tokens += static_cast<double>(chunk.tokens);
  }
  return tokens;
}

double batch_tokens(const BatchShape& batch) {
  return static_cast<double>(batch.tokens());
}

// The context that `queries` query tokens of `decode` requests attend in all, `context` being
// what one query of each attends (the requests' drafts attend as their newest token does): the
// mean request's context for each query, exact when the requests draft alike (fewer drafts
// near a request's end make it approximate).
double attended_by_queries(double context, double decode, double queries) {
  return queries == decode ? context : context * queries / decode;
}

}  // namespace

void IterationCostModel::add_layer(const BatchShape& batch, Mlp mlp, bool global,
                                   Accumulator& layer) const {
  using Split = LayerOps::Split;
  const double tp = tp_;
  const double tokens = batch_tokens(batch);
  const LayerOps ops{*this, layer, tokens, tp};
  const double hidden = model_.hidden_size();
  const double a = activation_bytes_;

  if (split_ == AttentionSplit::kRequests) {
    // No all-reduce after attention: each GPU has its tokens' whole output. They are gathered
    // to every GPU for the MLP and scattered back after it: a ring all-gather and a ring
    // reduce-scatter, together the bytes and hops of the all-reduce after the MLP.
    add_data_parallel_attention(batch, layer);
  } else if (model_.has_mla()) {
    ops.elementwise(tokens * hidden, tokens * hidden);  // input RMSNorm
    add_latent_attention(static_cast<double>(batch.decode_tokens),
                         static_cast<double>(batch.decode_tokens + batch.decode_draft_tokens),
                         static_cast<double>(batch.decode_context_tokens), batch.prefill, ops);
    ops.all_reduce();
  } else {
    ops.elementwise(tokens * hidden, tokens * hidden);  // input RMSNorm
    const double q_width = static_cast<double>(model_.num_attention_heads()) * model_.head_dim();
    // With more GPUs than KV heads each GPU computes its KV head's K and V, which
    // TP / kv_heads of them share: as many columns in all as if the heads were that many more.
    const double kv_copies = tp / kv_shards(model_, tp_, split_);
    const double kv_width =
        static_cast<double>(model_.num_key_value_heads()) * model_.head_dim() * kv_copies;
    ops.gemm(hidden, q_width + 2 * kv_width, Split::kColumns);  // fused QKV projection
    const double roped = tokens * (q_width + kv_width) / tp;
    if (model_.qk_norm()) {
      ops.elementwise(roped, roped);
    }
    ops.elementwise(roped, roped);  // RoPE

    // Attention: decode tokens read their requests' whole KV; prefill chunks attend causally.
    const double heads = model_.num_attention_heads() / tp;
    const double kv_per_token = kv_bytes_per_token_per_layer_ / kv_shards(model_, tp_, split_);
    if (batch.decode_tokens > 0) {
      const double context = static_cast<double>(global ? batch.decode_global_context_tokens
                                                        : batch.decode_context_tokens);
      const double decode = static_cast<double>(batch.decode_tokens);
      const double queries = static_cast<double>(batch.decode_tokens + batch.decode_draft_tokens);
      ops.attention(
          4.0 * heads * model_.head_dim() * attended_by_queries(context, decode, queries),
          context * kv_per_token + queries * kv_per_token + 2.0 * queries * q_width / tp * a);
    }
    for (const auto& chunk : batch.prefill) {
      const double n = static_cast<double>(chunk.tokens);
      const ChunkReach reach = chunk_reach(model_, chunk, global);
      ops.attention(4.0 * heads * model_.head_dim() * reach.attended,
                    reach.keys_read * kv_per_token + n * kv_per_token + 2.0 * n * q_width / tp * a);
    }
    ops.gemm(q_width, hidden, Split::kRows);  // output projection
    ops.all_reduce();
  }
  const auto dense_mlp = [&](const LayerOps& on, double width) {
    const double rows = on.tokens;
    on.gemm(hidden, 2 * width, Split::kColumns);  // fused gate and up projections
    on.elementwise(2 * rows * width / on.gpus, rows * width / on.gpus);  // SiLU(gate) * up
    on.gemm(width, hidden, Split::kRows);                                // down projection
  };
  if (mlp == Mlp::kExperts && split_ == AttentionSplit::kRequests &&
      parallelism_.experts == ExpertSplit::kWhole) {
    // Each GPU keeps its own tokens through the MLP: nothing gathered, nothing to all-reduce.
    OwnTokens own;
    const std::vector<std::vector<PrefillChunk>> chunks = chunks_per_gpu(batch);
    if (batch.decodes_by_gpu.empty()) {
      // The busiest GPU's decodes beside the most chunk tokens one GPU has.
      own.decode = busiest_decodes(batch).queries;
      for (const auto& own_chunks : chunks) {
        own.prefill = std::max(own.prefill, chunk_tokens(own_chunks));
      }
    } else {
      // Dispatched: the GPU with the most tokens of its own, decoding and prefilling.
      for (std::size_t gpu = 0; gpu < chunks.size(); ++gpu) {
        const OwnTokens mine{static_cast<double>(batch.decodes_by_gpu[gpu].queries()),
                             chunk_tokens(chunks[gpu])};
        if (mine.decode + mine.prefill > own.decode + own.prefill) {
          own = mine;
        }
      }
    }
    const double own_tokens = own.decode + own.prefill;
    const LayerOps mine{*this, layer, own_tokens, 1.0};
    mine.elementwise(own_tokens * hidden, own_tokens * hidden);  // post-attention RMSNorm
    add_expert_all_to_all(batch, own, layer);
    if (model_.moe().has_shared_expert_intermediate_size()) {
      dense_mlp(mine, model_.moe().shared_expert_intermediate_size());
    }
    return;
  }
  ops.elementwise(tokens * hidden, tokens * hidden);  // post-attention RMSNorm (+ residual)
  if (mlp == Mlp::kExperts) {
    add_experts(tokens, tokens, layer);
    if (model_.moe().has_shared_expert_intermediate_size()) {
      dense_mlp(ops, model_.moe().shared_expert_intermediate_size());
    }
  } else {
    dense_mlp(ops, model_.intermediate_size());
  }
  ops.all_reduce();
}

std::vector<std::vector<PrefillChunk>> IterationCostModel::chunks_per_gpu(
    const BatchShape& batch) const {
  std::vector<std::vector<PrefillChunk>> chunks(tp_);
  for (std::size_t i = 0; i < batch.prefill.size(); ++i) {
    const std::uint32_t gpu = batch.prefill[i].gpu;
    if (gpu != kAnyGpu && gpu >= tp_) {
      throw std::invalid_argument("a prefill chunk's GPU " + std::to_string(gpu) +
                                  " is not one of the group's " + std::to_string(tp_));
    }
    chunks[gpu == kAnyGpu ? i % tp_ : gpu].push_back(batch.prefill[i]);
  }
  return chunks;
}

IterationCostModel::BusiestDecodes IterationCostModel::busiest_decodes(
    const BatchShape& batch) const {
  const std::uint64_t whole_requests = (batch.decode_tokens + tp_ - 1) / tp_;
  const auto requests = static_cast<double>(whole_requests);
  // No drafts, or no requests to spread them over (and no 0 / 0).
  if (batch.decode_draft_tokens == 0 || batch.decode_tokens == 0) {
    return {requests, requests};
  }
  const auto decode = static_cast<double>(batch.decode_tokens);
  return {requests, requests * (decode + static_cast<double>(batch.decode_draft_tokens)) / decode};
}

namespace {

// The time of a GPU's own part of a layer with data-parallel attention.
template <typename Part>
sim::Tick own_time(const Part& part) {
  return part.gemm + part.attention + part.elementwise;
}

}  // namespace

void IterationCostModel::add_data_parallel_attention(const BatchShape& batch,
                                                     Accumulator& layer) const {
  const std::vector<Accumulator> parts = gpu_attention_parts(batch);
  const Accumulator* slowest = &parts.front();
  for (const Accumulator& part : parts) {
    if (own_time(part) > own_time(*slowest)) {
      slowest = &part;
    }
  }
  layer.add_times(*slowest, 1);
}

std::vector<IterationCostModel::Accumulator> IterationCostModel::gpu_attention_parts(
    const BatchShape& batch) const {
  const std::vector<std::vector<PrefillChunk>> chunks = chunks_per_gpu(batch);
  // Each GPU's decoding requests, the query tokens they verify and the context they attend.
  struct Decodes {
    double requests = 0.0;
    double queries = 0.0;
    double context = 0.0;
  };
  std::vector<Decodes> decodes;
  if (!batch.decodes_by_gpu.empty()) {
    // Dispatched: each GPU's own requests and chunks, as they are.
    for (const GpuDecodes& gpu : batch.decodes_by_gpu) {
      decodes.push_back({static_cast<double>(gpu.decode_tokens), static_cast<double>(gpu.queries()),
                         static_cast<double>(gpu.decode_context_tokens)});
    }
  } else {
    // The decoding requests spread as evenly as whole requests go: the busiest GPU attends
    // ceil(D / TP) of them, with their share of the context and of the drafts verified (taken
    // as the mean request's); the prefill chunks dealt out in turn (or to their GPUs). With
    // chunks dealt out, GPUs past them have the least work, so the first max(chunks, 1) hold
    // the slowest.
    const auto [requests, queries] = busiest_decodes(batch);
    const double context = batch.decode_tokens > 0
                               ? static_cast<double>(batch.decode_context_tokens) * requests /
                                     static_cast<double>(batch.decode_tokens)
                               : 0.0;
    const bool placed = std::any_of(batch.prefill.begin(), batch.prefill.end(),
                                    [](const PrefillChunk& chunk) { return chunk.gpu != kAnyGpu; });
    decodes.assign(placed ? tp_ : std::clamp<std::size_t>(batch.prefill.size(), 1, tp_),
                   Decodes{requests, queries, context});
  }
  std::vector<Accumulator> parts(decodes.size());
  for (std::size_t gpu = 0; gpu < decodes.size(); ++gpu) {
    const auto [decode, queries, context] = decodes[gpu];
    const double tokens = queries + chunk_tokens(chunks[gpu]);
    const LayerOps ops{*this, parts[gpu], tokens, 1.0};
    const double hidden = model_.hidden_size();
    ops.elementwise(tokens * hidden, tokens * hidden);  // input RMSNorm
    add_latent_attention(decode, queries, context, chunks[gpu], ops);
  }
  return parts;
}

void IterationCostModel::add_latent_attention(double decode, double queries, double context,
                                              const std::vector<PrefillChunk>& chunks,
                                              const LayerOps& ops) const {
  using Split = LayerOps::Split;
  const config::MultiHeadLatentAttention& mla = model_.mla();
  const double tokens = ops.tokens;
  const double hidden = model_.hidden_size();
  const double a = activation_bytes_;
  const double heads = static_cast<double>(model_.num_attention_heads()) / ops.gpus;
  const double all_heads = model_.num_attention_heads();
  const double latent = mla.kv_lora_rank();
  const double q_latent = mla.q_lora_rank();  // 0 without one
  const double rope = mla.qk_rope_head_dim();
  const double nope = mla.qk_nope_head_dim();
  const double value = mla.v_head_dim();
  // The latents are not split by heads: a GPU reads the whole latent of each token it attends.
  const double kv_per_token = kv_bytes_per_token_per_layer_;

  // The down-projections to the query's and the KV's latents (with the RoPE key), replicated,
  // then the latents' norms.
  ops.gemm(hidden, q_latent + latent + rope, Split::kReplicated);
  ops.elementwise(tokens * (q_latent + latent), tokens * (q_latent + latent));
  // The query of every head: from its latent, or from the hidden state without one.
  ops.gemm(q_latent > 0 ? q_latent : hidden, all_heads * (nope + rope), Split::kColumns);
  const double roped = tokens * (heads + 1.0) * rope;  // every query head's and the shared key's
  ops.elementwise(roped, roped);

  if (decode > 0) {
    // Absorbed: each head's query through its W_UK into the latent space, scores against the
    // latents and RoPE keys, the latents weighted by them, and back through W_UV: one shared
    // "KV head" of kv_lora_rank + qk_rope_head_dim for all query heads (FlashMLA's decode).
    ops.per_head_gemm(heads, nope, latent, queries);
    ops.attention(
        2.0 * heads * (2.0 * latent + rope) * attended_by_queries(context, decode, queries),
        (context + queries) * kv_per_token + queries * heads * (2.0 * latent + rope) * a);
    ops.per_head_gemm(heads, latent, value, queries);
  }
  for (const auto& chunk : chunks) {
    // Expanded: the latents of every key the chunk reads up-projected into each head's K and V
    // (kv_b_proj), then attention as multi-head attention of head widths nope + rope and v.
    const double n = static_cast<double>(chunk.tokens);
    const ChunkReach reach = chunk_reach(model_, chunk);
    ops.gemm(latent, all_heads * (nope + value), Split::kColumns, reach.keys_read);
    ops.attention(2.0 * heads * (nope + rope + value) * reach.attended,
                  reach.keys_read * heads * (nope + rope + value) * a + n * kv_per_token +
                      n * heads * (nope + rope + value) * a);
  }
  ops.gemm(all_heads * value, hidden, Split::kRows);  // output projection
}

void IterationCostModel::add_experts(double tokens, double own, Accumulator& layer) const {
  const config::DType math = model_.activation_dtype();
  const config::MixtureOfExperts& moe = model_.moe();
  const double hidden = model_.hidden_size();
  const double experts = moe.num_experts();
  const double per_token = moe.experts_per_token();
  const double width = moe.expert_intermediate_size();
  const double a = activation_bytes_;
  // The router's logits of the GPU's tokens, computed whole (a replicated layer, as vLLM's), and
  // the top-k of each token's.
  layer.add(gpu_, OpKind::kGemm,
            OpCost{2.0 * own * hidden * experts,
                   hidden * experts * weight_bytes_ + own * (hidden + experts) * a},
            math);
  // Every token's hidden state goes to its k experts: T·k rows through grouped GEMMs that read
  // each expert a row goes to once. Routed evenly, T tokens reach a given expert with
  // probability 1 − (1 − k/E)^T: k experts for one token, nearly all of them for a large batch.
  // Sliced, every GPU takes its slice of every expert (vLLM's fused MoE without expert
  // parallelism); whole, the busiest GPU its own experts' rows whole.
  const bool whole = parallelism_.experts == ExpertSplit::kWhole;
  const double slices = whole ? 1.0 : static_cast<double>(tp_);
  const double rows = expert_rows_on_busiest_gpu(model_, parallelism_, tokens);
  const double reached = experts_on_busiest_gpu(model_, parallelism_) *
                         (1.0 - std::pow(1.0 - per_token / experts, tokens));
  const auto grouped = [&](double in, double out, bool split_columns) {
    const double weights = reached * in * out / slices;
    const double activations = split_columns ? in + out / slices : in / slices + out;
    layer.add(gpu_, OpKind::kGemm,
              OpCost{2.0 * rows * in * out / slices,
                     weights * expert_weight_bytes_ + rows * activations * a},
              math);
  };
  grouped(hidden, 2 * width, true);  // the experts' gate and up projections
  layer.add(gpu_, OpKind::kElementwise, OpCost{0.0, 3.0 * rows * width / slices * a},
            math);                // SiLU(gate) * up
  grouped(width, hidden, false);  // their down projections
  // The outputs of each token's experts weighted by the router and summed: on every GPU its
  // partial sums of all tokens for the all-reduce, or its own tokens' k outputs sent back.
  const double summed =
      whole && split_ == AttentionSplit::kRequests ? own * (per_token + 1.0) : rows + tokens;
  layer.add(gpu_, OpKind::kElementwise, OpCost{0.0, summed * hidden * a}, math);
}

void IterationCostModel::add_expert_all_to_all(const BatchShape& batch, const OwnTokens& own,
                                               Accumulator& layer) const {
  const config::MixtureOfExperts& moe = model_.moe();
  const double hidden = model_.hidden_size();
  const double gpus = tp_;
  const double experts = moe.num_experts();
  const double picks = std::min<double>(moe.experts_per_token(), experts);
  const double on_gpu = experts_on_busiest_gpu(model_, parallelism_);
  // Drafts verified go as their request's newest token does.
  const auto decode = static_cast<double>(batch.decode_tokens + batch.decode_draft_tokens);
  const double prefill = batch_tokens(batch) - decode;
  const double others = (gpus - 1.0) / gpus;  // of what reaches a GPU, what other GPUs send
  // Decoding (low-latency kernels): a copy for each pick on another GPU, k·(1 − m/E) a token;
  // the busiest GPU receives its experts' rows from the others.
  const double decode_sent = own.decode * picks * (1.0 - on_gpu / experts);
  const double decode_received = expert_rows_on_busiest_gpu(model_, parallelism_, decode) * others;
  // Prefill (normal kernels): a copy for each other GPU a token's picks land on, whatever the
  // number of its experts there (a GPU is missed with probability C(E − m, k) / C(E, k) under
  // uniform routing); the busiest GPU receives the most of the other GPUs' tokens.
  const double missed = picks_on_busiest_gpu(model_, parallelism_).none;
  const double prefill_sent = own.prefill * (gpus - 1.0) * (1.0 - missed);
  const double prefill_received =
      tokens_reaching_busiest_gpu(model_, parallelism_, prefill * others);
  const auto all_to_all = [&](double bytes_per_value) {
    const double sent = (decode_sent + prefill_sent) * hidden * bytes_per_value;
    const double received = (decode_received + prefill_received) * hidden * bytes_per_value;
    add_all_to_all(std::max(sent, received), sent, layer);
    layer.all_reduce +=
        sim::from_seconds(parallelism_.expert_all_to_all_overhead_s, sim::Rounding::kUp);
  };
  // DeepEP moves FP8 (with a 4-byte scale for every 128 values) or BF16: dispatched in FP8 when
  // the experts' GEMMs run in FP8, combined back in BF16.
  const config::DType math = model_.activation_dtype();
  const bool fp8 = math == config::FP8_E4M3 || math == config::FP8_E5M2;
  constexpr double kBf16 = 2.0;
  all_to_all(fp8 ? 1.0 + 4.0 / 128.0 : kBf16);
  add_experts(decode + prefill, own.decode + own.prefill, layer);
  all_to_all(kBf16);
}

void IterationCostModel::add_head(const BatchShape& batch, Accumulator& total) const {
  const config::DType math = model_.activation_dtype();
  const double hidden = model_.hidden_size();
  const double vocab = model_.vocab_size();
  const double tokens = batch_tokens(batch);
  total.add(gpu_, OpKind::kElementwise, OpCost{0.0, tokens * hidden * activation_bytes_},
            math);  // embedding lookup
  const double logits = static_cast<double>(batch.logits_tokens);
  if (logits > 0) {
    total.add(gpu_, OpKind::kElementwise, OpCost{0.0, 2.0 * logits * hidden * activation_bytes_},
              math);  // final norm
    // The LM head stays in 16 bits in quantised checkpoints, and so does its GEMM.
    const double weights = vocab * hidden / tp_;
    total.add(
        gpu_, OpKind::kGemm,
        OpCost{2.0 * logits * weights, weights * embedding_bytes_per_weight(model_.weight_dtype()) +
                                           logits * (hidden + vocab / tp_) * activation_bytes_},
        between_gemms_);
  }
}

IterationCost IterationCostModel::cost(const BatchShape& batch) const {
  if (!batch.decodes_by_gpu.empty() &&
      (split_ != AttentionSplit::kRequests || batch.decodes_by_gpu.size() != tp_)) {
    throw std::invalid_argument("decodes of " + std::to_string(batch.decodes_by_gpu.size()) +
                                " GPUs need data-parallel attention over a group of as many (" +
                                std::to_string(tp_) + ")");
  }
  const auto layers = static_cast<std::int64_t>(model_.num_hidden_layers());
  const std::int64_t dense_layers =
      model_.has_moe() ? std::min<std::int64_t>(model_.moe().first_dense_layers(), layers) : layers;
  // With hybrid attention, of each kind of MLP's layers those that attend globally.
  const bool hybrid = has_hybrid_attention(model_);
  const auto global_among = [&](std::int64_t first_layers) -> std::int64_t {
    return hybrid ? global_attention_layers(model_, static_cast<std::uint32_t>(first_layers)) : 0;
  };
  const std::int64_t dense_global = global_among(dense_layers);
  const std::int64_t experts_global = global_among(layers) - dense_global;
  struct Kind {
    Mlp mlp;
    bool global;
    std::int64_t count;
  };
  const Kind kinds[] = {{Mlp::kDense, false, dense_layers - dense_global},
                        {Mlp::kDense, true, dense_global},
                        {Mlp::kExperts, false, layers - dense_layers - experts_global},
                        {Mlp::kExperts, true, experts_global}};
  Accumulator all_layers;
  Accumulator layer;
  for (const Kind& kind : kinds) {
    if (kind.count > 0) {
      layer = Accumulator{};
      add_layer(batch, kind.mlp, kind.global, layer);
      all_layers.add_times(layer, kind.count);
    }
  }
  Accumulator head;
  add_head(batch, head);
  IterationCost cost;
  cost.gemm = all_layers.gemm + head.gemm;
  cost.attention = all_layers.attention + head.attention;
  cost.elementwise = all_layers.elementwise + head.elementwise;
  cost.all_reduce = all_layers.all_reduce;
  cost.total = cost.gemm + cost.attention + cost.elementwise + cost.all_reduce;
  const sim::Tick layers_time =
      all_layers.gemm + all_layers.attention + all_layers.elementwise + all_layers.all_reduce;
  cost.layer = sim::Tick::ps(layers_time.picoseconds() / layers);
  // The same in every layer, or with hybrid attention the layers' mean.
  cost.layer_attention =
      hybrid ? sim::Tick::ps(all_layers.attention.picoseconds() / layers) : layer.attention;
  cost.head = head.gemm + head.attention + head.elementwise;
  cost.head_gemm = head.gemm;
  cost.head_flops = head.flops;
  cost.head_hbm_bytes = head.hbm_bytes;
  cost.head_kernels = head.kernels;
  cost.flops = all_layers.flops + head.flops;
  cost.hbm_bytes = all_layers.hbm_bytes + head.hbm_bytes;
  cost.interconnect_bytes = all_layers.interconnect_bytes;
  cost.network_bytes = all_layers.network_bytes;
  cost.kernels = all_layers.kernels + head.kernels;
  if (!batch.decodes_by_gpu.empty()) {
    // The same part in every layer (latent attention has no windowed layers), so that none is
    // lighter by more than `layer`, the layers' mean, holds.
    const std::vector<Accumulator> parts = gpu_attention_parts(batch);
    sim::Tick slowest;
    for (const Accumulator& part : parts) {
      slowest = std::max(slowest, own_time(part));
    }
    for (const Accumulator& part : parts) {
      cost.layer_lighter_by_gpu.push_back(slowest - own_time(part));
    }
  }
  return cost;
}

}  // namespace kvtier::hw
