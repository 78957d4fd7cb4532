#include "hwmodels/gpu_model.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace kvtier::hw {

GpuModel::GpuModel(const config::GpuSpec& spec)
    : spec_(spec),
      memory_bytes_per_s_(spec.memory_bandwidth_gb_per_s() * 1e9),
      launch_seconds_(spec.efficiency().kernel_launch_overhead_us() * 1e-6) {}

double GpuModel::peak_flops(config::DType math) const {
  for (const auto& rate : spec_.compute()) {
    if (rate.dtype() == math) {
      return rate.dense_tflops() * 1e12;
    }
  }
  throw ConfigError("GPU " + spec_.name() + " has no " + config::DType_Name(math) + " tensor rate");
}

double GpuModel::memory_fraction(OpKind kind) const {
  switch (kind) {
    case OpKind::kGemm: return spec_.efficiency().gemm_memory_fraction();
    case OpKind::kAttention: return spec_.efficiency().attention_memory_fraction();
    case OpKind::kElementwise: return spec_.efficiency().elementwise_memory_fraction();
  }
  return 1.0;
}

double GpuModel::compute_seconds(OpKind /*kind*/, const OpCost& cost, config::DType math) const {
  if (cost.flops <= 0.0) {
    return 0.0;
  }
  // Attention's matrix products run on the same tensor cores as GEMMs; elementwise FLOPs are
  // negligible next to their memory traffic and are costed the same way for simplicity.
  return cost.flops / (peak_flops(math) * spec_.efficiency().gemm_compute_fraction());
}

double GpuModel::memory_seconds(OpKind kind, const OpCost& cost) const {
  return cost.bytes / (memory_bytes_per_s_ * memory_fraction(kind));
}

sim::Tick GpuModel::op_time(OpKind kind, const OpCost& cost, config::DType math) const {
  const double seconds =
      std::max(compute_seconds(kind, cost, math), memory_seconds(kind, cost)) + launch_seconds_;
  return sim::from_seconds(seconds, sim::Rounding::kUp);
}

}  // namespace kvtier::hw
