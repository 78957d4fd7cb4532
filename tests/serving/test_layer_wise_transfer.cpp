// Disaggregated clusters whose prompts' KV crosses layer by layer while the prefill's last
// iteration computes it (cluster.disaggregation.layer_wise_transfer): KvHandoff's timing against
// copies sent one by one, and what a cluster hands off with it.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/pools.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "serving/cluster.hpp"
#include "serving/kv_handoff.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "sim/tick.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::Cluster;
using kvtier::serving::KvHandoff;
using kvtier::serving::RequestSpec;
using kvtier::sim::Tick;
using kvtier::test::kv_link_copies;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;
using kvtier::test::split_run;

namespace {

const std::string kLayerWise = "cluster.disaggregation.layer_wise_transfer=true";

// A split_run cluster of Llama-3.1-8B whose prefill engines are split `prefill_tp` x
// `prefill_stages` and decode engines `decode_tp` x `decode_stages`.
RunSpec pools(std::uint32_t prefill_tp, std::uint32_t prefill_stages, std::uint32_t decode_tp,
              std::uint32_t decode_stages) {
  return split_run(2, 1,
                   {"tensor_parallel_degree=" + std::to_string(decode_tp),
                    "pipeline_parallel_degree=" + std::to_string(decode_stages),
                    "cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=" +
                        std::to_string(prefill_tp),
                    "cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree=" +
                        std::to_string(prefill_stages)});
}

// What KvHandoff::layer_wise says, worked out copy by copy: the earlier bytes at once, then each
// layer once the iteration has computed it (layer l by computing + window · (l + 1) / layers,
// rounded up) and the copies before it are done, a layer's copies those of the busiest GPU
// holding it.
Tick sent_one_by_one(const RunSpec& run, const KvHandoff& handoff, double earlier, double last,
                     Tick start, Tick computing, Tick computed) {
  const auto layers = static_cast<std::int64_t>(run.model().num_hidden_layers());
  Tick sent = start + (earlier > 0.0 ? handoff.time(earlier) : Tick::zero());
  for (std::uint32_t l = 0; l < layers; ++l) {
    const Tick ready =
        computing + ((computed - computing) * (l + 1) + Tick::ps(layers - 1)) / layers;
    Tick copy = Tick::zero();
    for (const KvHandoff::GpuPart& part : handoff.parts()) {
      if (l >= part.first_layer && l < part.first_layer + part.layers) {
        copy = std::max(
            copy, kv_link_copies(run, last * part.share / part.layers, part.copies_per_layer));
      }
    }
    sent = std::max(sent, ready) + copy;
  }
  return sent;
}

}  // namespace

TEST_CASE("a transfer sent layer by layer ends as its copies sent one by one would",
          "[disaggregation][layer-wise]") {
  // Pools alike, and split otherwise in heads and stages: each GPU's copies meet the layers it
  // holds as the iteration computes them.
  const RunSpec run = GENERATE(pools(1, 1, 1, 1), pools(2, 2, 4, 1), pools(1, 3, 2, 2));
  const KvHandoff handoff(kvtier::config::prefill_pool_run(run), run,
                          run.cluster().disaggregation().kv_link());
  const double gb = 1e9;
  // Layers computed faster than the link sends them and slower; earlier bytes or none; a
  // transfer starting as the iteration does or partway through it.
  const Tick window = GENERATE(Tick::ms(1), Tick::ms(40), Tick::ms(400));
  const double earlier = GENERATE(0.0, 0.5);
  const Tick start = GENERATE(Tick::ms(100), Tick::ms(110));
  const Tick computing = Tick::ms(100);
  const Tick computed = computing + window;
  CAPTURE(window.picoseconds(), earlier, start.picoseconds(), handoff.parts().size());
  const KvHandoff::Timing timing =
      handoff.layer_wise(earlier * gb, 0.25 * gb, start, computing, computed);
  const Tick by_layer =
      sent_one_by_one(run, handoff, earlier * gb, 0.25 * gb, start, computing, computed);
  const Tick whole = std::max(start, computed) + handoff.time((earlier + 0.25) * gb);
  // Whichever ends first: layer by layer, or whole once the prefill has ended.
  CHECK(timing.end == std::min(by_layer, whole));
  CHECK(timing.layer_wise == (by_layer < whole));
  CHECK(timing.earlier == (!timing.layer_wise ? handoff.time((earlier + 0.25) * gb)
                           : earlier > 0.0    ? handoff.time(earlier * gb)
                                              : Tick::zero()));
}

TEST_CASE("a transfer that cannot overlap the prefill goes whole after it",
          "[disaggregation][layer-wise]") {
  const RunSpec run = split_run(2, 1, {kLayerWise});
  const KvHandoff handoff(run, run, run.cluster().disaggregation().kv_link());
  const double bytes = 1e8;
  // Started once the prefill has ended.
  const auto after =
      handoff.layer_wise(bytes / 2, bytes / 2, Tick::ms(50), Tick::ms(10), Tick::ms(40));
  CHECK_FALSE(after.layer_wise);
  CHECK(after.end == Tick::ms(50) + kv_link_copies(run, bytes));
  // An iteration of a microsecond: 32 layers' copies each paying the overhead take longer than
  // one copy after it.
  const auto short_one =
      handoff.layer_wise(0.0, bytes, Tick::ms(10), Tick::ms(10), Tick::ms(10) + Tick::us(1));
  CHECK_FALSE(short_one.layer_wise);
  CHECK(short_one.end == Tick::ms(10) + Tick::us(1) + kv_link_copies(run, bytes));
  // Earlier bytes taking longer than the iteration: every layer is computed by the time they
  // are in, and the layers follow back to back.
  const Tick earlier = kv_link_copies(run, 4 * bytes);
  REQUIRE(earlier > Tick::ms(2));
  const auto behind =
      handoff.layer_wise(4 * bytes, bytes, Tick::ms(10), Tick::ms(10), Tick::ms(12));
  CHECK(behind.layer_wise);
  CHECK(behind.earlier == earlier);
  CHECK(behind.end == Tick::ms(10) + earlier + kv_link_copies(run, bytes / 32) * 32);
  // A long one: only the last layer's copy is left once it ends.
  const auto long_one = handoff.layer_wise(0.0, bytes, Tick::ms(10), Tick::ms(10), Tick::s(1));
  CHECK(long_one.layer_wise);
  CHECK(long_one.end == Tick::s(1) + kv_link_copies(run, bytes / 32));
  CHECK(long_one.earlier == Tick::zero());
}

TEST_CASE("a prompt prefilled in one iteration crosses as its layers are computed",
          "[disaggregation][layer-wise]") {
  const RunSpec whole = split_run(2, 1);
  const RunSpec layered = split_run(2, 1, {kLayerWise});
  const auto before = serve(whole, open_loop({request_at(0, 512, 32)}));
  const auto served = serve(layered, open_loop({request_at(0, 512, 32)}));
  const Cluster& cluster = *served->cluster;
  const auto& prefill = cluster.engine(0);
  const auto& decode = cluster.engine(1);
  const double bytes = prefill.memory().kv_bytes_for(512);
  const Tick layer = kv_link_copies(layered, bytes / 32);
  REQUIRE(prefill.iteration_time().count() == 1);
  const Tick first_token = prefill.ttft().max();
  // The prefill (one iteration, from the arrival at 0) computes a layer every 1/32 of it, far
  // slower than the link sends one: only the last layer's copy is left when it ends.
  REQUIRE(first_token / 32 > layer);
  CHECK(first_token == before->cluster->engine(0).ttft().max());
  CHECK(cluster.kv_transfers().count == 1);
  CHECK(cluster.kv_transfers().layer_wise == 1);
  CHECK(cluster.kv_transfers().bytes == bytes);
  CHECK(cluster.kv_transfers().handoff.max() == layer);
  CHECK(cluster.kv_transfers().busy == layer * 32);
  // From the decode engine's admission, when the prefill began.
  CHECK(cluster.kv_transfers().transfer.max() == first_token + layer);
  // Decoding starts that much sooner than after a whole copy.
  const Tick copy = kv_link_copies(layered, bytes);
  CHECK(before->cluster->kv_transfers().handoff.max() == copy);
  CHECK(decode.e2e().max() == before->cluster->engine(1).e2e().max() - copy + layer);
  CHECK(decode.totals().requests_completed == 1);
  CHECK(prefill.kv_used().value() == 0.0);
}

TEST_CASE("a prompt of two chunks sends the first chunk's KV at once, the second's by layer",
          "[disaggregation][layer-wise]") {
  // 1,024 tokens in two chunks of 512 (the test run's chunk) over a link of 1 GB/s: the first
  // chunk's KV takes longer to cross than the second chunk's iteration, so the layers wait for it.
  const RunSpec run =
      split_run(2, 1,
                {kLayerWise, "cluster.disaggregation.kv_link.measured[0].effective_gb_per_s=1",
                 "cluster.disaggregation.kv_link.peak_gb_per_s_per_direction=1"});
  const auto served = serve(run, open_loop({request_at(0, 1024, 8)}));
  const Cluster& cluster = *served->cluster;
  const auto& prefill = cluster.engine(0);
  REQUIRE(prefill.iteration_time().count() == 2);
  const Tick first_token = prefill.ttft().max();
  REQUIRE(first_token == prefill.iteration_time().min() + prefill.iteration_time().max());
  const Tick last_started = first_token - prefill.iteration_time().max();
  const double chunk = prefill.memory().kv_bytes_for(512);
  const Tick earlier = kv_link_copies(run, chunk);
  const Tick layer = kv_link_copies(run, chunk / 32);
  REQUIRE(earlier > first_token - last_started);
  CHECK(cluster.kv_transfers().layer_wise == 1);
  CHECK(cluster.kv_transfers().handoff.max() == last_started + earlier + layer * 32 - first_token);
  CHECK(cluster.kv_transfers().busy == earlier + layer * 32);
}

TEST_CASE("with hybrid attention the last chunk's windowed layers send at most the window",
          "[disaggregation][layer-wise]") {
  // 1,024 tokens in two chunks of 512 with every second layer windowed at 100 tokens: the prompt
  // holds half of its layers' 1,024 tokens and half of 100 (562 token places); the last chunk
  // writes 512 tokens in the global layers and the window's 100 in the others (306), the rest
  // (256) goes at once. The link outpaces the layers: only the last layer's copy is left when
  // the prefill ends.
  const RunSpec run =
      split_run(2, 1, {kLayerWise, "model.sliding_window=100", "model.sliding_window_pattern=2"});
  const auto served = serve(run, open_loop({request_at(0, 1024, 8)}));
  const Cluster& cluster = *served->cluster;
  const auto& prefill = cluster.engine(0);
  REQUIRE(prefill.iteration_time().count() == 2);
  const double per_token = prefill.memory().kv_bytes_per_token;
  REQUIRE(prefill.memory().kv_bytes_for(1024) == 562 * per_token);
  const Tick earlier = kv_link_copies(run, 256 * per_token);
  const Tick layer = kv_link_copies(run, 306 * per_token / 32);
  REQUIRE(prefill.iteration_time().max() / 32 > layer);
  REQUIRE(earlier + layer * 32 < prefill.iteration_time().max() / 2);
  CHECK(cluster.kv_transfers().layer_wise == 1);
  CHECK(cluster.kv_transfers().handoff.max() == layer);
  CHECK(cluster.kv_transfers().busy == earlier + layer * 32);
}

TEST_CASE("two prompts prefilled together take turns a layer at a time",
          "[disaggregation][layer-wise]") {
  // One iteration prefills both; the decode engine's GPUs receive one copy at a time, each
  // layer of the first prompt then of the second as the layer is computed.
  const RunSpec run = split_run(2, 1, {kLayerWise});
  const auto served = serve(run, open_loop({request_at(0, 256, 8), request_at(0, 256, 8)}));
  const Cluster& cluster = *served->cluster;
  REQUIRE(cluster.engine(0).iteration_time().count() == 1);
  const double bytes = cluster.engine(0).memory().kv_bytes_for(256);
  const Tick layer = kv_link_copies(run, bytes / 32);
  CHECK(cluster.kv_transfers().count == 2);
  CHECK(cluster.kv_transfers().layer_wise == 2);
  CHECK(cluster.kv_transfers().handoff.min() == layer);
  CHECK(cluster.kv_transfers().handoff.max() == layer + layer);
  CHECK(cluster.kv_transfers().busy == layer * 64);
  CHECK(cluster.engine(1).totals().requests_completed == 2);
}

TEST_CASE("a transfer sent layer by layer leaves its lanes to others between its layers",
          "[disaggregation][layer-wise]") {
  // Two prefill engines, one decode engine. The first prompt (two chunks) starts crossing when
  // its second chunk does, at about 13.5 ms; the second (one chunk, on the other prefill engine)
  // arrives then and ends its prefill first. It waits for one of the first's layer copies at
  // most, not for the first's prefill to end.
  const RunSpec run = split_run(3, 2, {kLayerWise});
  const auto served = serve(run, open_loop({request_at(0, 1024, 8), request_at(0.014, 256, 8)}));
  const Cluster& cluster = *served->cluster;
  const auto& first = cluster.engine(0);
  const auto& second = cluster.engine(1);
  const Tick long_layer = kv_link_copies(run, first.memory().kv_bytes_for(512) / 32);
  const Tick short_layer = kv_link_copies(run, first.memory().kv_bytes_for(256) / 32);
  REQUIRE(first.iteration_time().count() == 2);
  const Tick first_token = first.ttft().max();
  const Tick second_token = second.ttft().max() + Tick::ms(14);
  REQUIRE(first_token - first.iteration_time().max() < Tick::ms(14));
  REQUIRE(second_token < first_token - long_layer);
  CHECK(cluster.kv_transfers().layer_wise == 2);
  CHECK(cluster.kv_transfers().handoff.max() <= short_layer + long_layer);
  CHECK(cluster.engine(2).totals().requests_completed == 2);
}

TEST_CASE("a prompt the decode engine holds cached is let go once its prefill has ended",
          "[disaggregation][layer-wise]") {
  // The second prompt (one 1,024-token prefix alone) is all in the decode engine's prefix
  // cache: nothing crosses, and the prefill engine frees it at its first token, not before.
  const RunSpec run =
      split_run(2, 1, {kLayerWise, "memory.kv_block_tokens=16", "memory.prefix_caching=true"});
  RequestSpec first = request_at(0, 1024, 32);
  RequestSpec second = request_at(10, 1024, 32);
  for (RequestSpec* spec : {&first, &second}) {
    spec->shared_tokens = spec->segment_tokens = 1024;
    spec->segments = {1};
  }
  const auto served = serve(run, open_loop({first, second}));
  const Cluster& cluster = *served->cluster;
  CHECK(cluster.kv_transfers().count == 1);
  CHECK(cluster.kv_transfers().handoff.count() == 2);
  CHECK(cluster.kv_transfers().handoff.min() == Tick::zero());
  CHECK(cluster.engine(0).totals().requests_handed_off == 2);
  CHECK(cluster.engine(0).kv_used().value() == 0.0);
  CHECK(cluster.engine(1).totals().requests_completed == 2);
}

TEST_CASE("a run sent layer by layer reports how many transfers overlapped their prefill",
          "[disaggregation][layer-wise]") {
  const auto whole = kvtier::test::serving_metrics(split_run(3, 1));
  const auto layered = kvtier::test::serving_metrics(split_run(3, 1, {kLayerWise}));
  CHECK(whole.at("kv_transfers_layer_wise") == 0);
  CHECK(layered.at("kv_transfers_layer_wise") > 0);
  CHECK(layered.at("kv_transfers_layer_wise") <= layered.at("kv_transfers"));
  CHECK(layered.at("kv_handoff_p50_ms") < whole.at("kv_handoff_p50_ms"));
  // Tokens count where they were computed, as sent whole.
  CHECK(layered.at("output_tokens") == whole.at("output_tokens"));
}

TEST_CASE("a layer costs the copies of the busiest GPU holding it",
          "[disaggregation][layer-wise]") {
  // Llama-3.1-8B (8 KV heads, 32 layers). Prefill TP 4 to decode TP 8: each prefill GPU sends
  // its two heads to two decode GPUs, two copies a layer of twice a decode GPU's bytes.
  const RunSpec wider = pools(4, 1, 8, 1);
  const auto& link = wider.cluster().disaggregation().kv_link();
  const KvHandoff heads(kvtier::config::prefill_pool_run(wider), wider, link);
  REQUIRE(heads.parts().size() == 2);
  CHECK(heads.parts()[0].copies_per_layer == 2);
  CHECK(heads.parts()[1].copies_per_layer == 1);
  CHECK(heads.layer_copy(3.2e7, 5) == kv_link_copies(wider, 2 * 3.2e7 / 32, 2));
  // Three prefill stages (11, 11 and 10 layers) to two decode stages of 16: each GPU's layers
  // from its stage's first, one copy a layer.
  const RunSpec staged = pools(1, 3, 1, 2);
  const KvHandoff stages(kvtier::config::prefill_pool_run(staged), staged, link);
  std::vector<std::uint32_t> firsts;
  std::vector<std::uint32_t> counts;
  for (const KvHandoff::GpuPart& part : stages.parts()) {
    firsts.push_back(part.first_layer);
    counts.push_back(part.layers);
    CHECK(part.copies_per_layer == 1);
  }
  CHECK(firsts == std::vector<std::uint32_t>{0, 11, 22, 0, 16});
  CHECK(counts == std::vector<std::uint32_t>{11, 11, 10, 16, 16});
  // A decode GPU takes a 16th of its bytes a layer, more than a prefill GPU of 11 layers sends.
  CHECK(stages.layer_copy(3.2e7, 20) == kv_link_copies(staged, 3.2e7 / 16));
}

TEST_CASE("a transfer whose layers would cost more than a copy after the prefill waits for it",
          "[disaggregation][layer-wise]") {
  // Each copy costing 5 ms: 32 layers' copies outlast a 64-token prefill and one copy after it.
  const RunSpec run =
      split_run(2, 1, {kLayerWise, "cluster.disaggregation.kv_link.per_copy_overhead_us=5000"});
  const auto served = serve(run, open_loop({request_at(0, 64, 8)}));
  const Cluster& cluster = *served->cluster;
  const Tick copy = kv_link_copies(run, cluster.engine(0).memory().kv_bytes_for(64));
  const Tick first_token = cluster.engine(0).ttft().max();
  CHECK(cluster.kv_transfers().layer_wise == 0);
  CHECK(cluster.kv_transfers().handoff.max() == copy);
  CHECK(cluster.kv_transfers().busy == copy);
  // Wanted by its decode engine when its prefill began.
  CHECK(cluster.kv_transfers().transfer.max() == first_token + copy);
}

TEST_CASE("with data-parallel attention a transfer's layers keep their lane to themselves",
          "[disaggregation][layer-wise]") {
  // DeepSeek-V2-Lite at TP 2, attention split by requests: each engine has two lanes, and two
  // prompts prefilled together (one a GPU) cross on both at once, neither waiting for the
  // other's layers.
  const RunSpec run =
      split_run(2, 1,
                {kLayerWise, "model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                 "engine.data_parallel_attention=true"});
  const auto served = serve(run, open_loop({request_at(0, 256, 8), request_at(0, 256, 8)}));
  const Cluster& cluster = *served->cluster;
  REQUIRE(cluster.kv_transfers().receiving_lanes == 2);
  REQUIRE(cluster.engine(0).iteration_time().count() == 1);
  CHECK(cluster.kv_transfers().layer_wise == 2);
  CHECK(cluster.kv_transfers().handoff.min() == cluster.kv_transfers().handoff.max());
  CHECK(cluster.engine(1).totals().requests_completed == 2);
}

TEST_CASE("a transfer waiting for its prefill to end leaves the lanes to others until then",
          "[disaggregation][layer-wise]") {
  // Each copy costing 5 ms, both prompts go whole after their prefills, on two prefill engines
  // to one decode engine. The short one's prefill ends first and its copy ends before the long
  // one's prefill does: neither waits for the other.
  const RunSpec run =
      split_run(3, 2, {kLayerWise, "cluster.disaggregation.kv_link.per_copy_overhead_us=5000"});
  const auto served = serve(run, open_loop({request_at(0, 512, 8), request_at(0, 64, 8)}));
  const Cluster& cluster = *served->cluster;
  const Tick long_copy = kv_link_copies(run, cluster.engine(0).memory().kv_bytes_for(512));
  const Tick short_copy = kv_link_copies(run, cluster.engine(0).memory().kv_bytes_for(64));
  REQUIRE(cluster.engine(1).ttft().max() + short_copy < cluster.engine(0).ttft().max());
  CHECK(cluster.kv_transfers().layer_wise == 0);
  CHECK(cluster.kv_transfers().handoff.min() == short_copy);
  CHECK(cluster.kv_transfers().handoff.max() == long_copy);
}
