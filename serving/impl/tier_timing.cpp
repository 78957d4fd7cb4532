#include "serving/tier_timing.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "hwmodels/link_math.hpp"
#include "hwmodels/topology.hpp"
#include "sim/flow_network.hpp"
#include "sim/simulator.hpp"

namespace kvtier::serving {
namespace {

// Large enough that the setup cost is negligible against the transfer.
constexpr std::uint64_t kProbeBytes = std::uint64_t{1} << 32;

double probe_rate(const config::RunSpec& run, hw::HostMemory memory, bool to_gpu) {
  sim::Simulator simulator;
  sim::FlowNetwork network(simulator);
  const hw::NodeTopology topology(run.hardware().node(), memory, network);
  sim::Tick last;
  for (std::uint32_t gpu = 0; gpu < topology.gpu_count(); ++gpu) {
    network.start_flow(to_gpu ? topology.host_to_gpu(gpu) : topology.gpu_to_host(gpu), kProbeBytes,
                       sim::Tick::zero(),
                       [&last, &simulator] { last = std::max(last, simulator.now()); });
  }
  simulator.run();
  return static_cast<double>(kProbeBytes) / sim::to_seconds(last);
}

sim::Tick copy_time(double bytes, double rate, sim::Tick setup) {
  if (bytes <= 0.0) {
    return sim::Tick::zero();
  }
  return setup + sim::from_seconds(bytes / rate, sim::Rounding::kUp);
}

// Full-precision and compressed bytes copied by SM kernels in one direction: a kernel each (the
// slot kernel, a T2 kernel), each with its setup.
sim::Tick kernels_time(double full, double compressed, const CopyRates& rates, bool to_gpu) {
  return to_gpu ? copy_time(full, rates.h2d_bytes_per_s, rates.h2d_setup) +
                      copy_time(compressed, rates.t2_h2d_bytes_per_s, rates.t2_h2d_setup)
                : copy_time(full, rates.d2h_bytes_per_s, rates.d2h_setup) +
                      copy_time(compressed, rates.t2_d2h_bytes_per_s, rates.t2_d2h_setup);
}

// A GPU's compute of a layer: the slowest GPU's, less by how much its own part is lighter.
sim::Tick own_compute(sim::Tick layer_compute, std::span<const sim::Tick> lighter_by,
                      std::size_t gpu) {
  return lighter_by.empty() ? layer_compute : layer_compute - lighter_by[gpu];
}

// Copies and compute take turns on each GPU's SMs: each layer's staging, then the layer, which
// ends on the slowest GPU; after the last layer each GPU's offloads of every layer, then its
// promotions, in batches (as the live cache moves them). Every kind is a kernel of its own, with
// its own setup.
PipelineTiming time_turns(sim::Tick layer_compute,
                          std::span<const std::span<const LayerCopies>> gpus,
                          std::span<const sim::Tick> lighter_by, const CopyRates& rates) {
  PipelineTiming timing;
  sim::Tick now;
  // Each GPU's promotions and offloads of the iteration, all layers together.
  std::vector<LayerCopies> moved(gpus.size());
  for (std::size_t layer = 0; layer < gpus.front().size(); ++layer) {
    sim::Tick slowest;   // a GPU's staging and compute of the layer
    sim::Tick computed;  // the same without the staging
    for (std::size_t gpu = 0; gpu < gpus.size(); ++gpu) {
      const LayerCopies& copies = gpus[gpu][layer];
      const sim::Tick h2d =
          kernels_time(copies.staged_full, copies.staged_compressed, rates, /*to_gpu=*/true);
      timing.h2d_busy += h2d;
      const sim::Tick own = own_compute(layer_compute, lighter_by, gpu) + copies.extra_compute;
      slowest = std::max(slowest, h2d + own);
      computed = std::max(computed, own);
      moved[gpu].promoted_full += copies.promoted_full;
      moved[gpu].promoted_compressed += copies.promoted_compressed;
      moved[gpu].offloaded_full += copies.offloaded_full;
      moved[gpu].offloaded_compressed += copies.offloaded_compressed;
    }
    timing.stall += slowest - computed;
    now += slowest;
  }
  timing.layers_end = now;
  timing.end = now;
  for (const LayerCopies& batches : moved) {
    const sim::Tick offloads =
        kernels_time(batches.offloaded_full, batches.offloaded_compressed, rates, false);
    const sim::Tick promotions =
        kernels_time(batches.promoted_full, batches.promoted_compressed, rates, true);
    timing.d2h_busy += offloads;
    timing.h2d_busy += promotions;
    timing.trailing = std::max(timing.trailing, offloads + promotions);
  }
  return timing;
}

CopyRates copy_engine_rates(const config::RunSpec& run, hw::HostMemory memory) {
  sim::Simulator simulator;
  sim::FlowNetwork network(simulator);
  const hw::NodeTopology topology(run.hardware().node(), hw::HostMemory::kPinned, network);
  CopyRates rates;
  rates.method = config::COPY_ENGINES;
  rates.h2d_bytes_per_s = rates.t2_h2d_bytes_per_s = probe_rate(run, memory, true);
  rates.d2h_bytes_per_s = rates.t2_d2h_bytes_per_s = probe_rate(run, memory, false);
  rates.h2d_setup = rates.d2h_setup = rates.t2_h2d_setup = rates.t2_d2h_setup =
      topology.copy_setup();
  return rates;
}

}  // namespace

CopyRates measure_copy_rates(const config::RunSpec& run) {
  const CopyRates engines = copy_engine_rates(
      run, run.tiering().host_allocation() == config::PAGEABLE ? hw::HostMemory::kPageable
                                                               : hw::HostMemory::kPinned);
  if (run.tiering().copy_method() != config::SM_KERNELS) {
    return engines;
  }
  const double probed_h2d = engines.h2d_bytes_per_s;
  const double probed_d2h = engines.d2h_bytes_per_s;
  CopyRates rates;
  rates.method = config::SM_KERNELS;
  // The kernels' own rate caps what the link gives each GPU (a link shared at a switch may give
  // less).
  const config::LinkSpec& link = run.hardware().node().host_link();
  const auto setup = [](double us) { return sim::from_microseconds(us, sim::Rounding::kUp); };
  rates.h2d_bytes_per_s = std::min(probed_h2d, hw::sm_kernel_gb_per_s(link, config::H2D) * 1e9);
  rates.d2h_bytes_per_s = std::min(probed_d2h, hw::sm_kernel_gb_per_s(link, config::D2H) * 1e9);
  rates.h2d_setup = setup(hw::sm_kernel_overhead_us(link, config::H2D));
  rates.d2h_setup = setup(hw::sm_kernel_overhead_us(link, config::D2H));
  rates.t2_h2d_bytes_per_s =
      std::min(probed_h2d, hw::sm_kernel_t2_gb_per_s(link, config::H2D) * 1e9);
  rates.t2_d2h_bytes_per_s =
      std::min(probed_d2h, hw::sm_kernel_t2_gb_per_s(link, config::D2H) * 1e9);
  rates.t2_h2d_setup = setup(hw::sm_kernel_t2_overhead_us(link, config::H2D));
  rates.t2_d2h_setup = setup(hw::sm_kernel_t2_overhead_us(link, config::D2H));
  return rates;
}

CopyRates measure_swap_rates(const config::RunSpec& run) {
  return copy_engine_rates(run, hw::HostMemory::kPinned);
}

sim::Tick swap_time(double bytes, std::uint64_t copies, double bytes_per_s, sim::Tick per_copy) {
  if (copies == 0) {
    return sim::Tick::zero();
  }
  return per_copy * static_cast<std::int64_t>(copies) +
         sim::from_seconds(bytes / bytes_per_s, sim::Rounding::kUp);
}

PipelineTiming time_pipeline(sim::Tick layer_compute, std::span<const LayerCopies> layers,
                             std::uint32_t lookahead, const CopyRates& rates) {
  const std::span<const LayerCopies> one_gpu[] = {layers};
  return time_pipeline(layer_compute, one_gpu, lookahead, rates);
}

PipelineTiming time_pipeline(sim::Tick layer_compute,
                             std::span<const std::span<const LayerCopies>> gpus,
                             std::uint32_t lookahead, const CopyRates& rates,
                             std::span<const sim::Tick> lighter_by) {
  if (gpus.empty()) {
    throw std::invalid_argument("a copy pipeline needs at least one GPU's copies");
  }
  if (!lighter_by.empty()) {
    if (lighter_by.size() != gpus.size()) {
      throw std::invalid_argument("lighter compute given for " + std::to_string(lighter_by.size()) +
                                  " GPUs of " + std::to_string(gpus.size()));
    }
    for (const sim::Tick lighter : lighter_by) {
      if (lighter < sim::Tick::zero() || lighter > layer_compute) {
        throw std::invalid_argument(
            "a GPU's compute lighter than the slowest's by less than "
            "nothing or more than the layer");
      }
    }
  }
  const std::size_t layers = gpus.front().size();
  for (const std::span<const LayerCopies> own : gpus) {
    if (own.size() != layers) {
      throw std::invalid_argument("GPUs' copies over " + std::to_string(own.size()) + " and " +
                                  std::to_string(layers) + " layers: each GPU copies each layer");
    }
  }
  if (rates.method == config::SM_KERNELS) {
    return time_turns(layer_compute, gpus, lighter_by, rates);
  }
  PipelineTiming timing;
  // By GPU: when each layer started, when its H2D engine is next idle, its offloads' time.
  std::vector<std::vector<sim::Tick>> starts(gpus.size(), std::vector<sim::Tick>(layers));
  std::vector<sim::Tick> copy_free(gpus.size());
  std::vector<sim::Tick> d2h(gpus.size());
  sim::Tick previous_end;  // when the previous layer finished on every GPU
  for (std::size_t layer = 0; layer < layers; ++layer) {
    sim::Tick end;
    sim::Tick computed;  // when the layer would end with every copy in
    for (std::size_t gpu = 0; gpu < gpus.size(); ++gpu) {
      const LayerCopies& copies = gpus[gpu][layer];
      // The staging slot for this layer frees when layer − lookahead starts; synchronous copies
      // (lookahead 0) wait for the previous layer to finish.
      const sim::Tick slot = lookahead == 0       ? previous_end
                             : layer >= lookahead ? starts[gpu][layer - lookahead]
                                                  : sim::Tick::zero();
      const sim::Tick h2d = copy_time(copies.h2d_bytes(), rates.h2d_bytes_per_s, rates.h2d_setup);
      const sim::Tick copy_start = std::max(copy_free[gpu], slot);
      const sim::Tick arrived = h2d > sim::Tick::zero() ? copy_start + h2d : sim::Tick::zero();
      if (h2d > sim::Tick::zero()) {
        copy_free[gpu] = arrived;
        timing.h2d_busy += h2d;
      }
      // A GPU starts the layer once every GPU has finished the previous one (data-parallel
      // attention's GPUs meet at each layer's MLP) and its own copy has arrived.
      starts[gpu][layer] = std::max(previous_end, arrived);
      const sim::Tick own = own_compute(layer_compute, lighter_by, gpu) + copies.extra_compute;
      end = std::max(end, starts[gpu][layer] + own);
      computed = std::max(computed, previous_end + own);
      const sim::Tick offload =
          copy_time(copies.d2h_bytes(), rates.d2h_bytes_per_s, rates.d2h_setup);
      d2h[gpu] += offload;
      timing.d2h_busy += offload;
    }
    // What the layer waited for copies beyond its own compute.
    timing.stall += end - computed;
    previous_end = end;
  }
  timing.layers_end = previous_end;
  timing.end = std::max(previous_end, *std::max_element(d2h.begin(), d2h.end()));
  return timing;
}

double recode_makespan_ns(double token_layers, double one_thread_ns, double values_per_token_layer,
                          const config::HostRecodeSpec& pool) {
  if (token_layers <= 0.0 ||
      token_layers * values_per_token_layer < static_cast<double>(pool.parallel_min_values())) {
    return one_thread_ns;
  }
  // The threads take the list's chunks in turn as they finish them, every token-layer the
  // iteration's mean time (the two kinds of recode mix within its list): the busiest thread runs
  // a full chunk in each round, but where the last round is the short last chunk alone.
  const double chunk = pool.chunk_token_layers();
  const double chunks = std::ceil(token_layers / chunk);
  const double threads = std::min<double>(pool.threads(), chunks);
  const double rounds = std::ceil(chunks / threads);
  const double last = token_layers - (chunks - 1) * chunk;  // the last chunk's token-layers
  const bool short_last_alone = chunks - 1 == (rounds - 1) * threads;
  const double busiest = short_last_alone ? (rounds - 1) * chunk + last : rounds * chunk;
  return one_thread_ns * busiest / token_layers;
}

}  // namespace kvtier::serving
