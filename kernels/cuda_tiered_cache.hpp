#pragma once
// The live tiered KV cache's CUDA backend (docs/LIVE.md, "The CUDA backend"): the CUDA engine's
// DeviceKeyValueStore, with the bookkeeping of kernels/tier_book.hpp shared with the CPU backend.
//
//   T0:      a device arena of the budget (cudaMalloc; no more than the run's whole cache),
//            slots in the engine's compute dtype;
//   T1:      pinned, mapped host memory at the compute dtype;
//   T2:      pinned, mapped host memory in the T2 format (kernels/impl/kv_quantise.hpp);
//   staging: device memory — the persistent staged copies of differential prefetch, and
//            staging_lookahead + 1 transient regions (full prefetch's T1 copies, dequantised
//            T2).
//
// Every copy runs on a copy stream of the cache's own, as a kernel that moves a batch of
// scattered slots over the bus (it reads or writes the mapped host memory in place), timed with
// CUDA events: staging of layer l + lookahead + 1 starts once layer l's attention has read its
// region, so it overlaps the rest of layer l and the layers up to it (lookahead 0: the next
// layer's staging overlaps only the rest of this one); the engine's stream waits for a layer's
// staging only before that layer's first kernel, and the moves after a step overlap the host's
// work until the next forward call. Recodes between T1 and T2 run on the host, as in the CPU
// backend. Attention reads T0 and staging through a page
// table per layer (kernels/engine.hpp DeviceLayerSlots) and skips evicted positions.
//
// Declared in every build; without the CUDA targets make_cuda_tiered_cache throws ConfigError.

#include <memory>

#include "kernels/engine.hpp"
#include "kernels/tiered_cache.hpp"

namespace kvtier::kernels {

// `engine` must be a CUDA engine (ConfigError otherwise), options.max_positions set (the host
// tiers, page tables and plans are sized for it up front) and options.staging_lookahead within
// 0 .. kMostStagingLookahead (ConfigError, check_staging_lookahead). kvtier::Error (exit 1) naming
// the CUDA call that failed, e.g. cudaMalloc when the T0 budget does not fit on the device.
[[nodiscard]] std::unique_ptr<LiveKvCache> make_cuda_tiered_cache(
    Engine& engine, const TieredCacheOptions& options);

}  // namespace kvtier::kernels
