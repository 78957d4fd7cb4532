#pragma once
// A writer kernel for the early-launch tests (label gpu): it lets the stream's next kernel start
// at once (griddepcontrol.launch_dependents, kernels/impl/cuda_launch.cuh), then waits about
// `delay_us` microseconds before it writes. A kernel launched early behind it that read its
// input before griddepcontrol.wait would read the bytes from before the writer; a kernel that
// waits reads the written ones. (A writer that releases nothing, as the engine's conversion
// kernel, lets its dependents start only once it has finished, and so cannot tell them apart.)

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kvtier::kernels::testing {

// Copies `bytes` bytes from `from` to `to` on `stream`, releasing its dependents first.
cudaError_t launch_released_copy(const void* from, void* to, std::size_t bytes, int delay_us,
                                 cudaStream_t stream);

}  // namespace kvtier::kernels::testing
