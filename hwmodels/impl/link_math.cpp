#include "hwmodels/link_math.hpp"

#include <stdexcept>
#include <string>

namespace kvtier::hw {

double pcie_lane_gb_per_s(uint32_t generation) {
  switch (generation) {
    case 3: return 15.75 / 16.0;  // 8 GT/s, 128b/130b
    case 4: return 31.5 / 16.0;   // 16 GT/s, 128b/130b
    case 5: return 63.0 / 16.0;   // 32 GT/s, 128b/130b
    case 6: return 118.0 / 16.0;  // 64 GT/s PAM4, FLIT mode; REFERENCE.md §3 "~118 usable" [U]
    default: throw std::invalid_argument("no PCIe generation " + std::to_string(generation));
  }
}

double peak_gb_per_s_per_direction(const config::LinkSpec& link) {
  if (link.kind() == config::PCIE) {
    return pcie_lane_gb_per_s(link.pcie_generation()) * link.lanes();
  }
  return link.peak_gb_per_s_per_direction();
}

namespace {

// The bandwidth of the largest of `points` in `direction`; 0 when none is in it.
double largest_point_gb_per_s(
    const google::protobuf::RepeatedPtrField<config::BandwidthPoint>& points,
    config::Direction direction) {
  uint64_t largest = 0;
  double bandwidth = 0.0;
  for (const auto& point : points) {
    if (point.direction() == direction && point.transfer_size_bytes() >= largest) {
      largest = point.transfer_size_bytes();
      bandwidth = point.effective_gb_per_s();
    }
  }
  return largest > 0 ? bandwidth : 0.0;
}

// A figure a link may give per direction: `h2d` or `d2h` where given for `direction`, else
// `otherwise`.
double directed_or(config::Direction direction, bool has_h2d, double h2d, bool has_d2h, double d2h,
                   double otherwise) {
  if (direction == config::H2D && has_h2d) {
    return h2d;
  }
  if (direction == config::D2H && has_d2h) {
    return d2h;
  }
  return otherwise;
}

}  // namespace

double asymptotic_gb_per_s(const config::LinkSpec& link, config::Direction direction) {
  const double measured = largest_point_gb_per_s(link.measured(), direction);
  return measured > 0.0 ? measured : peak_gb_per_s_per_direction(link);
}

double sm_kernel_gb_per_s(const config::LinkSpec& link, config::Direction direction) {
  const double measured = largest_point_gb_per_s(link.sm_kernel_measured(), direction);
  return measured > 0.0 ? measured : asymptotic_gb_per_s(link, direction);
}

double sm_kernel_overhead_us(const config::LinkSpec& link, config::Direction direction) {
  return directed_or(direction, link.has_sm_kernel_h2d_overhead_us(),
                     link.sm_kernel_h2d_overhead_us(), link.has_sm_kernel_d2h_overhead_us(),
                     link.sm_kernel_d2h_overhead_us(), link.per_copy_overhead_us());
}

double sm_kernel_t2_gb_per_s(const config::LinkSpec& link, config::Direction direction) {
  const double measured = largest_point_gb_per_s(link.sm_kernel_t2_measured(), direction);
  return measured > 0.0 ? measured : sm_kernel_gb_per_s(link, direction);
}

double sm_kernel_t2_overhead_us(const config::LinkSpec& link, config::Direction direction) {
  return directed_or(direction, link.has_sm_kernel_t2_h2d_overhead_us(),
                     link.sm_kernel_t2_h2d_overhead_us(), link.has_sm_kernel_t2_d2h_overhead_us(),
                     link.sm_kernel_t2_d2h_overhead_us(), sm_kernel_overhead_us(link, direction));
}

double bytes_for_efficiency(const config::LinkSpec& link, config::Direction direction,
                            double fraction) {
  const double overhead_s = link.per_copy_overhead_us() * 1e-6;
  const double bytes_per_s = asymptotic_gb_per_s(link, direction) * 1e9;
  return overhead_s * bytes_per_s * fraction / (1.0 - fraction);
}

}  // namespace kvtier::hw
