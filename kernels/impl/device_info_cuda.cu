#include <cuda_runtime.h>

#include <string>

#include "kernels/device_info.hpp"

namespace kvtier::kernels {

std::vector<DeviceInfo> cuda_devices(std::string& status) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    status = std::string("no usable CUDA device: ") + cudaGetErrorString(error);
    return devices;
  }
  int driver = 0;
  cudaDriverGetVersion(&driver);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, i) != cudaSuccess) {
      continue;
    }
    DeviceInfo info;
    info.kind = "cuda";
    info.index = i;
    info.name = properties.name;
    info.memory_gib = static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    info.detail = "sm_" + std::to_string(properties.major) + std::to_string(properties.minor) +
                  ", " + std::to_string(properties.multiProcessorCount) + " SMs, driver " +
                  std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10);
    devices.push_back(info);
  }
  status = std::to_string(devices.size()) + " CUDA device(s)";
  return devices;
}

bool built_with_cuda() {
  return true;
}

}  // namespace kvtier::kernels
