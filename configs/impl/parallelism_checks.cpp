#include "configs/impl/parallelism_checks.hpp"

#include <algorithm>
#include <string_view>

#include "common/text_output.hpp"
#include "configs/pools.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"

namespace kvtier::config::detail {
namespace {

using Problems = std::vector<Problem>;

// Experts spread whole over the group: a mixture of experts with an expert for every GPU; with
// data-parallel attention as well, DeepEP's all-to-alls, which need as many experts on every GPU,
// NVLink between them and their fixed cost stated. (expert_load_imbalance and
// expert_all_to_all_overhead_us are accepted without them, unused, so that a sweep's base can
// carry them over axes that turn expert parallelism on and off.)
void check_expert_parallel(const RunSpec& run, const std::string& path, Problems& problems) {
  const EngineSpec& engine = run.engine();
  const bool all_to_all = engine.expert_parallel() && engine.data_parallel_attention();
  if (!engine.expert_parallel()) {
    return;
  }
  const std::string field = at(path, "engine.expert_parallel");
  if (!run.model().has_moe()) {
    problems.push_back({field, "expert parallelism needs a mixture of experts (model.moe)"});
    return;
  }
  if (!run.has_tensor_parallel_degree()) {
    return;
  }
  const uint32_t tp = run.tensor_parallel_degree();
  const uint32_t experts = run.model().moe().num_experts();
  if (tp < 2) {
    problems.push_back({field,
                        "expert parallelism spreads the experts over the tensor-parallel group: "
                        "tensor_parallel_degree must be at least 2"});
  } else if (experts < tp) {
    problems.push_back({field, "the model's " + std::to_string(experts) +
                                   " experts leave GPUs of tensor_parallel_degree " +
                                   std::to_string(tp) + " without one"});
  }
  if (!all_to_all) {
    return;
  }
  if (tp >= 2 && experts % tp != 0) {
    problems.push_back({field,
                        "with data-parallel attention every GPU holds as many experts "
                        "(DeepEP's all-to-alls): tensor_parallel_degree " +
                            std::to_string(tp) + " does not divide the model's " +
                            std::to_string(experts) + " experts"});
  }
  if (run.hardware().node().gpu_interconnect() != NVLINK_SWITCH) {
    problems.push_back({field,
                        "expert parallelism with data-parallel attention is modelled on "
                        "NVLINK_SWITCH nodes only (DeepEP's all-to-alls)"});
  }
  if (!engine.has_expert_all_to_all_overhead_us()) {
    problems.push_back({at(path, "engine.expert_all_to_all_overhead_us"),
                        "required with expert parallelism and data-parallel attention: the "
                        "fixed time of each dispatch and combine"});
  }
}

// A tensor-parallel group of more GPUs than a node has: whole nodes, as many as the hardware
// has, joined by a network whose adapters its collectives cross.
void check_group_across_nodes(const RunSpec& run, const std::string& path, Problems& problems) {
  const HardwareSpec& hardware = run.hardware();
  const uint32_t tp = run.tensor_parallel_degree();
  const uint32_t per_node = hardware.node().gpus_per_node();
  const std::string group = "tensor_parallel_degree " + std::to_string(tp);
  if (tp % per_node != 0) {
    problems.push_back({at(path, "tensor_parallel_degree"),
                        group + " spans nodes, so it must be a multiple of the node's " +
                            std::to_string(per_node) + " GPUs"});
    return;
  }
  const uint32_t nodes = tp / per_node;
  if (hardware.has_num_nodes() && nodes > hardware.num_nodes()) {
    problems.push_back({at(path, "tensor_parallel_degree"),
                        group + " needs " + std::to_string(nodes) + " nodes of " +
                            std::to_string(per_node) + " GPUs; hardware.num_nodes is " +
                            std::to_string(hardware.num_nodes())});
  }
  if (!hardware.has_network()) {
    problems.push_back({at(path, "hardware.network"),
                        group + " spans " + std::to_string(nodes) + " nodes of " +
                            std::to_string(per_node) +
                            " GPUs: give the network between them (each GPU's adapter, e.g. "
                            "preset InfiniBand-NDR)"});
  } else if (hardware.network().kind() != NETWORK) {
    problems.push_back(
        {at(path, "hardware.network.kind"), "the network between nodes must be a NETWORK link"});
  }
  if (hardware.node().gpu_interconnect() != NVLINK_SWITCH) {
    problems.push_back({at(path, "tensor_parallel_degree"),
                        group + " spans nodes: modelled for NVLINK_SWITCH nodes only"});
  }
}

}  // namespace

// Pipeline stages: each a tensor-parallel group within a node, the stages over as many nodes
// as they fill, meeting over the node's GPU link or the network between nodes; tier policies
// without host recodes.
void check_pipeline(const RunSpec& run, const std::string& path, bool host_recodes,
                    Problems& problems) {
  if (!run.has_pipeline_parallel_degree() || run.pipeline_parallel_degree() <= 1) {
    return;
  }
  // A stage's share of hybrid attention's global layers depends on where it starts.
  const ModelSpec& hybrid = run.model();
  if (hybrid.has_sliding_window() && hybrid.has_sliding_window_pattern()) {
    problems.push_back({at(path, "pipeline_parallel_degree"),
                        "pipeline_parallel_degree " +
                            std::to_string(run.pipeline_parallel_degree()) +
                            " is not modelled with hybrid attention (model " + hybrid.name() +
                            " has sliding_window_pattern " +
                            std::to_string(hybrid.sliding_window_pattern()) + ")"});
  }
  if (!run.has_tensor_parallel_degree()) {
    return;
  }
  const std::string field = at(path, "pipeline_parallel_degree");
  const uint32_t stages = run.pipeline_parallel_degree();
  const uint32_t tp = run.tensor_parallel_degree();
  const std::string named = "pipeline_parallel_degree " + std::to_string(stages);
  const ModelSpec& model = run.model();
  if (model.has_num_hidden_layers() && stages > model.num_hidden_layers()) {
    problems.push_back({field, named + " exceeds the model's " +
                                   std::to_string(model.num_hidden_layers()) + " layers"});
  }
  if (run.engine().data_parallel_attention()) {
    problems.push_back({field, named + " with engine.data_parallel_attention is not modelled"});
  }
  if (host_recodes) {
    problems.push_back({at(path, "tiering.host_recode"),
                        "host recodes are not modelled with pipeline parallelism (" + named +
                            "): each stage's host recodes its own layers"});
  }
  const HardwareSpec& hardware = run.hardware();
  const NodeSpec& node = hardware.node();
  if (!node.has_gpus_per_node() || node.gpus_per_node() == 0) {
    return;
  }
  const uint32_t per_node = node.gpus_per_node();
  if (tp > per_node) {
    problems.push_back({field, named +
                                   " with a tensor-parallel group that spans nodes "
                                   "(tensor_parallel_degree " +
                                   std::to_string(tp) + ") is not modelled"});
    return;
  }
  const uint64_t gpus = uint64_t{tp} * stages;
  if (gpus <= per_node) {
    if (!node.has_gpu_link()) {
      problems.push_back({field, named + ": the stages meet over the node's GPU link, and node " +
                                     node.name() + " has none"});
    }
    return;
  }
  // Over several nodes: every stage within one.
  if (per_node % tp != 0) {
    problems.push_back({field, named + " fills " + std::to_string(gpus) +
                                   " GPUs, more than a node's " + std::to_string(per_node) +
                                   ", so every stage must lie within a node: "
                                   "tensor_parallel_degree " +
                                   std::to_string(tp) + " must divide " +
                                   std::to_string(per_node)});
    return;
  }
  const uint64_t nodes = (gpus + per_node - 1) / per_node;
  if (hardware.has_num_nodes() && nodes > hardware.num_nodes()) {
    problems.push_back({field, named + " x tensor_parallel_degree " + std::to_string(tp) +
                                   " needs " + std::to_string(nodes) + " nodes of " +
                                   std::to_string(per_node) + " GPUs; hardware.num_nodes is " +
                                   std::to_string(hardware.num_nodes())});
  }
  if (!hardware.has_network()) {
    problems.push_back({at(path, "hardware.network"),
                        named + " spans " + std::to_string(nodes) +
                            " nodes: give the network between them (each GPU's adapter, e.g. "
                            "preset InfiniBand-NDR)"});
  } else if (hardware.network().kind() != NETWORK) {
    problems.push_back(
        {at(path, "hardware.network.kind"), "the network between nodes must be a NETWORK link"});
  }
  if ((tp > 1 || per_node / tp >= 2) && !node.has_gpu_link()) {
    problems.push_back({field, named +
                                   ": the GPUs of a stage, and stages within one node, meet over "
                                   "the node's GPU link, and node " +
                                   node.name() + " has none"});
  }
}

void check_data_parallel_dispatch(const RunSpec& run, const std::string& path, Problems& problems) {
  const EngineSpec& engine = run.engine();
  if (engine.data_parallel_dispatch() == ROUTING_UNSPECIFIED) {
    return;
  }
  const std::string field = at(path, "engine.data_parallel_dispatch");
  const std::string named =
      "data_parallel_dispatch " + Routing_Name(engine.data_parallel_dispatch());
  if (!engine.data_parallel_attention()) {
    problems.push_back(
        {field, named + " dispatches requests to the GPUs of data-parallel attention: set "
                        "engine.data_parallel_attention"});
  }
  if (!weighs_load_only(engine.data_parallel_dispatch())) {
    problems.push_back({field, named + " weighs cached prefixes, which data-parallel attention "
                                       "does not cache: choose ROUND_ROBIN or LEAST_OUTSTANDING"});
  }
  // A swapped request's KV crosses its own GPU's PCIe link, not the mean GPU's share.
  if (run.workload().on_demand_admission().has_swap()) {
    problems.push_back({field, named + " with preemption by swapping "
                                       "(workload.on_demand_admission.swap) is not modelled"});
  }
}

void check_tensor_split(const RunSpec& run, const std::string& path, Problems& problems) {
  const ModelSpec& model = run.model();
  const NodeSpec& node = run.hardware().node();
  if (run.engine().data_parallel_attention()) {
    if (!run.model().has_mla()) {
      problems.push_back({at(path, "engine.data_parallel_attention"),
                          "data-parallel attention is modelled for models with latent attention "
                          "(model.mla) only"});
    }
    // Each GPU's requests, and so its prefix cache, are its own; the engine models one cache
    // per engine.
    if (run.memory().prefix_caching()) {
      problems.push_back({at(path, "engine.data_parallel_attention"),
                          "data-parallel attention with memory.prefix_caching is not modelled "
                          "(each GPU would keep its own prefix cache, as SGLang's ranks do)"});
    }
  }
  check_expert_parallel(run, path, problems);
  const uint32_t tp = run.tensor_parallel_degree();
  if (run.has_tensor_parallel_degree() && tp > 0) {
    if (node.has_gpus_per_node() && node.gpus_per_node() > 0 && tp > node.gpus_per_node()) {
      check_group_across_nodes(run, path, problems);
    }
    // More GPUs than KV heads replicate each head over tp / kv_heads of them (as vLLM does),
    // which needs whole copies.
    const uint32_t kv_heads = model.num_key_value_heads();
    if (model.has_num_key_value_heads() && kv_heads > 0 && kv_heads % tp != 0 &&
        tp % kv_heads != 0) {
      problems.push_back({at(path, "tensor_parallel_degree"),
                          "tensor_parallel_degree " + std::to_string(tp) +
                              " neither divides the model's " + std::to_string(kv_heads) +
                              " KV heads nor is a multiple of them"});
    }
    if (model.has_num_attention_heads() && model.num_attention_heads() % tp != 0) {
      problems.push_back({at(path, "tensor_parallel_degree"),
                          "tensor_parallel_degree " + std::to_string(tp) +
                              " does not divide the model's " +
                              std::to_string(model.num_attention_heads()) + " attention heads"});
    }
  }
}

void check_prefill_pool(const RunSpec& run, const std::string& path, Problems& problems) {
  if (!pools_differ(run)) {
    return;
  }
  // The prefill engines hold the full cache: no tier policy's rules apply to them.
  const auto split_problems = [&path](const RunSpec& pool) {
    Problems found;
    check_pipeline(pool, path, false, found);
    check_tensor_split(pool, path, found);
    return found;
  };
  const Problems of_run = split_problems(run);
  Problems of_pool = split_problems(prefill_pool_run(run));
  const std::string pool_path = at(path, "cluster.disaggregation.prefill_parallelism");
  const PoolParallelism& split = run.cluster().disaggregation().prefill_parallelism();
  for (Problem& problem : of_pool) {
    const bool also_the_runs = std::any_of(of_run.begin(), of_run.end(), [&](const Problem& other) {
      return other.path == problem.path && other.what == problem.what;
    });
    if (also_the_runs) {
      continue;
    }
    // A problem of the split is the pool's: at its field where the pool sets it, else at
    // prefill_parallelism, whose other fields make it (the run itself has not this problem).
    // Problems of other fields (hardware.network) stay there.
    const std::string_view run_field =
        std::string_view(problem.path).substr(path.empty() ? 0 : path.size() + 1);
    const std::string_view pool_field = pool_field_of_run_field(run_field);
    if (!pool_field.empty()) {
      const auto* field = PoolParallelism::descriptor()->FindFieldByName(std::string(pool_field));
      problem.path = split.GetReflection()->HasField(split, field)
                         ? at(pool_path, std::string(pool_field))
                         : pool_path;
    }
    problem.what = "prefill engines: " + problem.what;
    problems.push_back(std::move(problem));
  }
}

}  // namespace kvtier::config::detail
