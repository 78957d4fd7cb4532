#pragma once
// Tensor-parallel collectives on the GPU interconnect.

#include <cstdint>

#include "configs/schema/hardware.pb.h"
#include "sim/tick.hpp"

namespace kvtier::hw {

// Ring all-reduce of `bytes` over `gpus` GPUs: each GPU sends and receives 2·(n−1)/n of the
// buffer over its slowest link, in 2·(n−1) steps that each pay the link's hop latency.
// `link` is the GPU-to-GPU link (its measured PEER bandwidth when it has one, else its peak).
// Zero for one GPU.
[[nodiscard]] sim::Tick ring_all_reduce_time(const config::LinkSpec& link, std::uint32_t gpus,
                                             double bytes);

// All-to-all over `gpus` GPUs on a switched fabric (NVSwitch), every GPU sending to every other
// at once: as long as the busiest port takes to send or receive `busiest_port_bytes`, plus one
// hop's latency. Zero for one GPU.
[[nodiscard]] sim::Tick all_to_all_time(const config::LinkSpec& link, std::uint32_t gpus,
                                        double busiest_port_bytes);

// Bytes each GPU sends in that all-reduce (for link utilisation).
[[nodiscard]] double ring_all_reduce_bytes_per_gpu(std::uint32_t gpus, double bytes);

}  // namespace kvtier::hw
