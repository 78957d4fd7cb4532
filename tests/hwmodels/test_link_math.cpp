#include <catch2/catch.hpp>

#include "hwmodels/link_math.hpp"

using kvtier::config::LinkSpec;

TEST_CASE("PCIe x16 peaks per direction follow REFERENCE.md §3", "[link_math]") {
  LinkSpec link;
  link.set_kind(kvtier::config::PCIE);
  link.set_lanes(16);
  const std::pair<uint32_t, double> expected[] = {{3, 15.75}, {4, 31.5}, {5, 63.0}, {6, 118.0}};
  for (const auto& [generation, peak] : expected) {
    link.set_pcie_generation(generation);
    CHECK(kvtier::hw::peak_gb_per_s_per_direction(link) == Approx(peak));
  }
  link.set_lanes(8);
  link.set_pcie_generation(5);
  CHECK(kvtier::hw::peak_gb_per_s_per_direction(link) == Approx(31.5));
}

TEST_CASE("per-copy overhead sets the sizes where copies reach 50% and 90% of bandwidth",
          "[link_math]") {
  // REFERENCE.md §3: T = t0 + S/B with t0 ≈ 5 us gives 50% at ~125 KB and 90% at ~1.1 MB
  // for a 25 GB/s link.
  LinkSpec link;
  link.set_kind(kvtier::config::NVLINK_C2C);
  link.set_peak_gb_per_s_per_direction(25);
  link.set_per_copy_overhead_us(5);
  CHECK(kvtier::hw::bytes_for_efficiency(link, kvtier::config::H2D, 0.5) == Approx(125e3));
  CHECK(kvtier::hw::bytes_for_efficiency(link, kvtier::config::H2D, 0.9) == Approx(1.125e6));
}

TEST_CASE("large copies see the largest measured transfer's bandwidth", "[link_math]") {
  LinkSpec link;
  link.set_kind(kvtier::config::PCIE);
  link.set_pcie_generation(4);
  link.set_lanes(16);
  auto* small = link.add_measured();
  small->set_direction(kvtier::config::H2D);
  small->set_transfer_size_bytes(1 << 20);
  small->set_effective_gb_per_s(22.5);
  auto* large = link.add_measured();
  large->set_direction(kvtier::config::H2D);
  large->set_transfer_size_bytes(64 << 20);
  large->set_effective_gb_per_s(23.9);
  CHECK(kvtier::hw::asymptotic_gb_per_s(link, kvtier::config::H2D) == Approx(23.9));
  // No D2H measurement: the theoretical peak stands in.
  CHECK(kvtier::hw::asymptotic_gb_per_s(link, kvtier::config::D2H) == Approx(31.5));
}

TEST_CASE("copies by SM kernels take their own figures where measured, else the copy engines'",
          "[link_math]") {
  LinkSpec link;
  link.set_kind(kvtier::config::PCIE);
  link.set_pcie_generation(5);
  link.set_lanes(16);
  link.set_per_copy_overhead_us(4);
  auto* engines = link.add_measured();
  engines->set_direction(kvtier::config::H2D);
  engines->set_transfer_size_bytes(64 << 20);
  engines->set_effective_gb_per_s(55.2);
  // Nothing measured for SM kernels: the copy engines' figures, the peak where those are none.
  CHECK(kvtier::hw::sm_kernel_gb_per_s(link, kvtier::config::H2D) == Approx(55.2));
  CHECK(kvtier::hw::sm_kernel_gb_per_s(link, kvtier::config::D2H) == Approx(63.0));
  CHECK(kvtier::hw::sm_kernel_overhead_us(link, kvtier::config::H2D) == 4.0);
  CHECK(kvtier::hw::sm_kernel_overhead_us(link, kvtier::config::D2H) == 4.0);

  auto* small = link.add_sm_kernel_measured();
  small->set_direction(kvtier::config::H2D);
  small->set_transfer_size_bytes(1 << 20);
  small->set_effective_gb_per_s(36.0);
  auto* large = link.add_sm_kernel_measured();
  large->set_direction(kvtier::config::H2D);
  large->set_transfer_size_bytes(64 << 20);
  large->set_effective_gb_per_s(51.0);
  link.set_sm_kernel_h2d_overhead_us(8.8);
  CHECK(kvtier::hw::sm_kernel_gb_per_s(link, kvtier::config::H2D) == Approx(51.0));
  CHECK(kvtier::hw::sm_kernel_overhead_us(link, kvtier::config::H2D) == 8.8);
  // The other direction is still the copy engines', and the copy engines keep their figures.
  CHECK(kvtier::hw::sm_kernel_gb_per_s(link, kvtier::config::D2H) == Approx(63.0));
  CHECK(kvtier::hw::sm_kernel_overhead_us(link, kvtier::config::D2H) == 4.0);
  CHECK(kvtier::hw::asymptotic_gb_per_s(link, kvtier::config::H2D) == Approx(55.2));

  // The T2 kernels: the slot kernel's figures until measured, then their own, per direction.
  CHECK(kvtier::hw::sm_kernel_t2_gb_per_s(link, kvtier::config::H2D) == Approx(51.0));
  CHECK(kvtier::hw::sm_kernel_t2_overhead_us(link, kvtier::config::H2D) == 8.8);
  CHECK(kvtier::hw::sm_kernel_t2_gb_per_s(link, kvtier::config::D2H) == Approx(63.0));
  auto* t2 = link.add_sm_kernel_t2_measured();
  t2->set_direction(kvtier::config::H2D);
  t2->set_transfer_size_bytes(32 << 20);
  t2->set_effective_gb_per_s(11.9);
  link.set_sm_kernel_t2_d2h_overhead_us(6.5);
  CHECK(kvtier::hw::sm_kernel_t2_gb_per_s(link, kvtier::config::H2D) == Approx(11.9));
  CHECK(kvtier::hw::sm_kernel_t2_overhead_us(link, kvtier::config::H2D) == 8.8);
  CHECK(kvtier::hw::sm_kernel_t2_gb_per_s(link, kvtier::config::D2H) == Approx(63.0));
  CHECK(kvtier::hw::sm_kernel_t2_overhead_us(link, kvtier::config::D2H) == 6.5);
  CHECK(kvtier::hw::sm_kernel_gb_per_s(link, kvtier::config::H2D) == Approx(51.0));
}
