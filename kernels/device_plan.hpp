#pragma once
// A layer's staging plan as the live cache's CUDA backend hands it to the device
// (kernels/cuda_tiered_cache.hpp): plain C++, so the encoding is tested without a GPU.
//
//   words[0 .. positions)   the page table: one int32 per position (kernels/engine.hpp
//                           DeviceLayerSlots): a T0 slot, staging_entry(s) for staging slot s,
//                           or -1 for a position attention skips;
//   then (from, to) pairs   one per T1 copy (T1 slot -> staging slot), then one per T2 read
//                           (T2 slot -> staging slot, dequantised on the way).
//
// Staging slots are absolute: differential prefetch's kept copies are slots 0 .. the persistent
// count, and a layer's transient entries (full prefetch's T1 copies, dequantised T2) are slots
// from `region_base` on.

#include <cstdint>

#include "kernels/tier_book.hpp"

namespace kvtier::kernels {

// The page-table entry of staging slot `slot`: -(slot + 2).
[[nodiscard]] std::int32_t staging_entry(std::uint64_t slot);
// The staging slot of an entry staging_entry() made (entry <= -2).
[[nodiscard]] std::uint64_t staging_slot(std::int32_t entry);

struct DevicePlanSize {
  std::uint64_t positions = 0;
  std::uint64_t t1_copies = 0;
  std::uint64_t t2_reads = 0;
  [[nodiscard]] std::uint64_t words() const { return positions + 2 * (t1_copies + t2_reads); }
};

// Writes `plan` into `words` (room for its words()); the pairs of T1 copies follow the page
// table, those of T2 reads follow them.
DevicePlanSize write_device_plan(const StagePlan& plan, std::uint64_t region_base,
                                 PrefetchMode prefetch, std::uint32_t* words);

}  // namespace kvtier::kernels
