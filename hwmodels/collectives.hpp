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

// All-reduce of `bytes` over `nodes` nodes of `gpus_per_node` GPUs each (nodes > 1): a
// reduce-scatter within each node over `gpu_link`, an all-reduce of each GPU's 1/gpus_per_node
// share with the GPUs of the same place in the other nodes over its own adapter (`network`), an
// all-gather within the node. NCCL pipelines the phases chunk by chunk, so the slower link sets
// the pace while every step's latency adds.
[[nodiscard]] sim::Tick hierarchical_all_reduce_time(const config::LinkSpec& gpu_link,
                                                     const config::LinkSpec& network,
                                                     std::uint32_t gpus_per_node,
                                                     std::uint32_t nodes, double bytes);

// All-to-all over `gpus` GPUs on a switched fabric (NVSwitch), every GPU sending to every other
// at once: as long as the busiest port takes to send or receive `busiest_port_bytes`, plus one
// hop's latency. Zero for one GPU.
[[nodiscard]] sim::Tick all_to_all_time(const config::LinkSpec& link, std::uint32_t gpus,
                                        double busiest_port_bytes);

// One GPU sending `bytes` to another (a pipeline stage's activations to the next): the bytes
// at the link's PEER bandwidth plus one hop's latency.
[[nodiscard]] sim::Tick point_to_point_time(const config::LinkSpec& link, double bytes);
// Ring all-gather over `gpus` GPUs of a buffer of `bytes`, each GPU holding 1/n of it: each
// sends and receives (n−1)/n of it in n−1 steps that each pay the hop latency. Zero for one.
[[nodiscard]] sim::Tick ring_all_gather_time(const config::LinkSpec& link, std::uint32_t gpus,
                                             double bytes);

// Bytes each GPU sends in that all-reduce (for link utilisation).
[[nodiscard]] double ring_all_reduce_bytes_per_gpu(std::uint32_t gpus, double bytes);

}  // namespace kvtier::hw
