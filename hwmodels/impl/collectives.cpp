#include "hwmodels/collectives.hpp"

#include <algorithm>

#include "hwmodels/link_math.hpp"

namespace kvtier::hw {

double ring_all_reduce_bytes_per_gpu(std::uint32_t gpus, double bytes) {
  if (gpus <= 1) {
    return 0.0;
  }
  return 2.0 * (gpus - 1) / gpus * bytes;
}

sim::Tick ring_all_reduce_time(const config::LinkSpec& link, std::uint32_t gpus, double bytes) {
  if (gpus <= 1) {
    return sim::Tick::zero();
  }
  const double bandwidth = asymptotic_gb_per_s(link, config::PEER) * 1e9;
  const double seconds = ring_all_reduce_bytes_per_gpu(gpus, bytes) / bandwidth +
                         2.0 * (gpus - 1) * link.hop_latency_us() * 1e-6;
  return sim::from_seconds(seconds, sim::Rounding::kUp);
}

sim::Tick hierarchical_all_reduce_time(const config::LinkSpec& gpu_link,
                                       const config::LinkSpec& network, std::uint32_t gpus_per_node,
                                       std::uint32_t nodes, double bytes) {
  const double within = ring_all_reduce_bytes_per_gpu(gpus_per_node, bytes);
  const double across = ring_all_reduce_bytes_per_gpu(nodes, bytes / gpus_per_node);
  const double seconds = std::max(within / (asymptotic_gb_per_s(gpu_link, config::PEER) * 1e9),
                                  across / (asymptotic_gb_per_s(network, config::PEER) * 1e9)) +
                         2.0 * (gpus_per_node - 1) * gpu_link.hop_latency_us() * 1e-6 +
                         2.0 * (nodes - 1) * network.hop_latency_us() * 1e-6;
  return sim::from_seconds(seconds, sim::Rounding::kUp);
}

sim::Tick all_to_all_time(const config::LinkSpec& link, std::uint32_t gpus,
                          double busiest_port_bytes) {
  if (gpus <= 1) {
    return sim::Tick::zero();
  }
  const double bandwidth = asymptotic_gb_per_s(link, config::PEER) * 1e9;
  const double seconds = busiest_port_bytes / bandwidth + link.hop_latency_us() * 1e-6;
  return sim::from_seconds(seconds, sim::Rounding::kUp);
}

sim::Tick point_to_point_time(const config::LinkSpec& link, double bytes) {
  const double bandwidth = asymptotic_gb_per_s(link, config::PEER) * 1e9;
  return sim::from_seconds(bytes / bandwidth + link.hop_latency_us() * 1e-6, sim::Rounding::kUp);
}

sim::Tick ring_all_gather_time(const config::LinkSpec& link, std::uint32_t gpus, double bytes) {
  if (gpus <= 1) {
    return sim::Tick::zero();
  }
  const double bandwidth = asymptotic_gb_per_s(link, config::PEER) * 1e9;
  const double seconds =
      (gpus - 1.0) / gpus * bytes / bandwidth + (gpus - 1.0) * link.hop_latency_us() * 1e-6;
  return sim::from_seconds(seconds, sim::Rounding::kUp);
}

}  // namespace kvtier::hw
