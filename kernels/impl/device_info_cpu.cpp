#include <fstream>
#include <string>
#include <thread>

#include "kernels/device_info.hpp"

namespace kvtier::kernels {

DeviceInfo host_cpu() {
  DeviceInfo info{"cpu", 0, "unknown CPU", 0.0, ""};
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) {
        info.name = line.substr(colon + 2);
      }
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0.0;
  if (meminfo >> key >> kib && key == "MemTotal:") {
    info.memory_gib = kib / (1024.0 * 1024.0);
  }
  info.detail = std::to_string(std::thread::hardware_concurrency()) + " logical cores";
  return info;
}

}  // namespace kvtier::kernels
