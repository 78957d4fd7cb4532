// The live cache's host recodes (T1 <-> T2 inside host memory, kernels/impl/kv_quantise.hpp): time
// to quantise and to dequantise one token-layer on this CPU, with the functions the cache calls
// and, side by side in the same run, with the format's plain definition (quantise::plain, rintf
// and fmax one value at a time). Both must give the same bytes; the benchmark checks that first.
//
// In a CUDA build it also times the CUDA backend's whole recodes of BF16 slots
// (cuda::host_to_float then quantise_token; dequantise_token then cuda::host_from_float).
//
// Then the batch of `tokens` quantised as the live cache spreads a phase's recodes over its
// recode threads (kernels/impl/host_recode.hpp, `kvtier live --recode-threads`): 1, 2, 4, ...
// threads up to this machine's hardware threads (16 at most), interleaved, wall time per
// token-layer; the codes must equal the single-threaded ones.
//
// Usage: kvtier_bench_kv_quantise [kv_heads=32] [head_dim=128] [tokens=512] [repeats=15]
// Prints one JSON line: microseconds per token-layer (medians over the repeats, each repeat
// recoding `tokens` distinct token-layers), the plain form's time over the shipped one's, and
// the host's kv_recode rates as a host config takes them (nanoseconds a value, one thread: the
// BF16 slot recodes in a CUDA build, the float32 ones otherwise).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/median.hpp"
#include "kernels/impl/host_recode.hpp"
#include "kernels/impl/kv_quantise.hpp"
#include "kernels/impl/worker_pool.hpp"

#ifdef KVTIER_WITH_CUDA
#include "kernels/impl/cuda_kernels.cuh"
#endif

namespace {

namespace q = kvtier::kernels::quantise;
using Clock = std::chrono::steady_clock;

int argument(int argc, char** argv, int index, int fallback) {
  if (argc <= index) {
    return fallback;
  }
  const int value = std::atoi(argv[index]);
  if (value <= 0) {
    std::fprintf(stderr, "kvtier_bench_kv_quantise: argument %d must be a positive integer\n",
                 index);
    std::exit(2);
  }
  return value;
}

using kvtier::bench::median;

}  // namespace

int main(int argc, char** argv) {
  const int kv_heads = argument(argc, argv, 1, 32);
  const int head_dim = argument(argc, argv, 2, 128);
  const int tokens = argument(argc, argv, 3, 512);
  const int repeats = argument(argc, argv, 4, 15);

  const auto values = 2 * static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(head_dim);
  const auto compressed = static_cast<std::size_t>(q::compressed_bytes(kv_heads, head_dim));
  std::vector<float> keys_values(values * static_cast<std::size_t>(tokens));
  std::mt19937 random(1);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  for (float& x : keys_values) {
    x = normal(random);
  }
  std::vector<std::int8_t> shipped(compressed * static_cast<std::size_t>(tokens));
  std::vector<std::int8_t> plain(shipped.size());
  std::vector<float> back(keys_values.size());

  const auto quantise_all = [&](auto&& quantise, std::vector<std::int8_t>& out) {
    for (int t = 0; t < tokens; ++t) {
      quantise(keys_values.data() + static_cast<std::size_t>(t) * values, kv_heads, head_dim,
               out.data() + static_cast<std::size_t>(t) * compressed);
    }
  };
  const auto shipped_quantise = [](const float* in, int heads, int dim, std::int8_t* out) {
    q::quantise_token(in, heads, dim, out);
  };
  const auto plain_quantise = [](const float* in, int heads, int dim, std::int8_t* out) {
    q::plain::quantise_token(in, heads, dim, out);
  };
  quantise_all(shipped_quantise, shipped);
  quantise_all(plain_quantise, plain);
  if (shipped != plain) {
    std::fprintf(stderr,
                 "kvtier_bench_kv_quantise: the shipped codes differ from the plain ones\n");
    return 1;
  }

  const auto per_token_us = [&](Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / tokens;
  };
  std::vector<double> shipped_us;
  std::vector<double> plain_us;
  std::vector<double> dequantise_us;
  for (int r = 0; r < repeats; ++r) {  // interleaved, so that drift hits both alike
    auto start = Clock::now();
    quantise_all(shipped_quantise, shipped);
    shipped_us.push_back(per_token_us(start));
    start = Clock::now();
    quantise_all(plain_quantise, plain);
    plain_us.push_back(per_token_us(start));
    start = Clock::now();
    for (int t = 0; t < tokens; ++t) {
      q::dequantise_token(shipped.data() + static_cast<std::size_t>(t) * compressed, kv_heads,
                          head_dim, back.data() + static_cast<std::size_t>(t) * values);
    }
    dequantise_us.push_back(per_token_us(start));
  }
#ifdef KVTIER_WITH_CUDA
  // The CUDA backend's recodes: its T1 slots hold BF16.
  namespace cuda = kvtier::kernels::cuda;
  std::vector<std::uint16_t> slots(keys_values.size());
  cuda::host_from_float(cuda::Dtype::kBF16, keys_values.data(), slots.data(),
                        static_cast<std::int64_t>(slots.size()));
  std::vector<float> token(values);
  std::vector<double> bf16_quantise_us;
  std::vector<double> bf16_dequantise_us;
  for (int r = 0; r < repeats; ++r) {
    auto start = Clock::now();
    for (int t = 0; t < tokens; ++t) {
      cuda::host_to_float(cuda::Dtype::kBF16, slots.data() + static_cast<std::size_t>(t) * values,
                          token.data(), static_cast<std::int64_t>(values));
      q::quantise_token(token.data(), kv_heads, head_dim,
                        shipped.data() + static_cast<std::size_t>(t) * compressed);
    }
    bf16_quantise_us.push_back(per_token_us(start));
    start = Clock::now();
    for (int t = 0; t < tokens; ++t) {
      q::dequantise_token(shipped.data() + static_cast<std::size_t>(t) * compressed, kv_heads,
                          head_dim, token.data());
      cuda::host_from_float(cuda::Dtype::kBF16, token.data(),
                            slots.data() + static_cast<std::size_t>(t) * values,
                            static_cast<std::int64_t>(values));
    }
    bf16_dequantise_us.push_back(per_token_us(start));
  }
  char cuda_figures[160];
  std::snprintf(cuda_figures, sizeof cuda_figures,
                ", \"bf16_slot_quantise_us_per_token_layer\": %.3f, "
                "\"bf16_slot_dequantise_us_per_token_layer\": %.3f",
                median(bf16_quantise_us), median(bf16_dequantise_us));
  // The host's kv_recode rates as a host config takes them (HostSpec.kv_recode): one thread's
  // time per value, from the recodes of BF16 slots (what a BF16 KV cache recodes).
  const char* const rates_dtype = "bf16";
  const double to_compressed_us = median(bf16_quantise_us);
  const double to_full_us = median(bf16_dequantise_us);
#else
  const char* const cuda_figures = "";
  const char* const rates_dtype = "fp32";
  const double to_compressed_us = median(shipped_us);
  const double to_full_us = median(dequantise_us);
#endif
  char rate_figures[192];
  std::snprintf(rate_figures, sizeof rate_figures,
                ", \"kv_recode_dtype\": \"%s\", \"kv_recode_to_compressed_ns_per_value\": %.4f, "
                "\"kv_recode_to_full_ns_per_value\": %.4f",
                rates_dtype, to_compressed_us * 1e3 / static_cast<double>(values),
                to_full_us * 1e3 / static_cast<double>(values));
  // The batch over the recode pool, as the live cache recodes a phase.
  std::vector<int> pool_threads;
  const int hardware = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  for (int threads = 1; threads <= std::min(hardware, 16); threads *= 2) {
    pool_threads.push_back(threads);
  }
  std::vector<std::unique_ptr<kvtier::kernels::WorkerPool>> pools;
  pools.reserve(pool_threads.size());
  for (const int threads : pool_threads) {
    pools.push_back(std::make_unique<kvtier::kernels::WorkerPool>(threads));
  }
  std::vector<std::vector<double>> pool_us(pools.size());
  std::vector<std::int8_t> pooled(shipped.size());
  quantise_all(shipped_quantise, shipped);
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t p = 0; p < pools.size(); ++p) {
      std::fill(pooled.begin(), pooled.end(), std::int8_t{0});
      const auto start = Clock::now();
      kvtier::kernels::recode_on_pool(*pools[p], static_cast<std::size_t>(tokens), values, 0,
                                      [&](std::size_t t, float*) {
                                        q::quantise_token(keys_values.data() + t * values, kv_heads,
                                                          head_dim, pooled.data() + t * compressed);
                                      });
      pool_us[p].push_back(per_token_us(start));
      if (pooled != shipped) {
        std::fprintf(stderr, "kvtier_bench_kv_quantise: %d threads wrote other codes\n",
                     pool_threads[p]);
        return 1;
      }
    }
  }
  std::string pool_figures = ", \"pool_threads\": [";
  std::string pool_times = "], \"pool_quantise_us_per_token_layer\": [";
  for (std::size_t p = 0; p < pools.size(); ++p) {
    char figure[32];
    std::snprintf(figure, sizeof figure, "%.3f", median(pool_us[p]));
    pool_figures += (p == 0 ? "" : ", ") + std::to_string(pool_threads[p]);
    pool_times += (p == 0 ? "" : ", ") + std::string(figure);
  }
  pool_figures += pool_times + "]";

  const double quantise = median(shipped_us);
  const double reference = median(plain_us);
  std::printf(
      "{\"kv_heads\": %d, \"head_dim\": %d, \"tokens\": %d, \"repeats\": %d, "
      "\"quantise_us_per_token_layer\": %.3f, \"plain_quantise_us_per_token_layer\": %.3f, "
      "\"plain_over_shipped\": %.2f, \"dequantise_us_per_token_layer\": %.3f, "
      "\"checksum\": %.6f%s%s%s}\n",
      kv_heads, head_dim, tokens, repeats, quantise, reference, reference / quantise,
      median(dequantise_us), static_cast<double>(back[values / 2]), cuda_figures, rate_figures,
      pool_figures.c_str());
  return 0;
}
