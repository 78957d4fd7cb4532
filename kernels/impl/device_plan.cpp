// A layer's staging plan as the CUDA backend's kernels read it (kernels/device_plan.hpp).
#include "kernels/device_plan.hpp"

#include <cstring>

namespace kvtier::kernels {

std::int32_t staging_entry(std::uint64_t slot) {
  return -static_cast<std::int32_t>(slot) - 2;
}

std::uint64_t staging_slot(std::int32_t entry) {
  return static_cast<std::uint64_t>(-(static_cast<std::int64_t>(entry) + 2));
}

DevicePlanSize write_device_plan(const StagePlan& plan, std::uint64_t region_base,
                                 PrefetchMode prefetch, std::uint32_t* words) {
  for (std::size_t p = 0; p < plan.reads.size(); ++p) {
    const ReadSlot read = plan.reads[p];
    std::int32_t entry = -1;
    switch (read.kind) {
      case ReadSlot::Kind::kT0: entry = static_cast<std::int32_t>(read.index); break;
      case ReadSlot::Kind::kStaged: entry = staging_entry(read.index); break;
      case ReadSlot::Kind::kTransient: entry = staging_entry(region_base + read.index); break;
      case ReadSlot::Kind::kNone: break;
    }
    // The device reads the word as int32: the bits are copied, not converted.
    std::memcpy(&words[p], &entry, sizeof(entry));
  }
  std::uint32_t* pairs = words + plan.reads.size();
  const bool full = prefetch == PrefetchMode::kFull;
  for (const SlotCopy& copy : plan.t1_copies) {
    *pairs++ = copy.from_slot;
    *pairs++ = static_cast<std::uint32_t>(full ? region_base + copy.to : copy.to);
  }
  for (const SlotCopy& read : plan.t2_reads) {
    *pairs++ = read.from_slot;
    *pairs++ = static_cast<std::uint32_t>(region_base + read.to);
  }
  return {plan.reads.size(), plan.t1_copies.size(), plan.t2_reads.size()};
}

}  // namespace kvtier::kernels
