#pragma once
// Link figures that follow from a LinkSpec: PCIe peak from generation and lanes, and the
// transfer sizes at which the per-copy overhead stops dominating.

#include "configs/schema/hardware.pb.h"

namespace kvtier::hw {

// Usable bandwidth of one PCIe lane in one direction, after line encoding (REFERENCE.md §3:
// x16 per direction Gen3 15.75, Gen4 31.5, Gen5 63.0, Gen6 ~118 GB/s).
[[nodiscard]] double pcie_lane_gb_per_s(uint32_t generation);

// Peak per direction: derived for PCIe, declared for other links.
[[nodiscard]] double peak_gb_per_s_per_direction(const config::LinkSpec& link);

// Bandwidth a large pinned copy sees in `direction`: the largest measured transfer's
// bandwidth when there is one, else the peak.
[[nodiscard]] double asymptotic_gb_per_s(const config::LinkSpec& link, config::Direction direction);

// The same for copies by SM kernels over mapped host memory (LinkSpec::sm_kernel_measured),
// the copy engines' figure where the link has none for `direction`.
[[nodiscard]] double sm_kernel_gb_per_s(const config::LinkSpec& link, config::Direction direction);

// The fixed cost of one copy by SM kernels in `direction` (H2D or D2H), in microseconds:
// LinkSpec::sm_kernel_h2d/d2h_overhead_us, else per_copy_overhead_us.
[[nodiscard]] double sm_kernel_overhead_us(const config::LinkSpec& link,
                                           config::Direction direction);

// The same for the T2 kernels among copies by SM kernels, in compressed bytes over the link
// (LinkSpec::sm_kernel_t2_measured and sm_kernel_t2_h2d/d2h_overhead_us), the slot kernel's
// figures above where the link has none for `direction`.
[[nodiscard]] double sm_kernel_t2_gb_per_s(const config::LinkSpec& link,
                                           config::Direction direction);
[[nodiscard]] double sm_kernel_t2_overhead_us(const config::LinkSpec& link,
                                              config::Direction direction);

// Size at which a copy reaches `fraction` of the asymptotic bandwidth under the model
// T = t0 + S / B: S = t0 · B · f / (1 − f).
[[nodiscard]] double bytes_for_efficiency(const config::LinkSpec& link, config::Direction direction,
                                          double fraction);

}  // namespace kvtier::hw
