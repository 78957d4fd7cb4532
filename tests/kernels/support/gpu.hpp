#pragma once
// Whether a gpu-labelled test can run: with no CUDA device it warns and the test returns at once,
// unless KVTIER_REQUIRE_GPU is set (scripts/gpu-validate.sh sets it), when it fails — so that a
// GPU run cannot pass without checking anything.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "kernels/device_info.hpp"

namespace kvtier::kernels::testing {

inline bool gpu_present() {
  std::string status;
  if (cuda_devices(status).empty()) {
    if (std::getenv("KVTIER_REQUIRE_GPU") != nullptr) {
      FAIL("no CUDA device (" << status << ") and KVTIER_REQUIRE_GPU is set");
    }
    WARN("no CUDA device (" << status << "): test skipped");
    return false;
  }
  return true;
}

}  // namespace kvtier::kernels::testing
