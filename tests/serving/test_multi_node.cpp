// Tensor-parallel groups larger than their models' KV heads (each head kept by several GPUs) and
// larger than a node (whole nodes joined by their network adapters).

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/collectives.hpp"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/hgx_h100_nodes.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::ModelSpec;
using kvtier::hw::AttentionSplit;
using kvtier::hw::ExpertSplit;
using kvtier::hw::GroupLinks;
using kvtier::hw::IterationCostModel;
using kvtier::hw::Parallelism;
using kvtier::test::decode;
using kvtier::test::joined;
using kvtier::test::preset;

TEST_CASE("more GPUs than KV heads: each GPU keeps one head's K, V and KV", "[iteration_cost]") {
  const kvtier::test::HgxH100Nodes setup;
  const ModelSpec qwen = preset<ModelSpec>("model", "Qwen3-235B-A22B");  // 4 KV heads of 128
  const double layers = qwen.num_hidden_layers();
  // At TP 8 two GPUs share each KV head: the KV is spread over 4, not 8.
  CHECK(kvtier::hw::kv_shards(qwen, 8, AttentionSplit::kHeads) == 4);
  CHECK(kvtier::hw::kv_shards(qwen, 4, AttentionSplit::kHeads) == 4);
  CHECK(kvtier::hw::kv_bytes_per_token_per_gpu(qwen, 8, AttentionSplit::kHeads) ==
        kvtier::hw::kv_bytes_per_token(qwen) / 4);
  // Each GPU holds its head's K and V projections: Llama-3.1-8B's 8 KV heads at TP 16, an
  // eighth of them, not a sixteenth (its other weights all split 16 ways).
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-8B");
  const double kv_projections = 32 * 2 * 4096 * (8 * 128) * 2.0;  // BF16
  CHECK(kvtier::hw::weight_bytes_per_gpu(llama, llama.weight_dtype(), 16, AttentionSplit::kHeads) -
            kvtier::hw::weight_bytes(llama, llama.weight_dtype()) / 16 ==
        Approx(kv_projections * (1.0 / 8 - 1.0 / 16)).epsilon(1e-9));
  // Each GPU computes its KV head's K and V: one token without context at TP 16 costs its
  // share of the queries, the output, the MLP and the LM head, and an eighth of K and V.
  const IterationCostModel tp16(llama, setup.gpu, setup.links, Parallelism{16});
  const double qkv = 4096.0 * (4096.0 / 16 + 2 * 1024.0 / 8);
  const double rest = 4096.0 * 4096 / 16 + 3 * 4096.0 * 14336 / 16;
  CHECK(tp16.cost(decode(1, 0)).flops ==
        Approx(2 * (32 * (qkv + rest) + 128256.0 * 4096 / 16)).epsilon(1e-12));
  // Decoding reads a quarter of each context token's KV on every GPU.
  const IterationCostModel tp8(qwen, setup.gpu, &setup.nvlink, 8);
  CHECK(tp8.cost(decode(16, 4000)).hbm_bytes - tp8.cost(decode(16, 3000)).hbm_bytes ==
        Approx(16.0 * 1000 * layers * (2 * 4 * 128 * 2) / 4).epsilon(1e-9));
  // A group whose size neither divides the KV heads nor is a multiple of them is refused.
  const auto run = kvtier::test::quickstart_run();
  using RunSpec = kvtier::config::RunSpec;
  CHECK(kvtier::test::problems<RunSpec>(
            run, {"model.preset=Qwen3-235B-A22B", "tensor_parallel_degree=8"})
            .empty());
  CHECK_THAT(joined(kvtier::test::problems<RunSpec>(
                 run, {"model.preset=Qwen3-30B-A3B", "tensor_parallel_degree=6"})),
             Catch::Contains("tensor_parallel_degree 6 neither divides the model's 4 KV heads "
                             "nor is a multiple of them"));
}

TEST_CASE("a group over two nodes all-reduces within each node and across them, pipelined",
          "[iteration_cost]") {
  const kvtier::test::HgxH100Nodes setup;
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-405B");
  const double layers = llama.num_hidden_layers();
  const IterationCostModel tp16(llama, setup.gpu, setup.links, Parallelism{16});
  // Two all-reduces a layer of the tokens' hidden states (BF16): 2·7/8 of them over NVLink
  // (378 GB/s measured, 14 hops of 2 us), an eighth over each adapter (42 GB/s, 2 hops of 3 us),
  // the slower of the two setting the pace.
  const auto all_reduce = [](double bytes) {
    const double seconds =
        std::max(2.0 * 7 / 8 * bytes / 378e9, bytes / 8 / 42e9) + 14 * 2e-6 + 2 * 3e-6;
    return kvtier::sim::from_seconds(seconds, kvtier::sim::Rounding::kUp);
  };
  const auto cost = tp16.cost(decode(8, 2000));
  const double bytes = 8.0 * 16384 * 2;
  CHECK(cost.all_reduce == all_reduce(bytes) * static_cast<std::int64_t>(2 * layers));
  CHECK(cost.interconnect_bytes == Approx(2 * layers * 2.0 * 7 / 8 * bytes).epsilon(1e-12));
  CHECK(cost.network_bytes == Approx(2 * layers * bytes / 8).epsilon(1e-12));
  // An 8,192-token chunk's all-reduce: NVLink-bound, a bus bandwidth (2·15/16 of the buffer
  // over the time) of about 400 GB/s, what nccl-tests reach between HGX H100 nodes with eight
  // NDR adapters (400–450 GB/s).
  const double chunk = 8192.0 * 16384 * 2;
  const auto prefill_cost = tp16.cost(kvtier::test::prefill(8192, 0));
  const double per_all_reduce = kvtier::sim::to_seconds(prefill_cost.all_reduce) / (2 * layers);
  CHECK(prefill_cost.all_reduce == all_reduce(chunk) * static_cast<std::int64_t>(2 * layers));
  CHECK(2.0 * 15 / 16 * chunk / per_all_reduce / 1e9 == Approx(400).epsilon(0.03));
  // Without the network, or over a part of a node, it is refused.
  CHECK_THROWS_WITH(
      IterationCostModel(llama, setup.gpu, GroupLinks{&setup.nvlink, nullptr, 8}, Parallelism{16}),
      Catch::Contains("spans nodes of 8: it needs the network between them"));
  CHECK_THROWS_WITH(
      IterationCostModel(llama, setup.gpu, GroupLinks{&setup.nvlink, &setup.network, 8},
                         Parallelism{12}),
      Catch::Contains("spans nodes of 8: it needs whole nodes"));
}

TEST_CASE("across nodes the all-to-all sends other nodes' share through the adapters",
          "[iteration_cost]") {
  const kvtier::test::HgxH100Nodes setup;
  ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");
  deepseek.mutable_moe()->clear_first_dense_layers();
  const Parallelism deep_ep{16, AttentionSplit::kRequests, ExpertSplit::kWhole};
  const auto batch = decode(512, 2000);
  const auto two_nodes = IterationCostModel(deepseek, setup.gpu, setup.links, deep_ep).cost(batch);
  // The same group taken as one node of 16 sends the same bytes, all over NVLink.
  const auto one_node = IterationCostModel(deepseek, setup.gpu, &setup.nvlink, deep_ep).cost(batch);
  REQUIRE(one_node.network_bytes == 0.0);
  const double sent = one_node.interconnect_bytes;
  // Of each GPU's 15 peers, 8 are on the other node.
  CHECK(two_nodes.network_bytes == Approx(sent * 8 / 15).epsilon(1e-12));
  CHECK(two_nodes.interconnect_bytes == Approx(sent * 7 / 15).epsilon(1e-12));
  CHECK(two_nodes.all_reduce > one_node.all_reduce);
}

TEST_CASE("a run whose tensor-parallel group spans two nodes", "[serving]") {
  const std::vector<std::string> two_nodes = {
      "model.preset=Llama-3.1-405B", "tensor_parallel_degree=16", "hardware.num_nodes=2",
      "hardware.network.preset=InfiniBand-NDR", "workload.max_batch_size=8"};
  const auto metrics = kvtier::test::serving_metrics(
      kvtier::test::load_spec<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), two_nodes));
  CHECK(metrics.at("engines_per_node") == 0.5);
  CHECK(metrics.at("network_utilisation") > 0.0);
  CHECK(metrics.at("nvlink_utilisation") > 0.0);
  // 811 GB of BF16 weights over 16 GPUs, with each KV head's projections on two of them.
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-405B");
  CHECK(metrics.at("hbm_weights_gib") ==
        Approx(kvtier::hw::weight_bytes_per_gpu(llama, llama.weight_dtype(), 16,
                                                AttentionSplit::kHeads) /
               (1024.0 * 1024 * 1024))
            .epsilon(1e-12));
  CHECK(metrics.at("hbm_weights_gib") > 811e9 / 16 / (1024.0 * 1024 * 1024));
  // Two such engines take four nodes.
  auto cluster = two_nodes;
  cluster.insert(cluster.end(), {"cluster.engines=2", "cluster.routing=ROUND_ROBIN",
                                 "workload.closed_loop.num_requests=4"});
  const auto both = kvtier::test::serving_metrics(
      kvtier::test::load_spec<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), cluster));
  CHECK(both.at("cluster_nodes") == 4);
  CHECK(both.at("cluster_gpus") == 32);
  CHECK(metrics.at("requests_completed") == 8);

  using kvtier::test::problems;
  using RunSpec = kvtier::config::RunSpec;
  const auto run = kvtier::test::quickstart_run();
  const auto with = [&](std::vector<std::string> sets) {
    return joined(problems<RunSpec>(run, sets));
  };
  CHECK_THAT(with({"tensor_parallel_degree=16", "hardware.network.preset=InfiniBand-NDR"}),
             Catch::Contains("tensor_parallel_degree 16 needs 2 nodes of 8 GPUs; "
                             "hardware.num_nodes is 1"));
  CHECK_THAT(with({"tensor_parallel_degree=16", "hardware.num_nodes=2"}),
             Catch::Contains("field hardware.network") &&
                 Catch::Contains("spans 2 nodes of 8 GPUs: give the network between them"));
  CHECK_THAT(with({"tensor_parallel_degree=16", "hardware.num_nodes=2",
                   "hardware.network.preset=NVLink4"}),
             Catch::Contains("the network between nodes must be a NETWORK link"));
  CHECK_THAT(with({"tensor_parallel_degree=12", "hardware.num_nodes=2",
                   "hardware.network.preset=InfiniBand-NDR"}),
             Catch::Contains("tensor_parallel_degree 12 spans nodes, so it must be a multiple of "
                             "the node's 8 GPUs"));
  // Four nodes, each of Llama-3.1-405B's 8 KV heads on 4 GPUs.
  CHECK(with({"model.preset=Llama-3.1-405B", "tensor_parallel_degree=32", "hardware.num_nodes=4",
              "hardware.network.preset=InfiniBand-NDR"})
            .empty());
}
