// Device kernels of the CUDA engine (see cuda_kernels.cuh). They follow the CPU engine's
// arithmetic step by step (float32 accumulation, the same order of scaling and gain, expf and
// sincosf rather than their fast approximations), so that in float32 the two engines differ by
// rounding only; GEMMs are cuBLAS, in the engine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/impl/cuda_elementwise.cuh"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/cuda_launch.cuh"
#include "kernels/impl/cuda_reduce.cuh"
#include "kernels/impl/cuda_vector.cuh"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kBlock = 256;
// Grid-stride kernels launch at most this many blocks.
constexpr std::int64_t kMaxBlocks = 8192;

int grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// As dispatch for launches through start_kernel, whose status start(T{}) returns.
template <typename Starter>
cudaError_t dispatch_started(Dtype dtype, Starter&& start) {
  cudaError_t status = cudaErrorInvalidValue;
  with_type(dtype, [&](auto tag) { status = start(tag); });
  return status;
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

// One block per row, about four elements a thread: a row is read in one or two round trips to
// memory rather than one per 256 elements (a single block at decode, on the critical path).
int rms_norm_threads(int cols) {
  int threads = 32;
  while (threads < 1024 && threads * 4 < cols) {
    threads *= 2;
  }
  return threads;
}
template <typename T>
__global__ void __launch_bounds__(1024)
    rms_norm_kernel(const float* x, const float* gain, int cols, float eps, T* out) {
  await_previous_kernel();  // launched early (cuda_launch.cuh): nothing is read before
  release_next_kernel();
  __shared__ float scratch[32];
  const float* row = x + static_cast<std::int64_t>(blockIdx.x) * cols;
  T* out_row = out + static_cast<std::int64_t>(blockIdx.x) * cols;
  float squares = 0.0F;
#pragma unroll 4
  for (int i = static_cast<int>(threadIdx.x); i < cols; i += static_cast<int>(blockDim.x)) {
    squares += row[i] * row[i];
  }
  squares = block_reduce<false>(squares, scratch);
  const float inverse_rms = 1.0F / sqrtf(squares / static_cast<float>(cols) + eps);
#pragma unroll 4
  for (int i = static_cast<int>(threadIdx.x); i < cols; i += static_cast<int>(blockDim.x)) {
    out_row[i] = from_float<T>((row[i] * inverse_rms) * gain[i]);
  }
}

// Row 0's position: from device memory in a CUDA graph's replay (position_at), else the
// launch's.
template <typename Args>
__device__ __forceinline__ int first_position_of(const Args& a) {
  return a.position_at != nullptr ? *a.position_at : a.first_position;
}

// One block per (row, head slot); slots are the query heads, then the KV heads' keys, then their
// values, which is also their order inside a row of qkv. Rows are the grid's x dimension, which
// has no 65,535 limit.
template <typename T>
__global__ void qkv_epilogue_kernel(QkvEpilogue a) {
  await_previous_kernel();
  release_next_kernel();
  extern __shared__ float shared[];
  float* vector = shared;                // head_dim
  float* scratch = shared + a.head_dim;  // 32
  const int row = static_cast<int>(blockIdx.x);
  const int slot = static_cast<int>(blockIdx.y);
  const int position = first_position_of(a) + row;
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

// Where the probabilities of (row, head) start: rows packed one after another, each row's
// heads one after another (cuda_kernels.cuh).
__device__ __forceinline__ float* probability_row(const AttentionArgs& a, int first_position,
                                                  int row, int head, int keys) {
  return a.probabilities +
         static_cast<std::int64_t>(a.heads) * keys_before_row(row, first_position, a.window) +
         static_cast<std::int64_t>(head) * keys;
}

// The query of (row, head) into shared memory, visible to the whole block on return.
__device__ __forceinline__ void load_query(const AttentionArgs& a, int row, int head,
                                           float* query) {
  const float* q = a.queries + static_cast<std::int64_t>(row) * a.query_stride +
                   static_cast<std::int64_t>(head) * a.head_dim;
  for (int d = static_cast<int>(threadIdx.x); d < a.head_dim; d += static_cast<int>(blockDim.x)) {
    query[d] = q[d];
  }
  __syncthreads();
}

// A key or value row read in units of kSize elements widened to float32: one element, or with
// kVector one 16-byte load (rows then start 16-byte aligned and hold whole loads).
template <typename T, bool kVector>
struct RowUnits {
  static constexpr int kSize = kVector ? Vector<T>::kSize : 1;
  __device__ static void load(const T* row, int unit, float* out) {
    if constexpr (kVector) {
      Vector<T>::widen(*reinterpret_cast<const uint4*>(row + unit * kSize), out);
    } else {
      out[0] = to_float(row[unit]);
    }
  }
};

// Both attention kernels' dynamic shared memory: the query (head_dim floats), the value slices'
// partial sums (max(threads * elements per unit, head_dim)) and 32 floats of reduction scratch.
struct AttentionShared {
  float* query;
  float* partial;
  float* reduce;
};
__device__ __forceinline__ AttentionShared attention_shared(float* shared, int head_dim,
                                                            int unit_elements) {
  const int partial = static_cast<int>(blockDim.x) * unit_elements;
  float* partials = shared + head_dim;
  return {shared, partials, partials + (partial > head_dim ? partial : head_dim)};
}
std::size_t attention_shared_bytes(int threads, int head_dim, int unit_elements) {
  const int partial = threads * unit_elements > head_dim ? threads * unit_elements : head_dim;
  return (static_cast<std::size_t>(head_dim) + static_cast<std::size_t>(partial) + 32) *
         sizeof(float);
}

// The weighted sum of `keys` value rows into `partial` (visible to the whole block on return):
// threads over the head dimension's units, and `slices` groups of them each over a share of the
// keys when the row has fewer units than the block has threads, so that a thread's loads of
// several keys are in flight together. value_row(key) is the key's value row (nullptr: left
// out), weight(key) its weight. Returns the number of slices (slice_total).
template <typename T, bool kVector, typename ValueRow, typename Weight>
__device__ __forceinline__ int weighted_values(int head_dim, int keys, float* partial,
                                               ValueRow value_row, Weight weight) {
  using Units = RowUnits<T, kVector>;
  constexpr int kSize = Units::kSize;
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int units = head_dim / kSize;
  const int lanes = units < threads ? units : threads;
  const int slices = threads / lanes;
  const int slice = tid / lanes;
  if (slice < slices) {
    for (int unit = tid % lanes; unit < units; unit += lanes) {
      float sum[kSize] = {};
#pragma unroll 8
      for (int key = slice; key < keys; key += slices) {
        const T* v = value_row(key);
        if (v != nullptr) {
          float values[kSize];
          Units::load(v, unit, values);
          const float w = weight(key);
#pragma unroll
          for (int e = 0; e < kSize; ++e) {
            sum[e] += w * values[e];
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        partial[slice * head_dim + unit * kSize + e] = sum[e];
      }
    }
  }
  __syncthreads();
  return slices;
}

// Column d of the value sums that `slices` groups of threads left in `partial`.
__device__ __forceinline__ float slice_total(const float* partial, int slices, int head_dim,
                                             int d) {
  float sum = 0.0F;
  for (int s = 0; s < slices; ++s) {
    sum += partial[s * head_dim + d];
  }
  return sum;
}

// One block per (row, query head): scores into the row's probabilities, softmax in place, then
// the weighted sum of the values.
template <typename T>
__global__ void attention_kernel(AttentionArgs a) {
  await_previous_kernel();
  release_next_kernel();
  extern __shared__ float shared[];
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const auto [query, partial, scratch] = attention_shared(shared, a.head_dim, 1);

  const int row = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int first_position = first_position_of(a);
  const int position = first_position + row;
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
  float* p = probability_row(a, first_position, row, head, keys);
  load_query(a, row, head, query);

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

  const int slices = weighted_values<T, false>(
      a.head_dim, keys, partial,
      [&](int key) {
        return paged ? paged_row<T>(a, first + key, kv_width, kv_width + head_offset)
                     : cached_values + key * kv_width;
      },
      [&](int key) { return p[key]; });
  T* out = static_cast<T*>(a.out) + static_cast<std::int64_t>(row) * a.heads * a.head_dim +
           static_cast<std::int64_t>(head) * a.head_dim;
  for (int d = tid; d < a.head_dim; d += threads) {
    out[d] = from_float<T>(slice_total(partial, slices, a.head_dim, d));
  }
}

// The split-key path (cuda_kernels.cuh, launch_split_key_attention). Two threads per key of a
// chunk for the scores, so that every key's loads are in flight at once: a block waits a few
// round trips to memory (page table, keys, values) rather than one per key.
constexpr int kSplitBlock = 2 * kSplitKeysPerChunk;

// A chunk's weights are relative to its own maximum m; relative to the row's maximum they are
// scaled by exp(m - row maximum), 0 for a chunk with nothing in it.
__device__ __forceinline__ float chunk_factor(float chunk_max, float row_max) {
  return chunk_max == -INFINITY ? 0.0F : expf(chunk_max - row_max);
}

// How combine_chunks reads the records and probabilities: as any load in the combine kernel,
// which runs after the scores kernel; from L2 (past this SM's L1, which another block's writes
// do not reach) in the scores kernel's last block of a (row, head).
struct CachedLoad {
  __device__ float operator()(const float* at) const { return *at; }
};
struct L2Load {
  __device__ float operator()(const float* at) const { return __ldcg(at); }
};

// The (row, head)'s chunk records in `scratch` combined into `out`, and the chunks' weights in
// the probabilities rescaled to the normalised softmax, by one block of kSplitBlock threads
// (the combine kernel's, or the last chunk block's in the scores kernel: the same arithmetic).
template <typename T, typename Load>
__device__ void combine_chunks(const AttentionArgs& a, const float* scratch, int chunks, int row,
                               int head, float* reduce, Load load) {
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int first_position = first_position_of(a);
  const int position = first_position + row;
  const int keys = key_count(position, a.window);
  const int row_chunks = split_key_chunks(keys);
  const std::int64_t record_floats = static_cast<std::int64_t>(a.head_dim) + 2;
  const float* records =
      scratch + (static_cast<std::int64_t>(row) * a.heads + head) * chunks * record_floats;

  float largest = -INFINITY;
  for (int c = tid; c < row_chunks; c += threads) {
    largest = fmaxf(largest, load(records + c * record_floats));
  }
  largest = block_reduce<true>(largest, reduce);
  float total = 0.0F;
  for (int c = tid; c < row_chunks; c += threads) {
    // fmaf rather than a contraction the compiler may or may not make in each instantiation.
    total = fmaf(load(records + c * record_floats + 1),
                 chunk_factor(load(records + c * record_floats), largest), total);
  }
  total = block_reduce<false>(total, reduce);
  // total is 0 only when every key of the row is evicted; then the output and probabilities are
  // 0 rather than 0/0.
  const bool any = total > 0.0F;

  T* out = static_cast<T*>(a.out) + static_cast<std::int64_t>(row) * a.heads * a.head_dim +
           static_cast<std::int64_t>(head) * a.head_dim;
  for (int d = tid; d < a.head_dim; d += threads) {
    float sum = 0.0F;
    for (int c = 0; c < row_chunks; ++c) {
      sum = fmaf(load(records + c * record_floats + 2 + d),
                 chunk_factor(load(records + c * record_floats), largest), sum);
    }
    out[d] = from_float<T>(any ? sum / total : 0.0F);
  }
  float* p = probability_row(a, first_position, row, head, keys);
  for (int key = tid; key < keys; key += threads) {
    const float factor =
        chunk_factor(load(records + (key / kSplitKeysPerChunk) * record_floats), largest);
    p[key] = any ? load(p + key) * factor / total : 0.0F;
  }
}

// One block per (row, query head, chunk of kSplitKeysPerChunk keys): the chunk's scores, their
// maximum m, weights exp(score - m) into the probabilities, their sum s and the weighted values,
// left as the record [m, s, sums] in `scratch` for split_key_combine_kernel. With kVector the
// key and value rows are read in 16-byte loads.
template <typename T, bool kVector>
__global__ void split_key_scores_kernel(AttentionArgs a, float* scratch, int chunks,
                                        unsigned* arrivals) {
  await_previous_kernel();
  release_next_kernel();
  using Units = RowUnits<T, kVector>;
  constexpr int kSize = Units::kSize;
  extern __shared__ float shared[];
  // Where each key's key and value rows are, found once; then the keys' weights.
  __shared__ const T* key_rows[kSplitKeysPerChunk];
  __shared__ const T* value_rows[kSplitKeysPerChunk];
  __shared__ float weights[kSplitKeysPerChunk];
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const auto [query, partial, reduce] = attention_shared(shared, a.head_dim, kSize);

  const int row = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int chunk = static_cast<int>(blockIdx.z);
  const int first_position = first_position_of(a);
  const int position = first_position + row;
  const int first = first_key(position, a.window);
  const int keys = position - first + 1;
  const int chunk_first = chunk * kSplitKeysPerChunk;
  // Earlier rows of a prefill have fewer keys than the grid's last row; the combine kernel reads
  // only the row's own chunks. The whole block returns, before any barrier.
  if (chunk_first >= keys) {
    return;
  }
  const int count =
      keys - chunk_first < kSplitKeysPerChunk ? keys - chunk_first : kSplitKeysPerChunk;
  const int kv_head = head / (a.heads / a.kv_heads);
  const std::int64_t kv_width = static_cast<std::int64_t>(a.kv_heads) * a.head_dim;
  const std::int64_t head_offset = static_cast<std::int64_t>(kv_head) * a.head_dim;
  const bool paged = a.page_table != nullptr;
  float* p = probability_row(a, first_position, row, head, keys) + chunk_first;

  // Every key's rows at once (one page-table read each), beside the query's load.
  for (int key = tid; key < count; key += threads) {
    const int key_position = first + chunk_first + key;
    const T* k = paged
                     ? paged_row<T>(a, key_position, kv_width, head_offset)
                     : static_cast<const T*>(a.cache_keys) + key_position * kv_width + head_offset;
    key_rows[key] = k;
    value_rows[key] =
        k == nullptr ? nullptr
        : paged      ? k + kv_width
                : static_cast<const T*>(a.cache_values) + key_position * kv_width + head_offset;
  }
  load_query(a, row, head, query);  // its barrier publishes the rows too

  // Scores: threads 2k and 2k + 1 take alternate units of key k's row.
  const int scored = tid / 2;  // the key this thread scores
  const int part = tid % 2;
  const T* k = scored < count ? key_rows[scored] : nullptr;
  const int units = a.head_dim / kSize;
  float dot = 0.0F;
  if (k != nullptr) {
#pragma unroll 8
    for (int unit = part; unit < units; unit += 2) {
      float values[kSize];
      Units::load(k, unit, values);
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        dot += query[unit * kSize + e] * values[e];
      }
    }
  }
  dot += __shfl_xor_sync(kFullMask, dot, 1);  // every thread: the shuffle needs them all
  const bool mine = part == 0 && scored < count;
  // Evicted (-1) keys: score -inf, weight exactly 0.
  const float score = k != nullptr ? dot * a.scale : -INFINITY;
  const float largest = block_reduce<true>(mine ? score : -INFINITY, reduce);
  // A chunk of evicted keys only has maximum -inf: its weights are 0, not exp(-inf - -inf).
  const float weight = mine && largest != -INFINITY ? expf(score - largest) : 0.0F;
  if (mine) {
    weights[scored] = weight;
    p[scored] = weight;
  }
  const float total = block_reduce<false>(weight, reduce);  // its barriers publish `weights`

  const int slices = weighted_values<T, kVector>(
      a.head_dim, count, partial, [&](int key) { return value_rows[key]; },
      [&](int key) { return weights[key]; });
  const std::int64_t record_floats = static_cast<std::int64_t>(a.head_dim) + 2;
  float* record = scratch + ((static_cast<std::int64_t>(row) * a.heads + head) * chunks + chunk) *
                                record_floats;
  if (tid == 0) {
    record[0] = largest;
    record[1] = total;
  }
  for (int d = tid; d < a.head_dim; d += threads) {
    record[2 + d] = slice_total(partial, slices, a.head_dim, d);
  }
  if (arrivals == nullptr) {
    return;  // the combine kernel follows
  }
  // The (row, head)'s last chunk block to arrive combines: each block makes its record and
  // weights visible device-wide before it counts itself, so the last one sees every block's.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  unsigned* arrived = arrivals + static_cast<std::int64_t>(row) * a.heads + head;
  if (tid == 0) {
    last = atomicAdd(arrived, 1U) + 1U == static_cast<unsigned>(split_key_chunks(keys));
    __threadfence();  // the other blocks' writes, seen by their count, come before the reads below
  }
  __syncthreads();
  if (!last) {
    return;
  }
  combine_chunks<T>(a, scratch, chunks, row, head, reduce, L2Load{});
  if (tid == 0) {
    *arrived = 0;  // every chunk block has counted itself: ready for the next launch
  }
}

// One block per (row, query head): combine_chunks.
template <typename T>
__global__ void split_key_combine_kernel(AttentionArgs a, const float* scratch, int chunks) {
  await_previous_kernel();
  release_next_kernel();
  __shared__ float reduce[32];
  combine_chunks<T>(a, scratch, chunks, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                    reduce, CachedLoad{});
}

// The mean over heads of one key's probabilities, p holding a row's heads one after another:
// added in head order and scaled once, as the tracer does (one definition for both kernels).
__device__ __forceinline__ float head_mean_of(const float* p, int heads, int keys, int key) {
  float sum = p[key];
  for (int head = 1; head < heads; ++head) {
    sum += p[static_cast<std::int64_t>(head) * keys + key];
  }
  return sum * (1.0F / static_cast<float>(heads));
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
  mean[before + key] =
      head_mean_of(probabilities + static_cast<std::int64_t>(heads) * before, heads, keys, key);
}

// A decode step's observed layer gathered into one record (cuda_kernels.cuh).
__global__ void gather_observation_kernel(ObservedLayer a) {
  const int kv = 2 * a.kv_width;
  const std::int64_t total = observed_layer_floats(a);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    float value = 0.0F;
    if (i < kv) {
      value = a.qkv[a.q_width + i];  // keys, then values: adjacent in the row
    } else if (i < kv + a.q_width) {
      value = a.qkv[i - kv];
    } else {
      const auto key = static_cast<int>(i - kv - a.q_width);
      value =
          a.head_mean ? head_mean_of(a.probabilities, a.heads, a.keys, key) : a.probabilities[key];
    }
    a.out[i] = value;
  }
}

template <typename T>
__global__ void swiglu_kernel(const float* gate_up, int rows, int intermediate, T* out) {
  await_previous_kernel();
  release_next_kernel();
  const std::int64_t count = static_cast<std::int64_t>(rows) * intermediate;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const std::int64_t row = i / intermediate;
    const std::int64_t column = i % intermediate;
    const float gate = gate_up[row * 2 * intermediate + column];
    const float up = gate_up[row * 2 * intermediate + intermediate + column];
    out[i] = swiglu_of<T>(gate, up);
  }
}

}  // namespace

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

bool early_launch_compiled() {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, rms_norm_kernel<float>) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return false;
  }
  return attributes.ptxVersion >= 90;
}

cudaError_t launch_rms_norm(const float* x, const float* gain, int rows, int cols, float eps,
                            void* out, Dtype dtype, const Launch& launch) {
  return dispatch_started(dtype, [&](auto tag) {
    using T = decltype(tag);
    return start_kernel(rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)),
                        dim3(static_cast<unsigned>(rms_norm_threads(cols))), 0, launch, x, gain,
                        cols, eps, static_cast<T*>(out));
  });
}

cudaError_t launch_qkv_epilogue(const QkvEpilogue& args, const Launch& launch) {
  const dim3 grid(static_cast<unsigned>(args.rows),
                  static_cast<unsigned>(args.heads + 2 * args.kv_heads));
  const std::size_t shared = (static_cast<std::size_t>(args.head_dim) + 32) * sizeof(float);
  return dispatch_started(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    return start_kernel(qkv_epilogue_kernel<T>, grid, dim3(128), shared, launch, args);
  });
}

cudaError_t launch_attention(const AttentionArgs& args, const Launch& launch) {
  const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads));
  const std::size_t shared = attention_shared_bytes(kBlock, args.head_dim, 1);
  return dispatch_started(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    return start_kernel(attention_kernel<T>, grid, dim3(kBlock), shared, launch, args);
  });
}

cudaError_t launch_split_key_attention(const AttentionArgs& args, float* scratch,
                                       std::uint32_t* arrivals, const Launch& launch) {
  const int most_keys = key_count(args.first_position + args.rows - 1, args.window);
  const int chunks = split_key_chunks(most_keys);
  const dim3 score_grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads),
                        static_cast<unsigned>(chunks));
  const dim3 combine_grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(args.heads));
  // 16-byte loads when every key and value row starts 16-byte aligned and holds whole loads.
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(args.head_dim) * (args.dtype == Dtype::kF32 ? 4 : 2);
  const auto aligned = [](const void* pointer) {
    return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0;
  };
  const bool vector =
      row_bytes % 16 == 0 &&
      (args.page_table != nullptr ? aligned(args.t0_slots) && aligned(args.staging_slots)
                                  : aligned(args.cache_keys) && aligned(args.cache_values));
  return dispatch_started(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t scored =
        vector ? start_kernel(split_key_scores_kernel<T, true>, score_grid, dim3(kSplitBlock),
                              attention_shared_bytes(kSplitBlock, args.head_dim, Vector<T>::kSize),
                              launch, args, scratch, chunks, arrivals)
               : start_kernel(split_key_scores_kernel<T, false>, score_grid, dim3(kSplitBlock),
                              attention_shared_bytes(kSplitBlock, args.head_dim, 1), launch, args,
                              scratch, chunks, arrivals);
    // A failed scores launch leaves nothing to combine; its error is the one to report.
    if (scored != cudaSuccess || arrivals != nullptr) {
      return scored;
    }
    // kSplitBlock threads, as the scores kernel's last blocks combine with.
    return start_kernel(split_key_combine_kernel<T>, combine_grid, dim3(kSplitBlock), 0, launch,
                        args, static_cast<const float*>(scratch), chunks);
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

cudaError_t launch_gather_observation(const ObservedLayer& layer, cudaStream_t stream) {
  gather_observation_kernel<<<grid_for(observed_layer_floats(layer)), kBlock, 0, stream>>>(layer);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const float* gate_up, int rows, int intermediate, void* out, Dtype dtype,
                          const Launch& launch) {
  return dispatch_started(dtype, [&](auto tag) {
    using T = decltype(tag);
    return start_kernel(
        swiglu_kernel<T>,
        dim3(static_cast<unsigned>(grid_for(static_cast<std::int64_t>(rows) * intermediate))),
        dim3(kBlock), 0, launch, gate_up, rows, intermediate, static_cast<T*>(out));
  });
}

}  // namespace kvtier::kernels::cuda
