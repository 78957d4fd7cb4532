#pragma once
// The compute load of bench/cuda_copy.cpp: a memory-bound kernel that occupies every SM, so that
// copies issued while it runs show whether they need the SMs (kernels over mapped host memory)
// or not (the copy engines). Plain C++ declarations: the benchmark is host code.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kvtier::bench {

// Threads of the load kernel's blocks.
inline constexpr int kLoadThreads = 256;

// How many of its blocks fit on one SM at once.
cudaError_t load_blocks_per_sm(int* blocks);

// One pass: every thread XORs the 16-byte words i, i + stride, ... of `data` (`words` of them;
// stride: the grid's threads) and stores the result to sink[block] only when it is not zero, so
// over a zeroed buffer nothing is stored but no load can be dropped.
cudaError_t launch_load(int blocks, const void* data, std::size_t words, unsigned* sink,
                        cudaStream_t stream);

// One thread that waits `nanoseconds` of the GPU's global timer: a gate the copies of a timed
// run are queued behind, as the live cache queues its copies behind events.
cudaError_t launch_spin(unsigned long long nanoseconds, cudaStream_t stream);

}  // namespace kvtier::bench
