#pragma once
// The GPU as a roofline: an operation takes the longer of its math at the achievable tensor
// rate and its memory traffic at the achievable HBM bandwidth, plus a kernel-launch overhead.
// Achievable fractions differ by kind of work (GEMM, decode attention, elementwise) and come
// from the GPU preset, where their sources are cited.

#include "configs/schema/dtype.pb.h"
#include "configs/schema/hardware.pb.h"
#include "sim/tick.hpp"

namespace kvtier::hw {

enum class OpKind {
  kGemm,         // dense matrix multiplies (projections, MLP, LM head)
  kAttention,    // attention over the KV cache (memory-bound in decode)
  kElementwise,  // norms, RoPE, activations, residual adds
};

struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;  // HBM traffic: weights, activations, KV read and written
};

class GpuModel {
 public:
  explicit GpuModel(const config::GpuSpec& spec);

  // Seconds without launch overhead, as the roofline gives them.
  [[nodiscard]] double compute_seconds(OpKind kind, const OpCost& cost, config::DType math) const;
  [[nodiscard]] double memory_seconds(OpKind kind, const OpCost& cost) const;
  // max(compute, memory) + launch overhead, rounded up to the picosecond.
  [[nodiscard]] sim::Tick op_time(OpKind kind, const OpCost& cost, config::DType math) const;

  // Dense peak for a math format in FLOP/s; throws ConfigError if the GPU has no such rate.
  [[nodiscard]] double peak_flops(config::DType math) const;
  [[nodiscard]] double memory_bytes_per_second() const noexcept { return memory_bytes_per_s_; }
  [[nodiscard]] double launch_overhead_seconds() const noexcept { return launch_seconds_; }
  [[nodiscard]] const config::GpuSpec& spec() const noexcept { return spec_; }

 private:
  [[nodiscard]] double memory_fraction(OpKind kind) const;

  config::GpuSpec spec_;
  double memory_bytes_per_s_;
  double launch_seconds_;
};

}  // namespace kvtier::hw
