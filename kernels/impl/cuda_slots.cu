// The live tiered cache's copies (cuda_kernels.cuh, "The live tiered cache's copies"): slot
// batches copied, quantised into T2 or dequantised out of it by kernels that read and write
// device or mapped host memory, and the host's own conversions for recodes in host memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/impl/cuda_elementwise.cuh"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/cuda_reduce.cuh"
#include "kernels/impl/kv_quantise.hpp"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kBlock = 256;

// One block per slot of a batch: a full-precision slot copied in 16-byte words when its size
// allows, as the link moves it. Source and target are different tiers (never aliased), and each
// thread issues all its loads before any store, so a block waits about one round trip over the
// link for its slot rather than one per word (a 16 KiB slot is 4 words per thread).
template <typename Word>
__global__ void copy_slots_kernel(const Word* __restrict__ source, Word* __restrict__ target,
                                  const std::uint32_t* __restrict__ pairs, std::int64_t words) {
  constexpr int kInFlight = 8;
  const std::int64_t from = pairs[2 * blockIdx.x];
  const std::int64_t to = pairs[2 * blockIdx.x + 1];
  const Word* __restrict__ in = source + from * words;
  Word* __restrict__ out = target + to * words;
  const std::int64_t stride = blockDim.x;
  for (std::int64_t base = threadIdx.x; base < words; base += kInFlight * stride) {
    Word held[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (base + k * stride < words) {
        held[k] = in[base + k * stride];
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (base + k * stride < words) {
        out[base + k * stride] = held[k];
      }
    }
  }
}

// One warp per (slot, group of head_dim values): the T2 format of kv_quantise.hpp. The codes are
// usually in mapped host memory: they cross the bus four to a lane (a warp's request is 128
// contiguous bytes rather than 32) when head_dim is a multiple of 4, which also makes every
// group's codes 4-byte aligned (a slot is 2 * kv_heads * (head_dim + 4) bytes).
template <typename T>
__global__ void quantise_slots_kernel(SlotBatch b) {
  const int groups = 2 * b.kv_heads;
  const int group = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x);
  const std::int64_t elements = static_cast<std::int64_t>(groups) * b.head_dim;
  const std::int64_t compressed = quantise::compressed_bytes(b.kv_heads, b.head_dim);
  const T* in = static_cast<const T*>(b.source) + b.pairs[2 * blockIdx.x] * elements +
                static_cast<std::int64_t>(group) * b.head_dim;
  auto* slot = static_cast<std::int8_t*>(b.target) + b.pairs[2 * blockIdx.x + 1] * compressed;
  float absmax = 0.0F;
  for (int i = lane; i < b.head_dim; i += 32) {
    absmax = fmaxf(absmax, fabsf(to_float(in[i])));
  }
  absmax = warp_max(absmax);
  const float scale = quantise::scale_of(absmax);
  std::int8_t* codes = slot + static_cast<std::int64_t>(group) * b.head_dim;
  if (b.head_dim % 4 == 0) {
    auto* quads = reinterpret_cast<char4*>(codes);
    for (int i = lane; i < b.head_dim / 4; i += 32) {
      const T* x = in + 4 * i;
      quads[i] = make_char4(
          quantise::code_of(to_float(x[0]), scale), quantise::code_of(to_float(x[1]), scale),
          quantise::code_of(to_float(x[2]), scale), quantise::code_of(to_float(x[3]), scale));
    }
  } else {
    for (int i = lane; i < b.head_dim; i += 32) {
      codes[i] = quantise::code_of(to_float(in[i]), scale);
    }
  }
  if (lane == 0) {
    reinterpret_cast<float*>(slot + elements)[group] = scale;
  }
}

template <typename T>
__global__ void dequantise_slots_kernel(SlotBatch b) {
  const int groups = 2 * b.kv_heads;
  const int group = static_cast<int>(blockIdx.y);
  const std::int64_t elements = static_cast<std::int64_t>(groups) * b.head_dim;
  const std::int64_t compressed = quantise::compressed_bytes(b.kv_heads, b.head_dim);
  const auto* slot =
      static_cast<const std::int8_t*>(b.source) + b.pairs[2 * blockIdx.x] * compressed;
  T* out = static_cast<T*>(b.target) + b.pairs[2 * blockIdx.x + 1] * elements +
           static_cast<std::int64_t>(group) * b.head_dim;
  const float scale = reinterpret_cast<const float*>(slot + elements)[group];
  const std::int8_t* codes = slot + static_cast<std::int64_t>(group) * b.head_dim;
  const int lane = static_cast<int>(threadIdx.x);
  if (b.head_dim % 4 == 0) {  // four codes a lane, as in quantise_slots_kernel
    const auto* quads = reinterpret_cast<const char4*>(codes);
    for (int i = lane; i < b.head_dim / 4; i += 32) {
      const char4 quad = quads[i];
      T* x = out + 4 * i;
      x[0] = from_float<T>(quantise::value_of(quad.x, scale));
      x[1] = from_float<T>(quantise::value_of(quad.y, scale));
      x[2] = from_float<T>(quantise::value_of(quad.z, scale));
      x[3] = from_float<T>(quantise::value_of(quad.w, scale));
    }
  } else {
    for (int i = lane; i < b.head_dim; i += 32) {
      out[i] = from_float<T>(quantise::value_of(codes[i], scale));
    }
  }
}

}  // namespace

cudaError_t launch_copy_slots(const SlotBatch& batch, cudaStream_t stream) {
  if (batch.count == 0) {
    return cudaSuccess;
  }
  const std::int64_t bytes = 2 * static_cast<std::int64_t>(batch.kv_heads) * batch.head_dim *
                             (batch.dtype == Dtype::kF32 ? 4 : 2);
  const auto aligned = [&](std::int64_t word) {
    return bytes % word == 0 && reinterpret_cast<std::uintptr_t>(batch.source) % word == 0 &&
           reinterpret_cast<std::uintptr_t>(batch.target) % word == 0;
  };
  const auto blocks = static_cast<unsigned>(batch.count);
  if (aligned(16)) {
    copy_slots_kernel<<<blocks, kBlock, 0, stream>>>(static_cast<const uint4*>(batch.source),
                                                     static_cast<uint4*>(batch.target), batch.pairs,
                                                     bytes / 16);
  } else {
    copy_slots_kernel<<<blocks, kBlock, 0, stream>>>(
        static_cast<const std::uint16_t*>(batch.source), static_cast<std::uint16_t*>(batch.target),
        batch.pairs, bytes / 2);
  }
  return cudaGetLastError();
}

namespace {

// The T2 kernels' launch: one warp per (slot, group of head_dim values), for the batch's dtype;
// launch(T{}, grid) launches the kernel of T.
template <typename Launcher>
cudaError_t per_slot_group(const SlotBatch& batch, Launcher&& launch) {
  if (batch.count == 0) {
    return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(batch.count), static_cast<unsigned>(2 * batch.kv_heads));
  return dispatch(batch.dtype, [&](auto tag) { launch(tag, grid); });
}

}  // namespace

cudaError_t launch_quantise_slots(const SlotBatch& batch, cudaStream_t stream) {
  return per_slot_group(batch, [&](auto tag, dim3 grid) {
    quantise_slots_kernel<decltype(tag)><<<grid, 32, 0, stream>>>(batch);
  });
}

cudaError_t launch_dequantise_slots(const SlotBatch& batch, cudaStream_t stream) {
  return per_slot_group(batch, [&](auto tag, dim3 grid) {
    dequantise_slots_kernel<decltype(tag)><<<grid, 32, 0, stream>>>(batch);
  });
}

// The dtype chosen once, outside the loop, so that the compiler vectorises it (host recodes
// convert every value of every token-layer they move).
void host_to_float(Dtype dtype, const void* in, float* out, std::int64_t count) {
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* values = static_cast<const T*>(in);
    for (std::int64_t i = 0; i < count; ++i) {
      out[i] = to_float(values[i]);
    }
  });
}

std::uint16_t host_bfloat16_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t rounded = (bits + 0x7fffU + ((bits >> 16U) & 1U)) >> 16U;
  return static_cast<std::uint16_t>((bits & 0x7fffffffU) > 0x7f800000U ? 0x7fffU : rounded);
}

void host_from_float(Dtype dtype, const float* in, void* out, std::int64_t count) {
  if (dtype == Dtype::kBF16) {
    auto* values = static_cast<std::uint16_t*>(out);
    for (std::int64_t i = 0; i < count; ++i) {
      values[i] = host_bfloat16_bits(in[i]);
    }
    return;
  }
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* values = static_cast<T*>(out);
    for (std::int64_t i = 0; i < count; ++i) {
      values[i] = from_float<T>(in[i]);
    }
  });
}

}  // namespace kvtier::kernels::cuda
