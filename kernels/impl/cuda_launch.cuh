#pragma once
// Programmatic dependent launches (cuda_kernels.cuh, Launch): the device side every kernel of a
// decode step runs, and the host side that launches it. Device code: included by .cu files only.
//
// A kernel launched early may be running before the previous kernel of its stream has finished.
// So every such kernel calls await_previous_kernel() before its first read or write of anything
// but the weights, on every path (an early return included): a later kernel may read what the
// kernel before this one wrote, safe only because no block of this one ends before that kernel
// has. It then calls release_next_kernel(), which lets the stream's next kernel be
// scheduled once every block of this one has called it (it waits in turn). Kernels launched
// plainly run the same code: the wait returns at once and the release does nothing.
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/impl/cuda_kernels.cuh"

namespace kvtier::kernels::cuda {

__device__ __forceinline__ void await_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void release_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for `bytes` (a multiple of 16) from 16-byte aligned `address` without waiting for them:
// what a kernel launched early reads first, fetched while the previous kernel finishes.
__device__ __forceinline__ void prefetch_to_l2(const void* address, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address), "r"(bytes) : "memory");
#endif
}

// Launches kernel<<<grid, block, shared>>>(args...) as `launch` says; the launch's status, or
// else cudaGetLastError()'s, as a launch with <<<>>> followed by it (which it also clears).
template <typename... Parameters, typename... Arguments>
cudaError_t start_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block,
                         std::size_t shared_bytes, const Launch& launch, Arguments&&... arguments) {
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = launch.stream;
  config.attrs = launch.early ? &early : nullptr;
  config.numAttrs = launch.early ? 1U : 0U;
  const cudaError_t status =
      cudaLaunchKernelEx(&config, kernel, static_cast<Arguments&&>(arguments)...);
  const cudaError_t last = cudaGetLastError();
  return status != cudaSuccess ? status : last;
}

}  // namespace kvtier::kernels::cuda
