// Data-parallel dispatch in a disaggregated cluster: each engine dispatches the requests it is
// given to its GPUs, a prefill GPU holds its prompts' KV until they leave, and each prompt's KV
// crosses between the GPUs its engines dispatched it to.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/pools.hpp"
#include "configs/schema/run.pb.h"
#include "serving/cluster.hpp"
#include "serving/engine.hpp"
#include "serving/workload.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::Cluster;
using kvtier::serving::RequestSpec;
using kvtier::serving::ServingEngine;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;
using kvtier::test::TieredServed;

namespace {

// DeepSeek-V2-Lite (latent attention) on engines of two GPUs with data-parallel attention:
// `engines` engines, the first prefilling, the others decoding, over InfiniBand NDR; dispatching
// as `dispatch` says ("" for none), with `sets` after.
std::vector<std::string> lite_sets(const std::string& dispatch, std::vector<std::string> sets) {
  std::vector<std::string> all = {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                  "engine.data_parallel_attention=true",
                                  "workload.prefill_chunk_tokens=8192"};
  if (!dispatch.empty()) {
    all.push_back("engine.data_parallel_dispatch=" + dispatch);
  }
  all.insert(all.end(), sets.begin(), sets.end());
  return all;
}

RunSpec lite_split(std::uint32_t engines, const std::string& dispatch,
                   std::vector<std::string> sets = {}, std::uint32_t prefill_engines = 1) {
  std::vector<std::string> all = lite_sets(dispatch, std::move(sets));
  all.insert(all.end(), {"policy.name=full", "compare=~", "tiering=~"});
  return kvtier::test::split_run(engines, prefill_engines, all);
}

// A 0.1 GB/s kv_link: a copy outlasts the prefills.
const std::vector<std::string> kSlowLink = {
    "cluster.disaggregation.kv_link.measured[0].effective_gb_per_s=0.1",
    "cluster.disaggregation.kv_link.peak_gb_per_s_per_direction=0.1"};

// 19 GiB GPUs: 0.83 GiB of KV each, about 28,000 tokens' latents.
const std::string kSmallGpus = "hardware.node.gpu.memory_capacity_gib=19";

// The copy of `prompt` tokens' latents, whole on one GPU, over `run`'s kv_link.
Tick whole_copy(const Cluster& cluster, const RunSpec& run, std::uint64_t prompt) {
  return kvtier::test::kv_link_copies(run, static_cast<double>(run.tensor_parallel_degree()) *
                                               cluster.engine(0).memory().kv_bytes_for(prompt));
}

void check_same_run(const Cluster& mine, const Cluster& theirs) {
  for (std::size_t e = 0; e < mine.size(); ++e) {
    INFO("engine " << e);
    const ServingEngine& engine = mine.engine(e);
    const ServingEngine& other = theirs.engine(e);
    CHECK(engine.totals().iterations == other.totals().iterations);
    CHECK(engine.totals().busy == other.totals().busy);
    CHECK(engine.totals().h2d_bytes == Approx(other.totals().h2d_bytes).epsilon(1e-12));
    CHECK(engine.totals().d2h_bytes == Approx(other.totals().d2h_bytes).epsilon(1e-12));
    CHECK(engine.totals().h2d_busy == other.totals().h2d_busy);
    CHECK(engine.totals().d2h_busy == other.totals().d2h_busy);
    CHECK(engine.host_kv_used().max() == Approx(other.host_kv_used().max()).epsilon(1e-12));
    CHECK(engine.totals().prefetch_stall == other.totals().prefetch_stall);
    CHECK(engine.kv_used().max() == Approx(other.kv_used().max()).epsilon(1e-12));
    REQUIRE(engine.ttft().count() == other.ttft().count());
    REQUIRE(engine.e2e().count() == other.e2e().count());
    if (engine.ttft().count() > 0) {
      CHECK(engine.ttft().max() == other.ttft().max());
    }
    if (engine.e2e().count() > 0) {
      CHECK(engine.e2e().max() == other.e2e().max());
    }
  }
  CHECK(mine.routed() == theirs.routed());
  const auto& moved = mine.kv_transfers();
  const auto& spread = theirs.kv_transfers();
  CHECK(moved.count == spread.count);
  CHECK(moved.bytes == Approx(spread.bytes).epsilon(1e-12));
  CHECK(moved.busy == spread.busy);
  CHECK(moved.transfer.percentile(50) == spread.transfer.percentile(50));
  CHECK(moved.transfer.percentile(100) == spread.transfer.percentile(100));
  CHECK(moved.handoff.percentile(100) == spread.handoff.percentile(100));
}

}  // namespace

TEST_CASE("identical requests dispatched on both sides run as the even spread does",
          "[disaggregation][serving]") {
  // Eight identical prompts at once, four prefill engines of two GPUs each prefilling two, four
  // decode engines each decoding two: dispatched, every GPU has one, and each prompt crosses at
  // once between GPUs of its own, as the even spread's do on the free ones. (With more than a
  // GPU's lanes of transfers, prompts would arrive one after another, and the even spread would
  // take their contexts as the mean rather than each GPU's own.) The same under a tier policy
  // whose decode engines offload and stage KV each step.
  const std::vector<RequestSpec> requests(8, request_at(0.0, 300, 200));
  const std::vector<std::string> two_nodes = {"hardware.num_nodes=2"};
  const auto even = serve(lite_split(8, "", two_nodes, 4), open_loop(requests));
  REQUIRE(even->cluster->kv_transfers().count == 8);
  REQUIRE(even->cluster->kv_transfers().transfer.max() ==
          even->cluster->kv_transfers().transfer.min());
  for (const std::string dispatch : {"ROUND_ROBIN", "LEAST_OUTSTANDING"}) {
    INFO(dispatch);
    const auto dispatched = serve(lite_split(8, dispatch, two_nodes, 4), open_loop(requests));
    CHECK(dispatched->cluster->engine(0).dispatches());
    CHECK(dispatched->cluster->engine(4).dispatches());
    check_same_run(*dispatched->cluster, *even->cluster);
    // Each GPU holds what the mean GPU does.
    for (std::size_t e = 0; e < 8; ++e) {
      const ServingEngine& engine = dispatched->cluster->engine(e);
      CHECK(engine.busiest_gpu_kv_peak().value_or(0.0) ==
            Approx(engine.kv_used().max()).epsilon(1e-12));
    }
  }
  // Under a tier policy the decode engines' first step of a received prompt offloads what its
  // placement keeps off HBM, or (received into host memory) loads what it keeps in HBM and
  // promotes; sent layer by layer, or only the kept tokens. Tiered keeps each prompt in HBM and
  // re-tiers later; Monarch's placement offloads most of each prompt at its first step.
  struct Receipt {
    std::string name;
    bool into_host = false;
    bool kept_only_layer_wise = false;
  };
  const std::vector<Receipt> receipts = {
      {"into HBM"}, {"into host memory", true}, {"kept, by layer", false, true}};
  for (const auto& [policy, receipt] :
       {std::pair{std::string("tiered:hbm=0.3,evict=0.2,compress=0.2,delta=32"), receipts[0]},
        std::pair{std::string("tiered:hbm=0.3,evict=0.2,compress=0.2,delta=32"), receipts[1]},
        std::pair{std::string("tiered:hbm=0.3,evict=0.2,compress=0.2,delta=32"), receipts[2]},
        std::pair{std::string("monarch:attend=all,compression=int8,window=18,max_hot=25,page=5"),
                  receipts[0]},
        std::pair{std::string("monarch:attend=all,compression=int8,window=18,max_hot=25,page=5"),
                  receipts[1]}}) {
    const auto& [name, into_host, kept_only_layer_wise] = receipt;
    INFO(policy << " " << name);
    const auto tiered = [&](const std::string& dispatch) {
      RunSpec run = lite_split(8, dispatch, two_nodes, 4);
      *run.mutable_policy() = kvtier::test::tiered_split(policy).policy();
      *run.mutable_tiering() = kvtier::test::tiered_split(policy).tiering();
      auto& split = *run.mutable_cluster()->mutable_disaggregation();
      split.set_receive_into_host_memory(into_host);
      split.set_send_kept_only(kept_only_layer_wise);
      split.set_layer_wise_transfer(kept_only_layer_wise);
      return run;
    };
    const TieredServed tiered_even(tiered(""), open_loop(requests));
    const auto& decoded = tiered_even.cluster.engine(4).totals();
    REQUIRE(decoded.h2d_bytes > 0.0);
    REQUIRE(decoded.d2h_bytes > 0.0);
    REQUIRE(decoded.prefetch_stall > Tick::zero());
    const TieredServed tiered_turns(tiered("ROUND_ROBIN"), open_loop(requests));
    check_same_run(tiered_turns.cluster, tiered_even.cluster);
  }
}

TEST_CASE("a prompt's KV crosses between the GPUs its engines dispatched it to",
          "[disaggregation][serving]") {
  // Two long and two short prompts at once over a slow link, all prefilled in one iteration.
  // Dispatched in turn, both long ones are on one GPU of a side, so the second waits for the
  // first's copy; spread evenly, it takes the link of the GPU free first (a short copy's). One
  // prefill and two decode engines: both long ones on prefill GPU 0, on different decode
  // engines. Two prefill and one decode engine: on different prefill engines, both on decode
  // GPU 0.
  struct Layout {
    std::uint32_t engines;
    std::uint32_t prefill_engines;
    std::vector<RequestSpec> requests;
  };
  const RequestSpec long_one = request_at(0.0, 2048, 8);
  const RequestSpec short_one = request_at(0.0, 256, 8);
  const std::vector<Layout> layouts = {{3, 1, {long_one, short_one, long_one, short_one}},
                                       {3, 2, {long_one, long_one, short_one, short_one}}};
  for (const auto& [engines, prefill_engines, requests] : layouts) {
    INFO(prefill_engines << " prefill engine(s)");
    const RunSpec turns = lite_split(engines, "ROUND_ROBIN", kSlowLink, prefill_engines);
    const auto dispatched = serve(turns, open_loop(requests));
    const auto even =
        serve(lite_split(engines, "", kSlowLink, prefill_engines), open_loop(requests));
    const Cluster& cluster = *dispatched->cluster;
    const Tick long_copy = whole_copy(cluster, turns, 2048);
    const Tick short_copy = whole_copy(cluster, turns, 256);
    for (std::size_t e = 0; e < prefill_engines; ++e) {
      REQUIRE(cluster.engine(e).ttft().max() == cluster.engine(0).ttft().min());
    }
    if (prefill_engines == 1) {
      REQUIRE(cluster.engine(0).dispatched_gpu(0) == 0);
      REQUIRE(cluster.engine(0).dispatched_gpu(2) == 0);
    } else {
      REQUIRE(cluster.routed() == std::vector<std::uint64_t>{2, 2, 4});
      REQUIRE(cluster.engine(2).dispatched_gpu(0) == 0);
      REQUIRE(cluster.engine(2).dispatched_gpu(1) == 0);
    }
    CHECK(cluster.kv_transfers().busy == long_copy * 2 + short_copy * 2);
    CHECK(cluster.kv_transfers().transfer.max() == long_copy + long_copy);
    CHECK(cluster.kv_transfers().transfer.min() == short_copy);
    CHECK(even->cluster->kv_transfers().busy == cluster.kv_transfers().busy);
    CHECK(even->cluster->kv_transfers().transfer.max() == long_copy + short_copy);
    std::uint64_t completed = 0;
    for (std::size_t e = prefill_engines; e < engines; ++e) {
      completed += cluster.engine(e).totals().requests_completed;
    }
    CHECK(completed == 4);
  }
}

TEST_CASE("a transfer takes its GPUs' links, not the ones free latest",
          "[disaggregation][serving]") {
  // Two prompts at once on GPUs 0 and 1 of each side, the one on GPU 1 longer, so that its
  // links come free later. A second long and short pair then arrives: the long one dispatched
  // to GPU 0, the short one to GPU 1, whose links are free at once, so neither waits.
  const RunSpec run = lite_split(2, "ROUND_ROBIN", kSlowLink);
  const std::vector<RequestSpec> requests = {request_at(0.0, 256, 4), request_at(0.0, 1024, 4),
                                             request_at(1.0, 2048, 4), request_at(1.0, 256, 4)};
  const auto served = serve(run, open_loop(requests));
  const Cluster& cluster = *served->cluster;
  REQUIRE(whole_copy(cluster, run, 1024) < Tick::ms(500));
  for (std::size_t e = 0; e < 2; ++e) {
    REQUIRE(cluster.engine(e).dispatched_gpu(1) == 1);
    REQUIRE(cluster.engine(e).dispatched_gpu(2) == 0);
    REQUIRE(cluster.engine(e).dispatched_gpu(3) == 1);
  }
  CHECK(cluster.kv_transfers().transfer.max() == whole_copy(cluster, run, 2048));
  CHECK(cluster.kv_transfers().transfer.min() == whole_copy(cluster, run, 256));
  CHECK(cluster.engine(1).totals().requests_completed == 4);
}

TEST_CASE("a prefill GPU holds its prompts' KV until it leaves", "[disaggregation][serving]") {
  // A 25,000-token prompt and a 16,000-token one do not fit one GPU's KV memory together (about
  // 28,600 tokens); short ones do beside either. Dispatched in turn, both long ones go to GPU 0
  // of the prefill engine, the second arriving once the first has been prefilled: it is
  // admitted only once the first's KV has crossed the slow link, while GPU 1's short ones go
  // ahead. Spread evenly, the pooled memory holds them all at once.
  const std::vector<RequestSpec> requests = {request_at(0.0, 25000, 4), request_at(0.0, 256, 4),
                                             request_at(1.0, 16000, 4), request_at(1.0, 256, 4)};
  std::vector<std::string> sets = kSlowLink;
  sets.push_back(kSmallGpus);
  const RunSpec turns = lite_split(3, "ROUND_ROBIN", sets);
  const auto dispatched = serve(turns, open_loop(requests));
  const Cluster& cluster = *dispatched->cluster;
  const ServingEngine& prefill = cluster.engine(0);
  const Tick first_copy = whole_copy(cluster, turns, 25000);
  REQUIRE(prefill.dispatched_gpu(2) == 0);
  REQUIRE(prefill.dispatched_gpu(3) == 1);
  REQUIRE(prefill.ttft().min() < Tick::ms(1000));  // the first long one prefilled before
  CHECK(prefill.queue_wait().max() > first_copy - Tick::ms(1000));
  CHECK(prefill.queue_wait().percentile(75) < first_copy / 10);  // the others went at once
  CHECK(prefill.totals().requests_handed_off == 4);
  // Its GPU held the first long prompt's latents whole, running and handed off.
  CHECK(prefill.busiest_gpu_kv_peak().value_or(0.0) ==
        Approx(2.0 * prefill.memory().kv_bytes_for(25000)).epsilon(1e-12));
  CHECK(prefill.busiest_gpu_kv_peak().value_or(0.0) <= prefill.memory().kv_capacity_bytes);
  const auto even = serve(lite_split(3, "", sets), open_loop(requests));
  CHECK(even->cluster->engine(0).queue_wait().max() < first_copy / 10);
  // Admitted on demand too: beside the first one's KV the second's first chunk (4,096 tokens, a
  // GPU's share of the prefill budget) does not fit, so it is not alone on its GPU and waits,
  // rather than being admitted alone and preempted.
  std::vector<std::string> on_demand = sets;
  on_demand.insert(on_demand.end(),
                   {"workload.on_demand_admission.watermark=0.01", "memory.kv_block_tokens=16"});
  const auto demand = serve(lite_split(3, "ROUND_ROBIN", on_demand), open_loop(requests));
  const ServingEngine& demand_prefill = demand->cluster->engine(0);
  CHECK(demand_prefill.totals().requests_handed_off == 4);
  CHECK(demand_prefill.ttft().max() > first_copy - Tick::ms(1000));
  CHECK(demand_prefill.totals().preemptions == 0);
  CHECK(demand_prefill.busiest_gpu_kv_peak().value_or(0.0) <=
        demand_prefill.memory().kv_capacity_bytes);
  CHECK(demand->cluster->engine(1).totals().requests_completed +
            demand->cluster->engine(2).totals().requests_completed ==
        4);
}

TEST_CASE("a prefill GPU preempts its own request to keep its prompts' KV",
          "[disaggregation][serving]") {
  // On demand: a 24,000-token prompt's KV is held on GPU 0 when a 16,000-token one arrives
  // there. Its first chunk (4,096 tokens) fits beside it, its second does not: it is preempted,
  // being not alone on its GPU, and waits for the first's KV to leave.
  std::vector<std::string> sets = kSlowLink;
  sets.insert(sets.end(), {kSmallGpus, "workload.on_demand_admission.watermark=0.01",
                           "memory.kv_block_tokens=16"});
  const RunSpec run = lite_split(3, "ROUND_ROBIN", sets);
  const auto served = serve(run, open_loop({request_at(0.0, 24000, 4), request_at(0.0, 256, 4),
                                            request_at(1.0, 16000, 4)}));
  const ServingEngine& prefill = served->cluster->engine(0);
  REQUIRE(prefill.dispatched_gpu(2) == 0);
  CHECK(prefill.totals().preemptions >= 1);
  CHECK(prefill.busiest_gpu_kv_peak().value_or(0.0) <= prefill.memory().kv_capacity_bytes);
  CHECK(prefill.ttft().max() > whole_copy(*served->cluster, run, 24000) - Tick::ms(1000));
  CHECK(prefill.totals().requests_handed_off == 3);
}

TEST_CASE("a prefill GPU's reservations stand while any of its prompts' KV is held",
          "[disaggregation][serving]") {
  // Two 10,000-token prompts on GPU 0, their KV leaving one after the other over the slow link
  // (about 3 s each). A 20,000-token prompt arriving there after the first has left does not
  // fit beside the second: it waits for it.
  std::vector<std::string> sets = kSlowLink;
  sets.push_back(kSmallGpus);
  const RunSpec run = lite_split(2, "ROUND_ROBIN", sets);
  const auto served = serve(
      run, open_loop({request_at(0.0, 10000, 4), request_at(0.0, 256, 4), request_at(0.0, 10000, 4),
                      request_at(4.0, 256, 4), request_at(4.0, 20000, 4)}));
  const Cluster& cluster = *served->cluster;
  const ServingEngine& prefill = cluster.engine(0);
  const Tick copy = whole_copy(cluster, run, 10000);
  REQUIRE(copy > Tick::ms(2500));
  REQUIRE(copy < Tick::ms(3500));
  REQUIRE(prefill.dispatched_gpu(2) == 0);
  REQUIRE(prefill.dispatched_gpu(4) == 0);
  CHECK(prefill.queue_wait().max() > copy + copy - Tick::ms(4000));
  CHECK(prefill.busiest_gpu_kv_peak().value_or(0.0) <= prefill.memory().kv_capacity_bytes);
  CHECK(cluster.engine(1).totals().requests_completed == 5);
}

TEST_CASE("a prefill GPU's handed-off requests count as its own until they leave",
          "[disaggregation][serving]") {
  // A long and a short prompt at once over a slow link; a third arrives once the short one's
  // KV has left but not the long one's. The GPU holding the fewest requests is GPU 1.
  const RunSpec run = lite_split(2, "LEAST_OUTSTANDING", kSlowLink);
  const RunSpec probe = lite_split(2, "", kSlowLink);
  const auto alone = serve(probe, open_loop({request_at(0.0, 4096, 4)}));
  const Tick long_copy = whole_copy(*alone->cluster, run, 4096);
  const double third = kvtier::sim::to_seconds(long_copy) / 2;
  const auto served = serve(
      run, open_loop({request_at(0.0, 4096, 4), request_at(0.0, 64, 4), request_at(third, 64, 4)}));
  const ServingEngine& prefill = served->cluster->engine(0);
  REQUIRE(prefill.dispatched_gpu(0) == 0);
  REQUIRE(prefill.dispatched_gpu(1) == 1);
  REQUIRE(served->cluster->kv_transfers().transfer.min() < long_copy / 4);
  CHECK(prefill.dispatched_gpu(2) == 1);
}

TEST_CASE("prefill and decode engines of different sizes each dispatch to their own GPUs",
          "[disaggregation][serving]") {
  // Prefill engines of four GPUs, decode engines of two drafting a token a step; a request of
  // one output token ends on its prefill GPU. Each prompt's KV crosses from one of four prefill
  // GPUs to one of two decode GPUs.
  const RunSpec run =
      lite_split(3, "ROUND_ROBIN",
                 {"cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=4",
                  "engine.speculative.draft_tokens=1", "engine.speculative.acceptance_rate=0.8",
                  "engine.speculative.draft_layers=1"});
  std::vector<RequestSpec> requests(8, request_at(0.0, 512, 32));
  requests[5].output_tokens = 1;
  const auto served = serve(run, open_loop(requests));
  const Cluster& cluster = *served->cluster;
  REQUIRE(cluster.kv_transfers().sending_lanes == 4);
  REQUIRE(cluster.kv_transfers().receiving_lanes == 2);
  CHECK(cluster.engine(0).dispatched_gpu(3) == 3);
  CHECK(cluster.engine(0).dispatched_gpu(7) == 3);
  CHECK(cluster.engine(0).totals().requests_completed == 1);
  CHECK(cluster.engine(0).totals().requests_handed_off == 7);
  CHECK(cluster.kv_transfers().count == 7);
  CHECK(cluster.engine(1).totals().requests_completed +
            cluster.engine(2).totals().requests_completed ==
        7);
  CHECK(cluster.engine(1).totals().speculative_tokens > 0);
  // Once every prompt has left, the prefill GPUs hold nothing.
  CHECK(cluster.engine(0).kv_used().value() == 0.0);
}

TEST_CASE("data-parallel dispatch in a disaggregated cluster is accepted", "[config]") {
  const std::vector<std::string> split = {"cluster.engines=2",
                                          "cluster.routing=ROUND_ROBIN",
                                          "cluster.disaggregation.prefill_engines=1",
                                          "cluster.disaggregation.decode_routing=LEAST_OUTSTANDING",
                                          "cluster.disaggregation.kv_link.preset=InfiniBand-NDR",
                                          "policy.name=full",
                                          "compare=~",
                                          "tiering=~"};
  CHECK(kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(),
                                        lite_sets("ROUND_ROBIN", split))
            .empty());
  // Prefill engines whose attention is split by heads have no GPU to dispatch to: only the
  // decode engines dispatch.
  const RunSpec by_heads =
      lite_split(2, "ROUND_ROBIN",
                 {"cluster.disaggregation.prefill_parallelism.data_parallel_attention=false"});
  CHECK(kvtier::config::prefill_pool_run(by_heads).engine().data_parallel_dispatch() ==
        kvtier::config::ROUTING_UNSPECIFIED);
  const auto served =
      serve(by_heads, open_loop({request_at(0.0, 256, 4), request_at(0.0, 256, 4)}));
  CHECK_FALSE(served->cluster->engine(0).dispatches());
  CHECK(served->cluster->engine(1).dispatches());
  CHECK(served->cluster->engine(1).dispatched_gpu(1) == 1);
  CHECK(served->cluster->engine(1).totals().requests_completed == 2);
}
