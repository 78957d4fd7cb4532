#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/errors.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "hwmodels/collectives.hpp"
#include "hwmodels/gpu_model.hpp"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/config_fixture.hpp"

using kvtier::hw::OpCost;
using kvtier::hw::OpKind;

using kvtier::test::preset;

namespace {

double seconds(kvtier::sim::Tick tick) {
  return kvtier::sim::to_seconds(tick);
}

}  // namespace

TEST_CASE("an operation takes the longer of its math and its memory traffic, plus a launch",
          "[gpu_model]") {
  const auto gpu_spec = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const kvtier::hw::GpuModel gpu(gpu_spec);
  const double launch = 4e-6;
  // Memory-bound: 1 GB at 3350 GB/s x 0.90.
  const OpCost streaming{1e9, 1e9};
  CHECK(seconds(gpu.op_time(OpKind::kGemm, streaming, kvtier::config::BF16)) ==
        Approx(1e9 / (3350e9 * 0.90) + launch).epsilon(1e-9).margin(1e-12));
  // Compute-bound: 1e15 FLOP at 989 TFLOP/s x 0.70.
  const OpCost math{1e15, 1e6};
  CHECK(seconds(gpu.op_time(OpKind::kGemm, math, kvtier::config::BF16)) ==
        Approx(1e15 / (989e12 * 0.70) + launch).epsilon(1e-9).margin(1e-12));
  // FP8 runs at its own rate.
  CHECK(seconds(gpu.op_time(OpKind::kGemm, math, kvtier::config::FP8_E4M3)) ==
        Approx(1e15 / (1979e12 * 0.70) + launch).epsilon(1e-9).margin(1e-12));
  // Attention uses its own (lower) memory fraction.
  CHECK(seconds(gpu.op_time(OpKind::kAttention, streaming, kvtier::config::BF16)) ==
        Approx(1e9 / (3350e9 * 0.55) + launch).epsilon(1e-9).margin(1e-12));
  CHECK_THROWS_AS(gpu.peak_flops(kvtier::config::INT4), kvtier::ConfigError);
}

TEST_CASE("ring all-reduce moves 2(n-1)/n of the buffer and pays 2(n-1) hop latencies",
          "[collectives]") {
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  const double peer = 378e9;  // the preset's measured PEER bandwidth
  const double bytes = 64e6;
  CHECK(kvtier::hw::ring_all_reduce_bytes_per_gpu(4, bytes) == Approx(1.5 * bytes));
  CHECK(
      seconds(kvtier::hw::ring_all_reduce_time(nvlink, 4, bytes)) ==
      Approx(1.5 * bytes / peer + 6 * nvlink.hop_latency_us() * 1e-6).epsilon(1e-9).margin(1e-12));
  CHECK(kvtier::hw::ring_all_reduce_time(nvlink, 1, bytes) == kvtier::sim::Tick::zero());
}

TEST_CASE("a batch-1 decode of a memory-bound model reads the weights once per iteration",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const auto model = preset<kvtier::config::ModelSpec>("model", "Llama-3.1-8B");
  const kvtier::hw::IterationCostModel costs(model, gpu, nullptr, 1);
  kvtier::hw::BatchShape batch;
  batch.decode_tokens = 1;
  batch.decode_context_tokens = 1;
  batch.logits_tokens = 1;
  const auto cost = costs.cost(batch);
  // Every matrix weight is read once: all parameters but the embedding table, whose rows are
  // looked up (the untied LM head is a separate matrix) and the norms (elementwise).
  const auto count = kvtier::hw::count_parameters(model);
  const double matrix_weights =
      static_cast<double>(32 * (count.attention_per_layer + count.mlp_per_layer) + count.lm_head);
  const double expected_gemm = matrix_weights * 2.0 / (3350e9 * 0.90) + (4 * 32 + 1) * 4e-6;
  CHECK(seconds(cost.gemm) == Approx(expected_gemm).epsilon(0.002));
  CHECK(cost.total == cost.gemm + cost.attention + cost.elementwise + cost.all_reduce);
  CHECK(cost.all_reduce == kvtier::sim::Tick::zero());
  // The whole iteration: weights over bandwidth plus a launch per kernel, within 1%.
  CHECK(seconds(cost.total) ==
        Approx(matrix_weights * 2.0 / (3350e9 * 0.90) + cost.kernels * 4e-6).epsilon(0.01));
  CHECK(cost.kernels == 32 * 9 + 3);
}

TEST_CASE("iteration cost grows with batch and context, and TP splits it", "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const auto model = preset<kvtier::config::ModelSpec>("model", "Llama-3.1-70B");
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  kvtier::hw::BatchShape small;
  small.decode_tokens = 8;
  small.decode_context_tokens = 8 * 1024;
  small.logits_tokens = 8;
  kvtier::hw::BatchShape long_context = small;
  long_context.decode_context_tokens = 8 * 32768;
  const kvtier::hw::IterationCostModel tp4(model, gpu, &nvlink, 4);
  const kvtier::hw::IterationCostModel tp8(model, gpu, &nvlink, 8);
  CHECK(tp4.cost(long_context).attention > tp4.cost(small).attention);
  CHECK(tp4.cost(long_context).gemm == tp4.cost(small).gemm);
  CHECK(tp8.cost(small).gemm < tp4.cost(small).gemm);
  CHECK(tp4.cost(small).all_reduce > kvtier::sim::Tick::zero());
  CHECK(tp4.cost(small).interconnect_bytes ==
        Approx(2 * 80 * kvtier::hw::ring_all_reduce_bytes_per_gpu(4, 8 * 8192 * 2.0)));
  // Prefill of a long chunk is compute-bound: doubling the chunk roughly doubles the GEMM time.
  kvtier::hw::BatchShape prefill;
  prefill.prefill.push_back({4096, 0});
  prefill.logits_tokens = 1;
  kvtier::hw::BatchShape double_prefill;
  double_prefill.prefill.push_back({8192, 0});
  double_prefill.logits_tokens = 1;
  const double ratio = seconds(tp4.cost(double_prefill).gemm) / seconds(tp4.cost(prefill).gemm);
  CHECK(ratio == Approx(2.0).epsilon(0.05));
  CHECK_THROWS_AS(kvtier::hw::IterationCostModel(model, gpu, nullptr, 4), kvtier::ConfigError);
}

TEST_CASE("row-parallel projections read their slice of the input and write the whole output",
          "[iteration_cost]") {
  // The MLP's bytes per GPU as the FFN width f grows by Δ, for T tokens at TP t: gate/up (column
  // split) read 2hΔ/t more weights and write 2TΔ/t more; SiLU·up reads 2TΔ/t and writes TΔ/t;
  // the down projection (row split) reads hΔ/t more weights and TΔ/t more input, and writes the
  // same hidden-wide partial sums: Δ/t·(3h·w + 6T·a) per layer.
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  auto model = preset<kvtier::config::ModelSpec>("model", "Llama-3.1-70B");
  constexpr double kTokens = 2048;
  constexpr double kTp = 4;
  constexpr double kDelta = 4096;
  kvtier::hw::BatchShape prefill;
  prefill.prefill.push_back({static_cast<std::uint64_t>(kTokens), 0});
  prefill.logits_tokens = 1;
  const double narrow =
      kvtier::hw::IterationCostModel(model, gpu, &nvlink, 4).cost(prefill).hbm_bytes;
  model.set_intermediate_size(model.intermediate_size() + static_cast<std::uint32_t>(kDelta));
  const double wide =
      kvtier::hw::IterationCostModel(model, gpu, &nvlink, 4).cost(prefill).hbm_bytes;
  const double hidden = model.hidden_size();
  const double bytes = 2.0;  // BF16 weights and activations
  CHECK(wide - narrow == Approx(model.num_hidden_layers() * kDelta / kTp *
                                (3 * hidden * bytes + 6 * kTokens * bytes))
                             .epsilon(1e-9));
}

TEST_CASE("a prefill chunk attends and reads only the sliding window", "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  auto windowed = preset<kvtier::config::ModelSpec>("model", "Llama-3.1-8B");
  windowed.set_sliding_window(4096);
  auto unwindowed = windowed;
  unwindowed.clear_sliding_window();
  const kvtier::hw::IterationCostModel with_window(windowed, gpu, nullptr, 1);
  const kvtier::hw::IterationCostModel without(unwindowed, gpu, nullptr, 1);
  const auto chunk = [](std::uint64_t tokens, std::uint64_t before) {
    kvtier::hw::BatchShape batch;
    batch.prefill.push_back({tokens, before});
    batch.logits_tokens = 1;
    return batch;
  };
  // Within the window the window changes nothing.
  CHECK(with_window.cost(chunk(2048, 1024)).total == without.cost(chunk(2048, 1024)).total);
  // 2,048 queries after 8,192 tokens: each attends 4,096 keys instead of 8,192 + i, and the chunk
  // reads 4,096 + 2,047 keys instead of 10,240.
  const double n = 2048;
  const double before = 8192;
  const double window = 4096;
  const double per_key_flops = 4.0 * windowed.num_attention_heads() * windowed.head_dim();
  const double layers = windowed.num_hidden_layers();
  const auto long_context = chunk(2048, 8192);
  CHECK(without.cost(long_context).flops - with_window.cost(long_context).flops ==
        Approx(layers * per_key_flops * (n * (before + (n + 1) / 2) - n * window)).epsilon(1e-9));
  const double kv_bytes_per_token = kvtier::hw::kv_bytes_per_token_per_layer(windowed);
  CHECK(without.cost(long_context).hbm_bytes - with_window.cost(long_context).hbm_bytes ==
        Approx(layers * kv_bytes_per_token * ((before + n) - (window + n - 1))).epsilon(1e-9));
  CHECK(with_window.cost(long_context).attention < without.cost(long_context).attention);
  // A chunk straddling the window's edge: queries 1..1024 see before + i ≤ 4,096 keys, the rest
  // 4,096.
  const auto straddling = chunk(2048, 3072);
  const double m = 1024;
  const double straddling_attended = m * 3072 + m * (m + 1) / 2 + (n - m) * window;
  CHECK(without.cost(straddling).flops - with_window.cost(straddling).flops ==
        Approx(layers * per_key_flops * (n * (3072 + (n + 1) / 2) - straddling_attended))
            .epsilon(1e-9));
}

TEST_CASE("a mixture of experts reads the experts a batch reaches and computes those it uses",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const auto model = preset<kvtier::config::ModelSpec>("model", "Mixtral-8x7B-v0.1");
  const kvtier::hw::IterationCostModel costs(model, gpu, nullptr, 1);
  const auto count = kvtier::hw::count_parameters(model);
  const double layers = model.num_hidden_layers();
  const auto decode = [](std::uint32_t batch) {
    kvtier::hw::BatchShape shape;
    shape.decode_tokens = batch;
    shape.decode_context_tokens = batch;  // one token of context each: attention is negligible
    return shape;
  };
  // Matrix weights an iteration of `tokens` reads: attention and router whole, and the experts
  // the batch reaches, E·(1 − (1 − k/E)^T) of them in expectation.
  const auto weights_read = [&](double tokens) {
    const double reached = 8.0 * (1.0 - std::pow(1.0 - 2.0 / 8.0, tokens));
    return layers * (static_cast<double>(count.attention_per_layer + count.router) +
                     reached * static_cast<double>(count.expert));
  };
  // One token reaches its two experts: the iteration reads 12.9B-class weights, not 46.7B.
  const auto one = costs.cost(decode(1));
  const double activations_one = one.hbm_bytes - 2.0 * weights_read(1);
  CHECK(activations_one > 0.0);
  CHECK(activations_one < 0.001 * one.hbm_bytes);
  // 64 tokens reach all 8 experts but for a vanishing share: every expert's weights are read.
  const auto many = costs.cost(decode(64));
  CHECK(many.hbm_bytes > 2.0 * weights_read(64));
  CHECK(weights_read(64) ==
        Approx(layers * static_cast<double>(count.mlp_per_layer + count.attention_per_layer))
            .epsilon(1e-6));
  CHECK(many.hbm_bytes - 2.0 * weights_read(64) < 0.02 * many.hbm_bytes);  // activations
  // FLOPs follow the experts tokens use (k per token), not the experts reached.
  const double linear_per_token =
      2.0 * layers * static_cast<double>(count.attention_per_layer + count.active_mlp_per_layer);
  CHECK(many.flops == Approx(64 * linear_per_token).epsilon(0.01));
  CHECK(one.flops == Approx(linear_per_token).epsilon(0.01));
  // Per layer: router, the experts' two grouped GEMMs, their activation and the weighted sum, on
  // top of the dense layer's kernels less the dense MLP's three; and the embedding lookup.
  CHECK(one.kernels == 32 * (9 - 3 + 5) + 1);
}

TEST_CASE("tensor parallelism splits every expert, and a shared expert adds a dense MLP",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  auto model = preset<kvtier::config::ModelSpec>("model", "Qwen3-30B-A3B");
  kvtier::hw::BatchShape batch;
  batch.decode_tokens = 16;
  batch.decode_context_tokens = 16;
  const kvtier::hw::IterationCostModel tp1(model, gpu, nullptr, 1);
  const kvtier::hw::IterationCostModel tp2(model, gpu, &nvlink, 2);
  // The experts' GEMM bytes halve; the router's, replicated, do not.
  CHECK(tp2.cost(batch).hbm_bytes < 0.55 * tp1.cost(batch).hbm_bytes);
  CHECK(tp2.cost(batch).hbm_bytes > 0.5 * tp1.cost(batch).hbm_bytes);
  model.mutable_moe()->set_shared_expert_intermediate_size(4096);
  const kvtier::hw::IterationCostModel shared(model, gpu, nullptr, 1);
  // Its weights in BF16, and its activations: 16 tokens through gate/up (2048 in, 8192 out),
  // SiLU·up (8192 in, 4096 out) and down (4096 in, 2048 out), two bytes each.
  const double layers = model.num_hidden_layers();
  const double shared_weights = 3.0 * 2048 * 4096 * layers;
  const double shared_activations = 16.0 * ((2048 + 8192) + (8192 + 4096) + (4096 + 2048)) * 2;
  CHECK(shared.cost(batch).hbm_bytes - tp1.cost(batch).hbm_bytes ==
        Approx(2.0 * shared_weights + layers * shared_activations).epsilon(1e-12));
  CHECK(shared.cost(batch).kernels == tp1.cost(batch).kernels + 3 * model.num_hidden_layers());
}

TEST_CASE("a verified draft costs a decode token's work without reading its request's KV again",
          "[iteration_cost]") {
  // One request verifying three drafts beside its newest token against four requests of the
  // same context decoding a token each: the same FLOPs (the drafts attend the context as the
  // newest does), and the KV read once instead of four times.
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const std::string name = GENERATE("Llama-3.1-8B", "DeepSeek-V2-Lite");
  const auto model = preset<kvtier::config::ModelSpec>("model", name.c_str());
  const kvtier::hw::IterationCostModel costs(model, gpu, nullptr, 1);
  constexpr std::uint64_t kContext = 4096;
  kvtier::hw::BatchShape verify = kvtier::test::decode(1, kContext);
  verify.decode_draft_tokens = 3;
  verify.logits_tokens = 4;
  const auto drafted = costs.cost(verify);
  const auto apart = costs.cost(kvtier::test::decode(4, kContext));
  INFO(name);
  CHECK(drafted.flops == Approx(apart.flops).epsilon(1e-12));
  const double kv_read_again =
      3.0 * kContext * kvtier::hw::kv_bytes_per_token_per_layer(model) * model.num_hidden_layers();
  CHECK(apart.hbm_bytes - drafted.hbm_bytes == Approx(kv_read_again).epsilon(1e-9));
  CHECK(drafted.total < apart.total);
}
