// Rules that relate several fields of one config (or a config and the hardware it runs on).

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "configs/dtype.hpp"
#include "configs/impl/parallelism_checks.hpp"
#include "configs/loader.hpp"
#include "configs/pools.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "configs/schema/policy.pb.h"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"
#include "configs/schema/workload.pb.h"
#include "configs/validate.hpp"

namespace kvtier::config::detail {
namespace {

namespace pb = google::protobuf;

using Problems = std::vector<Problem>;

// Multi-head latent attention fixes the per-head shapes the spec also states: they must agree,
// and what kvtier costs for it (no biases, no q/k norms, global attention) must hold.
void check_latent_attention(const ModelSpec& model, const std::string& path, Problems& problems) {
  const MultiHeadLatentAttention& mla = model.mla();
  if (model.num_key_value_heads() != model.num_attention_heads()) {
    problems.push_back(
        {at(path, "num_key_value_heads"),
         "with mla, num_key_value_heads " + std::to_string(model.num_key_value_heads()) +
             " must equal num_attention_heads " + std::to_string(model.num_attention_heads()) +
             " (every head has its own keys, expanded from the latent)"});
  }
  if (model.has_head_dim() && mla.has_qk_nope_head_dim() && mla.has_qk_rope_head_dim() &&
      model.head_dim() != mla.qk_nope_head_dim() + mla.qk_rope_head_dim()) {
    problems.push_back({at(path, "head_dim"),
                        "with mla, head_dim " + std::to_string(model.head_dim()) +
                            " must be qk_nope_head_dim + qk_rope_head_dim = " +
                            std::to_string(mla.qk_nope_head_dim() + mla.qk_rope_head_dim())});
  }
  const std::pair<bool, const char*> unsupported[] = {
      {model.attention_bias(), "attention_bias"},
      {model.qk_norm(), "qk_norm"},
      {model.has_sliding_window(), "sliding_window"}};
  for (const auto& [set, field] : unsupported) {
    if (set) {
      problems.push_back({at(path, field), std::string("kvtier models latent attention (mla) "
                                                       "without ") +
                                               field});
    }
  }
}

// Group-limited routing: equal groups, as many picks as the chosen groups hold.
void check_expert_groups(const MixtureOfExperts& moe, const std::string& path, Problems& problems) {
  if (moe.has_expert_groups() != moe.has_groups_per_token()) {
    problems.push_back(
        {at(path, moe.has_expert_groups() ? "moe.groups_per_token" : "moe.expert_groups"),
         "group-limited routing needs both moe.expert_groups and "
         "moe.groups_per_token"});
    return;
  }
  if (!moe.has_expert_groups() || moe.expert_groups() == 0 || !moe.has_num_experts()) {
    return;
  }
  const uint32_t groups = moe.expert_groups();
  if (moe.num_experts() % groups != 0) {
    problems.push_back({at(path, "moe.expert_groups"),
                        "expert_groups " + std::to_string(groups) + " does not divide the " +
                            std::to_string(moe.num_experts()) + " experts"});
    return;
  }
  if (moe.groups_per_token() == 0) {
    return;  // below its minimum, reported on its own
  }
  if (moe.groups_per_token() > groups) {
    problems.push_back({at(path, "moe.groups_per_token"),
                        "groups_per_token " + std::to_string(moe.groups_per_token()) +
                            " exceeds expert_groups " + std::to_string(groups)});
    return;
  }
  const uint64_t reachable =
      static_cast<uint64_t>(moe.groups_per_token()) * (moe.num_experts() / groups);
  if (moe.has_experts_per_token() && moe.experts_per_token() > reachable) {
    problems.push_back({at(path, "moe.experts_per_token"),
                        "experts_per_token " + std::to_string(moe.experts_per_token()) +
                            " exceeds the " + std::to_string(reachable) + " experts in " +
                            "groups_per_token " + std::to_string(moe.groups_per_token()) +
                            " of expert_groups " + std::to_string(groups)});
  }
}

void check_model(const ModelSpec& model, const std::string& path, Problems& problems) {
  if (!model.has_num_attention_heads() || !model.has_num_key_value_heads()) {
    return;  // reported as missing already
  }
  const uint32_t heads = model.num_attention_heads();
  const uint32_t kv_heads = model.num_key_value_heads();
  if (kv_heads > 0 && heads % kv_heads != 0) {
    problems.push_back({at(path, "num_key_value_heads"),
                        "num_key_value_heads " + std::to_string(kv_heads) +
                            " does not divide num_attention_heads " + std::to_string(heads) +
                            " (grouped-query attention needs whole groups)"});
  }
  // head_dim × num_attention_heads need not be hidden_size: transformers' Llama, Mistral and
  // Qwen configs all take an explicit head_dim (Mistral-NeMo: 32 × 128 against 5120, Qwen3).
  const bool has_qk_norm = model.architecture() == QWEN3 || model.architecture() == GEMMA3;
  if (model.has_qk_norm() && model.architecture() != ARCHITECTURE_UNSPECIFIED &&
      model.qk_norm() != has_qk_norm) {
    problems.push_back(
        {at(path, "qk_norm"),
         model.qk_norm() ? "qk_norm is only supported by the QWEN3 and GEMMA3 "
                           "architectures"
                         : Architecture_Name(model.architecture()) + " models have qk_norm: true"});
  }
  if (model.has_sliding_window_pattern() && !model.has_sliding_window()) {
    problems.push_back({at(path, "sliding_window_pattern"),
                        "sliding_window_pattern " + std::to_string(model.sliding_window_pattern()) +
                            " needs the sliding_window its other layers attend within"});
  }
  if (model.has_sliding_window_pattern() && model.has_num_hidden_layers() &&
      model.sliding_window_pattern() > model.num_hidden_layers()) {
    problems.push_back({at(path, "sliding_window_pattern"),
                        "sliding_window_pattern " + std::to_string(model.sliding_window_pattern()) +
                            " exceeds the " + std::to_string(model.num_hidden_layers()) +
                            " layers: none would attend globally (drop it for a window in every "
                            "layer)"});
  }
  if (model.has_sliding_window() && model.has_max_position_embeddings() &&
      model.sliding_window() > model.max_position_embeddings()) {
    problems.push_back(
        {at(path, "sliding_window"), "sliding_window " + std::to_string(model.sliding_window()) +
                                         " exceeds max_position_embeddings " +
                                         std::to_string(model.max_position_embeddings())});
  }
  if (model.activation_dtype() == INT4) {
    problems.push_back({at(path, "activation_dtype"),
                        "INT4 activations are not supported; use INT4 weights with a BF16/FP16 "
                        "activation_dtype (weight-only quantisation)"});
  }
  // MXFP4 is modelled as a storage format of weights, their GEMMs running in activation_dtype.
  for (const auto& [dtype, field] :
       {std::pair{model.activation_dtype(), "activation_dtype"}, {model.kv_dtype(), "kv_dtype"}}) {
    if (dtype == MXFP4) {
      problems.push_back({at(path, field), std::string("MXFP4 is modelled as a weight format only "
                                                       "(weight_dtype, moe.expert_weight_dtype), "
                                                       "not as ") +
                                               field});
    }
  }
  const DType experts = model.moe().expert_weight_dtype();
  const bool float_experts = experts != DTYPE_UNSPECIFIED && is_floating_point(experts) &&
                             model.activation_dtype() != DTYPE_UNSPECIFIED &&
                             dtype_bytes(experts) < dtype_bytes(model.activation_dtype());
  if (model.activation_dtype() != DTYPE_UNSPECIFIED &&
      ((model.weight_dtype() != DTYPE_UNSPECIFIED &&
        dtype_bytes(model.weight_dtype()) < dtype_bytes(model.activation_dtype()) &&
        is_floating_point(model.weight_dtype())) ||
       float_experts) &&
      !is_floating_point(model.activation_dtype())) {
    problems.push_back({at(path, "activation_dtype"),
                        "integer activations with floating-point weights are not a deployable "
                        "combination"});
  }
  if (model.has_moe() && model.moe().has_num_experts() && model.moe().has_experts_per_token() &&
      model.moe().experts_per_token() > model.moe().num_experts()) {
    problems.push_back({at(path, "moe.experts_per_token"),
                        "experts_per_token " + std::to_string(model.moe().experts_per_token()) +
                            " exceeds num_experts " + std::to_string(model.moe().num_experts())});
  }
  if (model.has_moe()) {
    check_expert_groups(model.moe(), path, problems);
  }
  if (model.has_moe() && model.moe().first_dense_layers() > 0 && model.has_num_hidden_layers() &&
      model.moe().first_dense_layers() >= model.num_hidden_layers()) {
    problems.push_back({at(path, "moe.first_dense_layers"),
                        "first_dense_layers " + std::to_string(model.moe().first_dense_layers()) +
                            " leaves none of the " + std::to_string(model.num_hidden_layers()) +
                            " layers to the experts"});
  }
  if (model.has_mla()) {
    check_latent_attention(model, path, problems);
  }
  if (model.has_rope_scaling() && model.rope_scaling().rope_type() == "llama3" &&
      (!model.rope_scaling().has_low_freq_factor() ||
       !model.rope_scaling().has_high_freq_factor() ||
       !model.rope_scaling().has_original_max_position_embeddings())) {
    problems.push_back({at(path, "rope_scaling"),
                        "llama3 rope scaling needs low_freq_factor, high_freq_factor and "
                        "original_max_position_embeddings"});
  }
}

void check_link(const LinkSpec& link, const std::string& path, Problems& problems) {
  if (link.kind() == PCIE) {
    if (!link.has_pcie_generation()) {
      problems.push_back({at(path, "pcie_generation"),
                          "missing required field 'pcie_generation' for a PCIE link"});
    }
    if (!link.has_lanes()) {
      problems.push_back({at(path, "lanes"), "missing required field 'lanes' for a PCIE link"});
    } else if (link.lanes() != 1 && link.lanes() != 2 && link.lanes() != 4 && link.lanes() != 8 &&
               link.lanes() != 16) {
      problems.push_back(
          {at(path, "lanes"), "lanes " + std::to_string(link.lanes()) +
                                  " is not a PCIe link width: expected 1, 2, 4, 8 or 16"});
    }
    if (link.has_peak_gb_per_s_per_direction()) {
      problems.push_back({at(path, "peak_gb_per_s_per_direction"),
                          "a PCIE link's peak follows from pcie_generation and lanes; remove "
                          "peak_gb_per_s_per_direction"});
    }
  } else if (link.kind() != LINK_KIND_UNSPECIFIED) {
    if (!link.has_peak_gb_per_s_per_direction()) {
      problems.push_back({at(path, "peak_gb_per_s_per_direction"),
                          "missing required field 'peak_gb_per_s_per_direction' (GB/s) for a " +
                              LinkKind_Name(link.kind()) + " link"});
    }
    if (link.has_pcie_generation() || link.has_lanes()) {
      problems.push_back({at(path, link.has_pcie_generation() ? "pcie_generation" : "lanes"),
                          "pcie_generation and lanes apply to PCIE links only"});
    }
    if (link.has_peak_gb_per_s_per_direction()) {
      for (const auto& [points, field] :
           {std::pair{&link.measured(), "measured"},
            std::pair{&link.sm_kernel_measured(), "sm_kernel_measured"},
            std::pair{&link.sm_kernel_t2_measured(), "sm_kernel_t2_measured"}}) {
        for (int i = 0; i < points->size(); ++i) {
          if (points->Get(i).effective_gb_per_s() > link.peak_gb_per_s_per_direction()) {
            problems.push_back(
                {at(path, std::string(field) + "[" + std::to_string(i) + "].effective_gb_per_s"),
                 "measured bandwidth exceeds the link's peak per direction"});
          }
        }
      }
    }
  }
  for (int i = 0; i < link.measured_size(); ++i) {
    const auto direction = link.measured(i).direction();
    const bool peer_link = link.kind() == NVLINK || link.kind() == NETWORK;
    if (direction != DIRECTION_UNSPECIFIED && (direction == PEER) != peer_link) {
      problems.push_back({at(path, "measured[" + std::to_string(i) + "].direction"),
                          peer_link
                              ? LinkKind_Name(link.kind()) + " links measure PEER copies"
                              : std::string("a host link measures H2D or D2H copies, not PEER")});
    }
  }
  // Copies by SM kernels read or write host memory: H2D or D2H.
  for (const auto& [points, field] :
       {std::pair{&link.sm_kernel_measured(), "sm_kernel_measured"},
        std::pair{&link.sm_kernel_t2_measured(), "sm_kernel_t2_measured"}}) {
    for (int i = 0; i < points->size(); ++i) {
      if (points->Get(i).direction() == PEER) {
        problems.push_back({at(path, std::string(field) + "[" + std::to_string(i) + "].direction"),
                            "copies by SM kernels are measured H2D or D2H, not PEER"});
      }
    }
  }
}

void check_node(const NodeSpec& node, const std::string& path, Problems& problems) {
  if (node.gpu_interconnect() == SINGLE_GPU && node.gpus_per_node() > 1) {
    problems.push_back(
        {at(path, "gpus_per_node"),
         "gpu_interconnect SINGLE_GPU with gpus_per_node " + std::to_string(node.gpus_per_node())});
  }
  if (node.gpu_interconnect() == NVLINK_SWITCH) {
    if (!node.has_gpu_link()) {
      problems.push_back(
          {at(path, "gpu_link"), "missing required field 'gpu_link' for NVLINK_SWITCH"});
    } else if (node.gpu_link().kind() != NVLINK) {
      problems.push_back(
          {at(path, "gpu_link.kind"), "gpu_link of an NVLINK_SWITCH node must be NVLINK"});
    }
  }
  if (node.has_gpus_per_pcie_switch() && node.has_gpus_per_node() &&
      node.gpus_per_pcie_switch() > node.gpus_per_node()) {
    problems.push_back({at(path, "gpus_per_pcie_switch"),
                        "gpus_per_pcie_switch " + std::to_string(node.gpus_per_pcie_switch()) +
                            " exceeds gpus_per_node " + std::to_string(node.gpus_per_node())});
  }
  if (node.host_link().kind() == NVLINK || node.host_link().kind() == NETWORK) {
    problems.push_back({at(path, "host_link.kind"),
                        "host_link connects a GPU to host memory: PCIE, NVLINK_C2C or CXL"});
  }
}

void check_token_count(const TokenCount& count, const std::string& path, Problems& problems) {
  switch (count.kind_case()) {
    case TokenCount::KIND_NOT_SET:
      problems.push_back(
          {path, "missing token count: set one of fixed_tokens, uniform, lognormal"});
      break;
    case TokenCount::kUniform:
      if (count.uniform().min_tokens() > count.uniform().max_tokens()) {
        problems.push_back({at(path, "uniform.min_tokens"), "min_tokens exceeds max_tokens"});
      }
      break;
    case TokenCount::kLognormal:
      if (count.lognormal().min_tokens() > count.lognormal().max_tokens()) {
        problems.push_back({at(path, "lognormal.min_tokens"), "min_tokens exceeds max_tokens"});
      }
      break;
    default: break;
  }
}

void check_workload(const WorkloadSpec& workload, const std::string& path, Problems& problems) {
  if (workload.kind_case() == WorkloadSpec::KIND_NOT_SET) {
    problems.push_back(
        {path, "missing workload kind: set one of closed_loop, poisson, request_file"});
  }
  if (workload.has_shared_prefix() && workload.has_request_file()) {
    problems.push_back({at(path, "shared_prefix"),
                        "shared_prefix is for generated workloads: a request file says what its "
                        "prompts share (format MOONCAKE_JSONL's hash ids)"});
  }
  if (workload.has_request_file()) {
    const RequestFile& file = workload.request_file();
    if (file.format() == MOONCAKE_JSONL && !file.has_hash_block_tokens()) {
      problems.push_back({at(path, "request_file.hash_block_tokens"),
                          "MOONCAKE_JSONL needs the prompt tokens each hash id covers "
                          "(hash_block_tokens: 512 for Mooncake's traces)"});
    }
    if (file.format() != MOONCAKE_JSONL && file.has_hash_block_tokens()) {
      problems.push_back({at(path, "request_file.hash_block_tokens"),
                          "only MOONCAKE_JSONL request files carry hash ids"});
    }
  }
}

// The first policy of the run (`policy`, then `compare`) other than `full`, if any.
std::optional<std::string> first_tier_policy(const RunSpec& run) {
  if (run.policy().has_name() && run.policy().name() != "full") {
    return run.policy().name();
  }
  for (const PolicySpec& other : run.compare()) {
    if (other.name() != "full") {
      return other.name();
    }
  }
  return std::nullopt;
}

// Policies other than `full` place tokens outside HBM, so they need to know where their
// attention demand comes from and how the tiers move.
void check_tiering(const RunSpec& run, const std::string& path, Problems& problems) {
  const bool tiered = first_tier_policy(run).has_value();
  if (!run.has_tiering()) {
    if (tiered) {
      problems.push_back(
          {at(path, "tiering"),
           "a policy other than full needs a tiering block (traces or "
           "synthetic_pattern, prefetch_lookahead_layers, host_allocation, copy_method)"});
    }
    return;
  }
  const TieringSpec& tiering = run.tiering();
  if (tiering.traces_size() == 0 && !tiering.has_synthetic_pattern()) {
    problems.push_back({at(path, "tiering.synthetic_pattern"),
                        "without traces, tiering needs a synthetic_pattern (reasoning, chat or "
                        "retrieval)"});
  }
  if (tiering.extend_synthetic() && !tiering.has_synthetic_pattern()) {
    problems.push_back({at(path, "tiering.synthetic_pattern"),
                        "extend_synthetic needs a synthetic_pattern for the tail"});
  }
  const NodeSpec& node = run.hardware().node();
  if (tiering.has_host_recode() && node.has_host() && !node.host().has_kv_recode()) {
    problems.push_back({at(path, "tiering.host_recode"),
                        "timing the host's recodes needs its rates: host " + node.host().name() +
                            " declares no kv_recode (hardware.node.host.kv_recode: "
                            "to_compressed_ns_per_value, to_full_ns_per_value, source)"});
  }
}

// The swap space is pinned host memory beside T1/T2, out of each GPU's share of the node's DDR;
// its copies move whole KV blocks, whose size is the memory's (one block size pages both).
void check_swap_space(const RunSpec& run, const std::string& path, Problems& problems) {
  const NodeSpec& node = run.hardware().node();
  const OnDemandAdmission& admission = run.workload().on_demand_admission();
  if (admission.has_swap() && admission.swap().has_block_tokens()) {
    problems.push_back({at(path, "workload.on_demand_admission.swap.block_tokens"),
                        "the KV block size moved to memory.kv_block_tokens (it pages the KV "
                        "memory as well as the swap copies): set kv_block_tokens: " +
                            std::to_string(admission.swap().block_tokens()) +
                            " in memory and remove it here"});
  } else if (admission.has_swap() && !run.memory().has_kv_block_tokens()) {
    problems.push_back({at(path, "memory.kv_block_tokens"),
                        "preemption by swapping copies whole KV blocks: set "
                        "memory.kv_block_tokens (vLLM's block_size, 16 by default)"});
  }
  if (!admission.has_swap() || !admission.swap().has_space_gib() || !node.has_host() ||
      !node.host().has_capacity_gib() || node.gpus_per_node() == 0) {
    return;
  }
  const double share = node.host().capacity_gib() / node.gpus_per_node();
  if (admission.swap().space_gib() > share) {
    problems.push_back({at(path, "workload.on_demand_admission.swap.space_gib"),
                        "swap space " + format_double(admission.swap().space_gib()) +
                            " GiB per GPU exceeds the GPU's share of host " + node.host().name() +
                            " (" + format_double(node.host().capacity_gib()) + " GiB / " +
                            std::to_string(node.gpus_per_node()) + " GPUs)"});
  }
}

// engine.speculative.draft_tokens' (max_value) in run.proto: the positions a step's drafts take.
constexpr int kMaxDraftPositions = 16;

// Speculative decoding is modelled for engines whose decode steps are whole-batch forward passes
// (data-parallel attention's GPUs each verifying their own requests' drafts), not for pipeline
// stages' micro-batches.
void check_speculative(const RunSpec& run, const std::string& path, Problems& problems) {
  if (!run.engine().has_speculative()) {
    return;
  }
  const std::string field = at(path, "engine.speculative");
  const auto& speculative = run.engine().speculative();
  const bool by_position = speculative.acceptance_by_position_size() > 0;
  if (speculative.has_acceptance_rate() == by_position) {
    problems.push_back({at(path, "engine.speculative.acceptance_rate"),
                        by_position ? "acceptance_rate and acceptance_by_position both given: "
                                      "give one"
                                    : "missing required field 'acceptance_rate' (or "
                                      "acceptance_by_position)"});
  }
  if (speculative.acceptance_by_position_size() > kMaxDraftPositions) {
    problems.push_back({at(path, "engine.speculative.acceptance_by_position"),
                        std::to_string(speculative.acceptance_by_position_size()) +
                            " entries: at most " + std::to_string(kMaxDraftPositions) +
                            ", one for each draft a step may make"});
  }
  if (by_position && speculative.has_acceptance_decay()) {
    problems.push_back({at(path, "engine.speculative.acceptance_decay"),
                        "acceptance_decay applies to acceptance_rate, not to "
                        "acceptance_by_position (whose entries give each position's rate)"});
  }
  if (run.pipeline_parallel_degree() > 1) {
    problems.push_back({field, "speculative decoding with pipeline_parallel_degree " +
                                   std::to_string(run.pipeline_parallel_degree()) +
                                   " is not modelled"});
  }
}

// Prefix caching caches whole blocks of the full cache; the policy is checked by the serving
// engine, which also simulates the runs `compare` lists.
void check_prefix_caching(const RunSpec& run, const std::string& path, Problems& problems) {
  if (run.memory().has_prefix_cache_host_chunk_tokens()) {
    const std::uint32_t chunk = run.memory().prefix_cache_host_chunk_tokens();
    const std::uint32_t block = run.memory().kv_block_tokens();
    if (!run.memory().has_prefix_cache_host_gib()) {
      problems.push_back({at(path, "memory.prefix_cache_host_chunk_tokens"),
                          "chunks of the prefix cache's host tier need "
                          "memory.prefix_cache_host_gib"});
    } else if (block > 0 && chunk % block != 0) {
      problems.push_back({at(path, "memory.prefix_cache_host_chunk_tokens"),
                          "prefix_cache_host_chunk_tokens " + std::to_string(chunk) +
                              " is not a whole number of kv_block_tokens " + std::to_string(block) +
                              " blocks"});
    }
  }
  if (run.memory().has_prefix_cache_host_gib()) {
    const NodeSpec& node = run.hardware().node();
    if (!run.memory().prefix_caching()) {
      problems.push_back({at(path, "memory.prefix_cache_host_gib"),
                          "the prefix cache's host tier needs memory.prefix_caching: true"});
    } else if (node.has_host() && node.host().has_capacity_gib() && node.gpus_per_node() > 0 &&
               run.memory().prefix_cache_host_gib() >
                   node.host().capacity_gib() / node.gpus_per_node()) {
      problems.push_back({at(path, "memory.prefix_cache_host_gib"),
                          "prefix_cache_host_gib " +
                              format_double(run.memory().prefix_cache_host_gib()) +
                              " GiB per GPU exceeds the GPU's share of host " + node.host().name() +
                              " (" + format_double(node.host().capacity_gib()) + " GiB / " +
                              std::to_string(node.gpus_per_node()) + " GPUs)"});
    }
  }
  if (!run.memory().prefix_caching()) {
    return;
  }
  const std::string field = at(path, "memory.prefix_caching");
  if (!run.memory().has_kv_block_tokens()) {
    problems.push_back({at(path, "memory.kv_block_tokens"),
                        "prefix caching caches whole KV blocks: set memory.kv_block_tokens "
                        "(vLLM's block_size, 16 by default)"});
  }
  if (run.workload().on_demand_admission().has_swap()) {
    problems.push_back({field,
                        "prefix caching is not modelled with preemption by swapping "
                        "(workload.on_demand_admission.swap): remove one of them"});
  }
  if (run.model().has_sliding_window() && run.model().sliding_window() > 0) {
    problems.push_back({field, "prefix caching is not modelled with a sliding window (model " +
                                   run.model().name() + " has sliding_window " +
                                   std::to_string(run.model().sliding_window()) + ")"});
  }
}

// KV-aware routing counts blocks and weighs them by its own parameter; a disaggregated
// cluster keeps a decode engine, routes decodes by load and moves KV from GPU to GPU.
void check_cluster(const RunSpec& run, const std::string& path, Problems& problems) {
  if (!run.has_cluster()) {
    return;
  }
  const ClusterSpec& cluster = run.cluster();
  if (cluster.routing() == KV_AWARE) {
    if (!cluster.has_kv_overlap_weight()) {
      problems.push_back({at(path, "cluster.kv_overlap_weight"),
                          "KV_AWARE routing needs kv_overlap_weight (Dynamo's "
                          "kv_overlap_score_weight, 1 there by default)"});
    }
    if (!run.memory().has_kv_block_tokens()) {
      problems.push_back({at(path, "cluster.routing"),
                          "KV_AWARE routing counts KV blocks: set memory.kv_block_tokens"});
    }
  } else if (cluster.has_kv_overlap_weight()) {
    problems.push_back({at(path, "cluster.kv_overlap_weight"),
                        "kv_overlap_weight is KV_AWARE routing's; routing " +
                            Routing_Name(cluster.routing()) + " has no use for it"});
  }
  if (!cluster.has_disaggregation()) {
    return;
  }
  const DisaggregationSpec& split = cluster.disaggregation();
  if (split.has_prefill_engines() && cluster.has_engines() &&
      split.prefill_engines() >= cluster.engines()) {
    problems.push_back({at(path, "cluster.disaggregation.prefill_engines"),
                        "prefill_engines " + std::to_string(split.prefill_engines()) +
                            " leaves no decode engine of cluster.engines " +
                            std::to_string(cluster.engines())});
  }
  if (split.decode_routing() != ROUTING_UNSPECIFIED && !weighs_load_only(split.decode_routing())) {
    problems.push_back({at(path, "cluster.disaggregation.decode_routing"),
                        "decode_routing " + Routing_Name(split.decode_routing()) +
                            " weighs cached prefixes, which a decode engine does not look up: "
                            "choose ROUND_ROBIN or LEAST_OUTSTANDING"});
  }
  const LinkKind kind = split.kv_link().kind();
  if (split.has_kv_link() && kind != LINK_KIND_UNSPECIFIED && kind != NVLINK && kind != NETWORK) {
    problems.push_back({at(path, "cluster.disaggregation.kv_link.kind"),
                        "kv_link carries KV from GPU to GPU: NVLINK within a node or NETWORK "
                        "between nodes, not " +
                            LinkKind_Name(kind)});
  }
  // NVLink joins the GPUs of one node: a cluster that needs more nodes than one hands some
  // prompts between nodes, which only a network carries (where the pools sit is not modelled).
  const NodeSpec& node = run.hardware().node();
  const std::uint64_t gpus = cluster_gpus(run);
  if (kind == NVLINK && cluster.has_engines() && run.has_tensor_parallel_degree() &&
      node.has_gpus_per_node() && gpus > node.gpus_per_node()) {
    problems.push_back({at(path, "cluster.disaggregation.kv_link.kind"),
                        "an NVLINK kv_link joins the GPUs of one node, but the cluster's " +
                            std::to_string(cluster.engines()) + " engines take " +
                            std::to_string(gpus) + " GPUs of nodes of " +
                            std::to_string(node.gpus_per_node()) +
                            ": use a NETWORK link (InfiniBand-NDR)"});
  }
  if (split.receive_into_host_memory() && !first_tier_policy(run)) {
    problems.push_back({at(path, "cluster.disaggregation.receive_into_host_memory"),
                        "receiving KV into host memory needs a tier policy in policy or compare: "
                        "the full cache holds every token in HBM and receives it there"});
  }
  if (split.send_kept_only() && !first_tier_policy(run)) {
    problems.push_back({at(path, "cluster.disaggregation.send_kept_only"),
                        "sending only the kept tokens needs a tier policy in policy or compare: "
                        "the full cache keeps every token"});
  }
  check_prefill_pool(run, path, problems);
}

void check_run(const RunSpec& run, const std::string& path, Problems& problems) {
  check_pipeline(run, path, first_tier_policy(run) && run.tiering().has_host_recode(), problems);
  check_cluster(run, path, problems);
  check_tiering(run, path, problems);
  check_swap_space(run, path, problems);
  check_prefix_caching(run, path, problems);
  check_speculative(run, path, problems);
  check_tensor_split(run, path, problems);
  check_data_parallel_dispatch(run, path, problems);
  const ModelSpec& model = run.model();
  const NodeSpec& node = run.hardware().node();
  if (model.activation_dtype() != DTYPE_UNSPECIFIED && node.gpu().compute_size() > 0) {
    bool supported = false;
    for (const auto& rate : node.gpu().compute()) {
      supported = supported || rate.dtype() == model.activation_dtype();
    }
    if (!supported) {
      problems.push_back({at(path, "model.activation_dtype"),
                          "GPU " + node.gpu().name() + " cannot run " +
                              DType_Name(model.activation_dtype()) + " matrix multiplies"});
    }
  }
}

void check_policy(const PolicySpec& policy, const std::string& path, Problems& problems) {
  for (int i = 0; i < policy.param_size(); ++i) {
    if (policy.param(i).value_case() == PolicyParam::VALUE_NOT_SET) {
      problems.push_back({at(path, "param[" + std::to_string(i) + "]"),
                          "parameter '" + policy.param(i).name() +
                              "' has no value: set one of number, integer, text, flag"});
    }
  }
}

// Axes whose paths meet: the same path twice, or a field one axis removes (~) at some point
// and another sets a field under, where which wins would be the axes' order.
void check_axis_paths(const SweepSpec& sweep, const std::string& path, Problems& problems) {
  const auto axis_at = [](int a) { return "axis[" + std::to_string(a) + "]"; };
  for (int a = 0; a < sweep.axis_size(); ++a) {
    const std::string& mine = sweep.axis(a).path();
    const bool removes = std::find(sweep.axis(a).values().begin(), sweep.axis(a).values().end(),
                                   kRemoveField) != sweep.axis(a).values().end();
    for (int b = 0; b < sweep.axis_size(); ++b) {
      const std::string& other = sweep.axis(b).path();
      if (b < a && other == mine) {
        problems.push_back(
            {at(path, axis_at(a) + ".path"),
             "axis path " + mine + " is also swept by " + axis_at(b) + ": one axis per path"});
      }
      if (b != a && removes && other.size() > mine.size() && other.starts_with(mine) &&
          (other[mine.size()] == '.' || other[mine.size()] == '[')) {
        std::string why = "axis path " + mine + " is removed (~) at some points and ";
        why += axis_at(b) + " sets " + other + " under it: remove only fields no other axis sets";
        problems.push_back({at(path, axis_at(a) + ".values"), std::move(why)});
      }
    }
  }
}

void check_sweep(const SweepSpec& sweep, const std::string& path, const ConfigLoader& loader,
                 const LocationMap& locations, Problems& problems) {
  check_axis_paths(sweep, path, problems);
  if (sweep.mode() == ZIP) {
    for (int i = 1; i < sweep.axis_size(); ++i) {
      if (sweep.axis(i).values_size() != sweep.axis(0).values_size()) {
        problems.push_back({at(path, "axis[" + std::to_string(i) + "].values"),
                            "ZIP sweeps need axes of equal length: axis 0 has " +
                                std::to_string(sweep.axis(0).values_size()) + " values, this one " +
                                std::to_string(sweep.axis(i).values_size())});
      }
    }
  }
  // The overrides of axis values, applied to the base together: the run they make, or the
  // problems they give.
  const auto check_point = [&](const std::vector<std::pair<int, int>>& values,
                               const std::string& value_path, const std::string& named) {
    std::vector<Override> overrides;
    RunSpec point = sweep.base();
    LocationMap point_locations(locations.default_file());
    try {
      for (const auto& [a, v] : values) {
        overrides.push_back(parse_override(sweep.axis(a).path() + "=" + sweep.axis(a).values(v)));
      }
      loader.apply_and_resolve(point, point_locations, std::span(overrides));
    } catch (const Error& error) {
      problems.push_back({value_path, named + ": " + error.what()});
      return;
    }
    for (const Problem& problem : validate(point, loader, point_locations)) {
      problems.push_back({value_path, named + " makes an invalid run: " + problem.what +
                                          " (field " + problem.path + ")"});
    }
  };
  // A `policy` axis takes policy strings ("tiered:hbm=0.5"), not `--set` values; their syntax
  // and parameters belong to replay/, above this module, so sweep/ checks them.
  const auto is_policy = [&](int a) { return sweep.axis(a).path() == "policy"; };
  if (sweep.mode() == ZIP) {
    // Every point, its values taken together (they belong together: a model with the GPUs it
    // needs), named by the first axis's value.
    const int points = sweep.axis_size() > 0 ? sweep.axis(0).values_size() : 0;
    for (int v = 0; v < points; ++v) {
      std::vector<std::pair<int, int>> values;
      std::string named;
      for (int a = 0; a < sweep.axis_size(); ++a) {
        if (!is_policy(a) && v < sweep.axis(a).values_size()) {
          values.emplace_back(a, v);
          named +=
              (named.empty() ? "" : ", ") + sweep.axis(a).path() + "=" + sweep.axis(a).values(v);
        }
      }
      if (!values.empty()) {
        check_point(values, at(path, "axis[0].values[" + std::to_string(v) + "]"),
                    "ZIP point " + std::to_string(v) + " (" + named + ")");
      }
    }
    return;
  }
  // Every value of every axis must make a valid run on its own.
  for (int a = 0; a < sweep.axis_size(); ++a) {
    if (is_policy(a)) {
      continue;
    }
    for (int v = 0; v < sweep.axis(a).values_size(); ++v) {
      check_point({{a, v}},
                  at(path, "axis[" + std::to_string(a) + "].values[" + std::to_string(v) + "]"),
                  "axis value " + sweep.axis(a).path() + "=" + sweep.axis(a).values(v));
    }
  }
}

}  // namespace

void check_consistency(const pb::Message& message, const std::string& path,
                       const ConfigLoader& loader, const LocationMap& locations,
                       Problems& problems) {
  if (const auto* model = dynamic_cast<const ModelSpec*>(&message)) {
    check_model(*model, path, problems);
  } else if (const auto* link = dynamic_cast<const LinkSpec*>(&message)) {
    check_link(*link, path, problems);
  } else if (const auto* node = dynamic_cast<const NodeSpec*>(&message)) {
    check_node(*node, path, problems);
  } else if (const auto* count = dynamic_cast<const TokenCount*>(&message)) {
    check_token_count(*count, path, problems);
  } else if (const auto* workload = dynamic_cast<const WorkloadSpec*>(&message)) {
    check_workload(*workload, path, problems);
  } else if (const auto* run = dynamic_cast<const RunSpec*>(&message)) {
    check_run(*run, path, problems);
  } else if (const auto* policy = dynamic_cast<const PolicySpec*>(&message)) {
    check_policy(*policy, path, problems);
  } else if (const auto* sweep = dynamic_cast<const SweepSpec*>(&message)) {
    check_sweep(*sweep, path, loader, locations, problems);
  }
}

}  // namespace kvtier::config::detail
