// The compute load of bench/cuda_copy.cpp (cuda_copy_load.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "bench/cuda_copy_load.cuh"

namespace kvtier::bench {
namespace {

__global__ void __launch_bounds__(kLoadThreads)
    load_kernel(const uint4* __restrict__ data, std::size_t words, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned folded = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    const uint4 word = data[i];
    folded ^= word.x ^ word.y ^ word.z ^ word.w;
  }
  if (folded != 0) {
    sink[blockIdx.x] = folded;
  }
}

__device__ __forceinline__ unsigned long long global_timer() {
  unsigned long long now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void spin_kernel(unsigned long long nanoseconds) {
  const unsigned long long start = global_timer();
  while (global_timer() - start < nanoseconds) {
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t launch_spin(unsigned long long nanoseconds, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t load_blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, load_kernel, kLoadThreads, 0);
}

cudaError_t launch_load(int blocks, const void* data, std::size_t words, unsigned* sink,
                        cudaStream_t stream) {
  load_kernel<<<blocks, kLoadThreads, 0, stream>>>(static_cast<const uint4*>(data), words, sink);
  return cudaGetLastError();
}

}  // namespace kvtier::bench
