#include "kernels/device_info.hpp"

namespace kvtier::kernels {

std::vector<DeviceInfo> cuda_devices(std::string& status) {
  status = "this kvtier was built without CUDA";
  return {};
}

bool built_with_cuda() {
  return false;
}

}  // namespace kvtier::kernels
