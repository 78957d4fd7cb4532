// Device kernels of the CUDA engine (see cuda_kernels.cuh). They follow the CPU engine's
// arithmetic step by step (float32 accumulation, the same order of scaling and gain, expf and
// sincosf rather than their fast approximations), so that in float32 the two engines differ by
// rounding only; GEMMs are cuBLAS, in the engine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/kv_quantise.hpp"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr unsigned kFullMask = 0xFFFFFFFFU;
// Grid-stride kernels launch at most this many blocks.
constexpr std::int64_t kMaxBlocks = 8192;

__device__ __forceinline__ float to_float(float value) {
  return value;
}
__device__ __forceinline__ float to_float(__half value) {
  return __half2float(value);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

// Sum (or maximum) over the block; every thread gets the result. `scratch` holds 32 floats.
// blockDim.x must be a multiple of 32.
template <bool kMax>
__device__ float block_reduce(float value, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  value = kMax ? warp_max(value) : warp_sum(value);
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) {
    scratch[warp] = value;
  }
  __syncthreads();
  if (warp == 0) {
    const float identity = kMax ? -INFINITY : 0.0F;
    value = lane < warps ? scratch[lane] : identity;
    value = kMax ? warp_max(value) : warp_sum(value);
    if (lane == 0) {
      scratch[0] = value;
    }
  }
  __syncthreads();
  return scratch[0];
}

int grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// Runs launch(T{}) for the C++ type of `dtype`, then returns cudaGetLastError().
template <typename Launch>
cudaError_t dispatch(Dtype dtype, Launch&& launch) {
  switch (dtype) {
    case Dtype::kF32: launch(float{}); break;
    case Dtype::kF16: launch(__half{}); break;
    case Dtype::kBF16: launch(__nv_bfloat16{}); break;
  }
  return cudaGetLastError();
}

template <typename T>
__global__ void convert_kernel(const float* in, T* out, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = from_float<T>(in[i]);
  }
}

template <typename T>
__global__ void embedding_kernel(const T* table, const std::int32_t* tokens, int rows, int hidden,
                                 float* x) {
  const std::int64_t count = static_cast<std::int64_t>(rows) * hidden;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const std::int64_t row = i / hidden;
    const std::int64_t column = i % hidden;
    x[i] = to_float(table[static_cast<std::int64_t>(tokens[row]) * hidden + column]);
  }
}

// One block per row.
template <typename T>
__global__ void rms_norm_kernel(const float* x, const float* gain, int cols, float eps, T* out) {
  __shared__ float scratch[32];
  const float* row = x + static_cast<std::int64_t>(blockIdx.x) * cols;
  T* out_row = out + static_cast<std::int64_t>(blockIdx.x) * cols;
  float squares = 0.0F;
  for (int i = static_cast<int>(threadIdx.x); i < cols; i += static_cast<int>(blockDim.x)) {
    squares += row[i] * row[i];
  }
  squares = block_reduce<false>(squares, scratch);
  const float inverse_rms = 1.0F / sqrtf(squares / static_cast<float>(cols) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < cols; i += static_cast<int>(blockDim.x)) {
    out_row[i] = from_float<T>((row[i] * inverse_rms) * gain[i]);
  }
}

// One block per (row, head slot); slots are the query heads, then the KV heads' keys, then their
// values, which is also their order inside a row of qkv. Rows are the grid's x dimension, which
// has no 65,535 limit.
template <typename T>
__global__ void qkv_epilogue_kernel(QkvEpilogue a) {
  extern __shared__ float shared[];
  float* vector = shared;                // head_dim
  float* scratch = shared + a.head_dim;  // 32
  const int row = static_cast<int>(blockIdx.x);
  const int slot = static_cast<int>(blockIdx.y);
  const int position = a.first_position + row;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const bool is_query = slot < a.heads;
  const bool is_key = !is_query && slot < a.heads + a.kv_heads;
  const bool is_value = !is_query && !is_key;
  const std::int64_t offset = static_cast<std::int64_t>(slot) * a.head_dim;
  float* data = a.qkv + static_cast<std::int64_t>(row) * a.row_stride + offset;

  for (int d = tid; d < a.head_dim; d += threads) {
    vector[d] = a.bias != nullptr ? data[d] + a.bias[offset + d] : data[d];
  }
  __syncthreads();
  if (!is_value && a.q_gain != nullptr) {
    float squares = 0.0F;
    for (int d = tid; d < a.head_dim; d += threads) {
      squares += vector[d] * vector[d];
    }
    squares = block_reduce<false>(squares, scratch);
    const float inverse_rms = 1.0F / sqrtf(squares / static_cast<float>(a.head_dim) + a.eps);
    const float* gain = is_query ? a.q_gain : a.k_gain;
    for (int d = tid; d < a.head_dim; d += threads) {
      vector[d] = (vector[d] * inverse_rms) * gain[d];
    }
    __syncthreads();
  }
  if (!is_value) {
    const int pairs = a.head_dim / 2;
    for (int pair = tid; pair < pairs; pair += threads) {
      // Interleaved: (2i, 2i+1). Half-split: (i, i + head_dim/2).
      const int first = a.interleaved_pairs ? 2 * pair : pair;
      const int second = a.interleaved_pairs ? 2 * pair + 1 : pair + pairs;
      const float angle = static_cast<float>(position) * a.inverse_frequency[pair];
      float sine = 0.0F;
      float cosine = 0.0F;
      sincosf(angle, &sine, &cosine);
      const float x0 = vector[first];
      const float x1 = vector[second];
      vector[first] = x0 * cosine - x1 * sine;
      vector[second] = x0 * sine + x1 * cosine;
    }
    __syncthreads();
  }
  if (is_query) {
    for (int d = tid; d < a.head_dim; d += threads) {
      data[d] = vector[d];
    }
    return;
  }
  const int kv_head = is_key ? slot - a.heads : slot - a.heads - a.kv_heads;
  const std::int64_t kv_width = static_cast<std::int64_t>(a.kv_heads) * a.head_dim;
  const std::int64_t head_offset = static_cast<std::int64_t>(kv_head) * a.head_dim;
  T* cache = a.page_table != nullptr
                 ? static_cast<T*>(a.slots) +
                       static_cast<std::int64_t>(a.page_table[position]) * 2 * kv_width +
                       (is_key ? 0 : kv_width) + head_offset
                 : static_cast<T*>(is_key ? a.cache_keys : a.cache_values) + position * kv_width +
                       head_offset;
  for (int d = tid; d < a.head_dim; d += threads) {
    const T stored = from_float<T>(vector[d]);
    cache[d] = stored;
    data[d] = to_float(stored);  // what the cache holds, for the observer
  }
}

// Row `offset` (elements) inside the slot a page-table entry names; nullptr for -1 (evicted).
template <typename T>
__device__ __forceinline__ const T* paged_row(const AttentionArgs& a, int position,
                                              std::int64_t kv_width, std::int64_t offset) {
  const std::int64_t entry = a.page_table[position];
  if (entry == -1) {
    return nullptr;
  }
  const T* slot = entry >= 0
                      ? static_cast<const T*>(a.t0_slots) + entry * 2 * kv_width
                      : static_cast<const T*>(a.staging_slots) + (-(entry + 2)) * 2 * kv_width;
  return slot + offset;
}

// One block per (row, query head): scores into the row's probabilities, softmax in place, then
// the weighted sum of the values.
template <typename T>
__global__ void attention_kernel(AttentionArgs a) {
  extern __shared__ float shared[];
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  float* query = shared;                // head_dim
  float* partial = query + a.head_dim;  // max(threads, head_dim)
  float* scratch = partial + (threads > a.head_dim ? threads : a.head_dim);  // 32

  const int row = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int position = a.first_position + row;
  const int first = first_key(position, a.window);
  const int keys = position - first + 1;
  const int kv_head = head / (a.heads / a.kv_heads);
  const std::int64_t kv_width = static_cast<std::int64_t>(a.kv_heads) * a.head_dim;
  const std::int64_t head_offset = static_cast<std::int64_t>(kv_head) * a.head_dim;
  const bool paged = a.page_table != nullptr;
  const T* cached_keys =
      paged ? nullptr : static_cast<const T*>(a.cache_keys) + first * kv_width + head_offset;
  const T* cached_values =
      paged ? nullptr : static_cast<const T*>(a.cache_values) + first * kv_width + head_offset;
  float* p = a.probabilities +
             static_cast<std::int64_t>(a.heads) * keys_before_row(row, a.first_position, a.window) +
             static_cast<std::int64_t>(head) * keys;

  const float* q = a.queries + static_cast<std::int64_t>(row) * a.query_stride +
                   static_cast<std::int64_t>(head) * a.head_dim;
  for (int d = tid; d < a.head_dim; d += threads) {
    query[d] = q[d];
  }
  __syncthreads();

  // Scores: one warp per key, lanes over the head dimension.
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int warps = threads / 32;
  float largest = -INFINITY;
  for (int key = warp; key < keys; key += warps) {
    const T* k =
        paged ? paged_row<T>(a, first + key, kv_width, head_offset) : cached_keys + key * kv_width;
    if (k == nullptr) {  // the whole warp takes this branch: one key per warp
      if (lane == 0) {
        p[key] = -INFINITY;  // weight exactly 0 after the softmax
      }
      continue;
    }
    float dot = 0.0F;
    for (int d = lane; d < a.head_dim; d += 32) {
      dot += query[d] * to_float(k[d]);
    }
    const float score = warp_sum(dot) * a.scale;
    if (lane == 0) {
      p[key] = score;
    }
    largest = fmaxf(largest, score);
  }
  largest = block_reduce<true>(largest, scratch);

  float total = 0.0F;
  for (int key = tid; key < keys; key += threads) {
    const float weight = expf(p[key] - largest);
    p[key] = weight;
    total += weight;
  }
  total = block_reduce<false>(total, scratch);
  for (int key = tid; key < keys; key += threads) {
    p[key] = p[key] / total;
  }
  __syncthreads();

  // Values: `slices` groups of threads each sum a share of the keys over the head dimension.
  const int lanes = a.head_dim < threads ? a.head_dim : threads;
  const int slices = threads / lanes;
  const int slice = tid / lanes;
  if (slice < slices) {
    for (int d = tid % lanes; d < a.head_dim; d += lanes) {
      float sum = 0.0F;
      for (int key = slice; key < keys; key += slices) {
        if (paged) {
          const T* v = paged_row<T>(a, first + key, kv_width, kv_width + head_offset);
          if (v != nullptr) {
            sum += p[key] * to_float(v[d]);
          }
        } else {
          sum += p[key] * to_float(cached_values[key * kv_width + d]);
        }
      }
      partial[slice * a.head_dim + d] = sum;
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out) + static_cast<std::int64_t>(row) * a.heads * a.head_dim +
           static_cast<std::int64_t>(head) * a.head_dim;
  for (int d = tid; d < a.head_dim; d += threads) {
    float sum = 0.0F;
    for (int s = 0; s < slices; ++s) {
      sum += partial[s * a.head_dim + d];
    }
    out[d] = from_float<T>(sum);
  }
}

__global__ void head_mean_kernel(const float* probabilities, float* mean, int heads,
                                 int first_position, int window) {
  const int row = static_cast<int>(blockIdx.x);
  const int position = first_position + row;
  const int keys = key_count(position, window);
  const int key = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (key >= keys) {
    return;
  }
  const std::int64_t before = keys_before_row(row, first_position, window);
  const float* p = probabilities + static_cast<std::int64_t>(heads) * before;
  float sum = p[key];
  for (int head = 1; head < heads; ++head) {
    sum += p[static_cast<std::int64_t>(head) * keys + key];
  }
  mean[before + key] = sum * (1.0F / static_cast<float>(heads));
}

template <typename T>
__global__ void swiglu_kernel(const float* gate_up, int rows, int intermediate, T* out) {
  const std::int64_t count = static_cast<std::int64_t>(rows) * intermediate;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const std::int64_t row = i / intermediate;
    const std::int64_t column = i % intermediate;
    const float gate = gate_up[row * 2 * intermediate + column];
    const float up = gate_up[row * 2 * intermediate + intermediate + column];
    out[i] = from_float<T>(gate / (1.0F + expf(-gate)) * up);
  }
}

// One block per slot of a batch: a full-precision slot copied in 16-byte words when its size
// allows, as the link moves it.
template <typename Word>
__global__ void copy_slots_kernel(const Word* source, Word* target, const std::uint32_t* pairs,
                                  std::int64_t words) {
  const std::int64_t from = pairs[2 * blockIdx.x];
  const std::int64_t to = pairs[2 * blockIdx.x + 1];
  const Word* in = source + from * words;
  Word* out = target + to * words;
  for (std::int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    out[i] = in[i];
  }
}

// One warp per (slot, group of head_dim values): the T2 format of kv_quantise.hpp.
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
  for (int i = lane; i < b.head_dim; i += 32) {
    codes[i] = quantise::code_of(to_float(in[i]), scale);
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
  for (int i = static_cast<int>(threadIdx.x); i < b.head_dim; i += 32) {
    out[i] = from_float<T>(quantise::value_of(codes[i], scale));
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

cudaError_t launch_quantise_slots(const SlotBatch& batch, cudaStream_t stream) {
  if (batch.count == 0) {
    return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(batch.count), static_cast<unsigned>(2 * batch.kv_heads));
  return dispatch(batch.dtype, [&](auto tag) {
    using T = decltype(tag);
    quantise_slots_kernel<T><<<grid, 32, 0, stream>>>(batch);
  });
}

cudaError_t launch_dequantise_slots(const SlotBatch& batch, cudaStream_t stream) {
  if (batch.count == 0) {
    return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(batch.count), static_cast<unsigned>(2 * batch.kv_heads));
  return dispatch(batch.dtype, [&](auto tag) {
    using T = decltype(tag);
    dequantise_slots_kernel<T><<<grid, 32, 0, stream>>>(batch);
  });
}

void host_to_float(Dtype dtype, const void* in, float* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case Dtype::kF32: out[i] = static_cast<const float*>(in)[i]; break;
      case Dtype::kF16: out[i] = __half2float(static_cast<const __half*>(in)[i]); break;
      case Dtype::kBF16: out[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]); break;
    }
  }
}

void host_from_float(Dtype dtype, const float* in, void* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case Dtype::kF32: static_cast<float*>(out)[i] = in[i]; break;
      case Dtype::kF16: static_cast<__half*>(out)[i] = __float2half_rn(in[i]); break;
      case Dtype::kBF16: static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(in[i]); break;
    }
  }
}

cudaError_t launch_convert(const float* in, void* out, Dtype dtype, std::int64_t count,
                           cudaStream_t stream) {
  return dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    convert_kernel<T><<<grid_for(count), kBlock, 0, stream>>>(in, static_cast<T*>(out), count);
  });
}

cudaError_t launch_embedding(const void* table, Dtype dtype, const std::int32_t* tokens, int rows,
                             int hidden, float* x, cudaStream_t stream) {
  return dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<T><<<grid_for(static_cast<std::int64_t>(rows) * hidden), kBlock, 0, stream>>>(
        static_cast<const T*>(table), tokens, rows, hidden, x);
  });
}

cudaError_t launch_rms_norm(const float* x, const float* gain, int rows, int cols, float eps,
                            void* out, Dtype dtype, cudaStream_t stream) {
  return dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<rows, kBlock, 0, stream>>>(x, gain, cols, eps, static_cast<T*>(out));
  });
}

cudaError_t launch_qkv_epilogue(const QkvEpilogue& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.rows),
                  static_cast<unsigned>(args.heads + 2 * args.kv_heads));
  const std::size_t shared = (static_cast<std::size_t>(args.head_dim) + 32) * sizeof(float);
  return dispatch(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    qkv_epilogue_kernel<T><<<grid, 128, shared, stream>>>(args);
  });
}

cudaError_t launch_attention(const AttentionArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads));
  const int partial = kBlock > args.head_dim ? kBlock : args.head_dim;
  const std::size_t shared =
      (static_cast<std::size_t>(args.head_dim) + static_cast<std::size_t>(partial) + 32) *
      sizeof(float);
  return dispatch(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    attention_kernel<T><<<grid, kBlock, shared, stream>>>(args);
  });
}

cudaError_t launch_head_mean(const float* probabilities, float* mean, int rows, int heads,
                             int first_position, int window, cudaStream_t stream) {
  // Key counts grow with the position, so the last row has the most.
  const int most = key_count(first_position + rows - 1, window);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((most + kBlock - 1) / kBlock));
  head_mean_kernel<<<grid, kBlock, 0, stream>>>(probabilities, mean, heads, first_position, window);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const float* gate_up, int rows, int intermediate, void* out, Dtype dtype,
                          cudaStream_t stream) {
  return dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    swiglu_kernel<T>
        <<<grid_for(static_cast<std::int64_t>(rows) * intermediate), kBlock, 0, stream>>>(
            gate_up, rows, intermediate, static_cast<T*>(out));
  });
}

}  // namespace kvtier::kernels::cuda
