#pragma once
// What the engine can run on: the host CPU always, NVIDIA GPUs when the CUDA targets were built
// and a driver is present. Used for provenance in measurement files and by `kvtier devices`.

#include <string>
#include <vector>

namespace kvtier::kernels {

struct DeviceInfo {
  std::string kind;  // "cpu" or "cuda"
  int index = 0;
  std::string name;
  double memory_gib = 0.0;
  std::string detail;  // compute capability, driver version, core count
};

// The host CPU (model name and logical cores).
[[nodiscard]] DeviceInfo host_cpu();
// CUDA devices; empty without the CUDA build or without a usable driver. `status` says why.
[[nodiscard]] std::vector<DeviceInfo> cuda_devices(std::string& status);
// Whether this binary was built with the CUDA targets.
[[nodiscard]] bool built_with_cuda();

}  // namespace kvtier::kernels
