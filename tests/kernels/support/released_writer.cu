#include "tests/kernels/support/released_writer.hpp"

#include "kernels/impl/cuda_launch.cuh"

namespace kvtier::kernels::testing {
namespace {

__global__ void released_copy_kernel(const unsigned char* from, unsigned char* to,
                                     std::size_t bytes, long long delay_ns) {
  cuda::release_next_kernel();
  // %globaltimer counts nanoseconds, at any clock rate.
  unsigned long long start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned long long now = start;
  while (now - start < static_cast<unsigned long long>(delay_ns)) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    to[i] = from[i];
  }
}

}  // namespace

cudaError_t launch_released_copy(const void* from, void* to, std::size_t bytes, int delay_us,
                                 cudaStream_t stream) {
  // Few blocks, all resident at once, so that every one of them releases before any waits long,
  // and the kernel behind them has room on the SMs beside them.
  constexpr unsigned kBlocks = 32;
  constexpr unsigned kThreads = 256;
  released_copy_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const unsigned char*>(from),
                                                         static_cast<unsigned char*>(to), bytes,
                                                         static_cast<long long>(delay_us) * 1000);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::testing
