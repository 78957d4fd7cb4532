#pragma once
// Device kernels of the CUDA engine (impl/cuda_engine.cpp) and their host launchers.
//
// This header is plain C++: the engine, which implements the C++20 Engine interface, is compiled
// by the host compiler and includes it; the kernels are compiled by nvcc as C++17
// (cuda_kernels.cu). So nothing here names a CUDA device type: tensors are `void*` in a Dtype.
//
// Every launcher enqueues its kernel on `stream` (or a Launch's) and returns cudaGetLastError(),
// which the engine checks with the kernel's name. Layouts are row-major; a "row" is one token of
// the call.

#include <cuda_runtime_api.h>

#include <cstdint>

#ifdef __CUDACC__
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier::kernels::cuda {

// Storage of the weight matrices, the KV cache and the inputs of every GEMM. Norm gains, biases,
// the residual stream, GEMM outputs, queries and attention probabilities are always float32.
enum class Dtype { kF32, kF16, kBF16 };

// How a decode step's kernel is launched: on `stream`, and with `early`, as a programmatic
// dependent launch (compute capability 9.0): the GPU may schedule its blocks once every block
// of the stream's previous kernel has started, and they wait for that kernel to finish before
// they read or write anything an earlier kernel uses. Only the weight matrices, which no kernel
// writes, are touched before (the GEMMs prefetch theirs into L2), so the next kernel's start
// overlaps the previous one's last blocks instead of following its end. A plain launch when
// `early` is false, or converted from a bare stream.
struct Launch {
  Launch(cudaStream_t on) : stream(on) {}  // NOLINT(google-explicit-constructor): a bare stream
  Launch(cudaStream_t on, bool early_start) : stream(on), early(early_start) {}
  cudaStream_t stream = nullptr;
  bool early = false;
};

// Keys the query at `position` attends to: positions first .. position, where first is 0, or
// position - window + 1 with a sliding window (window > 0), as the CPU engine.
KVTIER_HOST_DEVICE inline int first_key(int position, int window) {
  const int first = position - window + 1;
  return window > 0 && first > 0 ? first : 0;
}
KVTIER_HOST_DEVICE inline int key_count(int position, int window) {
  return position - first_key(position, window) + 1;
}

// Keys of the rows before `row` of a call whose row 0 runs at `first_position`: where row `row`'s
// probabilities start in the packed buffers (times the heads for per-head rows).
KVTIER_HOST_DEVICE inline std::int64_t keys_before_row(int row, int first_position, int window) {
  const std::int64_t rows = row;
  const std::int64_t first_count = static_cast<std::int64_t>(first_position) + 1;
  if (window <= 0) {
    return rows * first_count + rows * (rows - 1) / 2;
  }
  // Rows still growing (count first_count + i <= window), then rows of `window` keys each.
  std::int64_t growing = static_cast<std::int64_t>(window) - first_count + 1;
  growing = growing < 0 ? 0 : (growing > rows ? rows : growing);
  return growing * first_count + growing * (growing - 1) / 2 + (rows - growing) * window;
}

// Whether the kernels the current device runs were compiled for compute capability 9.0 or later,
// where they carry early launches' waits (cuda_launch.cuh): a build for older architectures
// only, run through PTX JIT, leaves them out, and launching early would then race.
[[nodiscard]] bool early_launch_compiled();

// out[i] = in[i] converted to `dtype` (round to nearest even), for weight upload.
cudaError_t launch_convert(const float* in, void* out, Dtype dtype, std::int64_t count,
                           cudaStream_t stream);

// x[row] = float(table[tokens[row]]): rows of `hidden` from a [vocab, hidden] table.
cudaError_t launch_embedding(const void* table, Dtype dtype, const std::int32_t* tokens, int rows,
                             int hidden, float* x, cudaStream_t stream);

// out[row] = (x[row] * 1/sqrt(mean(x[row]^2) + eps)) * gain, rows of `cols`, written in `dtype`.
cudaError_t launch_rms_norm(const float* x, const float* gain, int rows, int cols, float eps,
                            void* out, Dtype dtype, const Launch& launch);

// What follows the fused Q/K/V projection, for each row and head: bias (Qwen2), per-head RMSNorm
// of queries and keys (Qwen3), RoPE of queries and keys; then keys and values are stored in the
// layer's cache (in `dtype`) and written back into `qkv` as the cache holds them, so that the
// observer sees the keys as cached.
struct QkvEpilogue {
  float* qkv = nullptr;  // [rows][row_stride]: heads*head_dim queries, then keys, then values
  int row_stride = 0;
  int rows = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int first_position = 0;
  // Where a CUDA graph's replay finds row 0's position (device memory), read by the kernel in
  // place of first_position; nullptr: first_position.
  const int* position_at = nullptr;
  const float* bias = nullptr;    // [row_stride] or nullptr
  const float* q_gain = nullptr;  // [head_dim] or nullptr (then k_gain is nullptr too)
  const float* k_gain = nullptr;
  float eps = 0.0F;
  const float* inverse_frequency = nullptr;  // [head_dim / 2]
  bool interleaved_pairs = false;            // RopeLayout::kInterleavedPairs
  void* cache_keys = nullptr;                // [capacity][kv_heads * head_dim] in dtype
  void* cache_values = nullptr;
  // With an external store (kernels/engine.hpp DeviceLayerSlots): keys and values go to slot
  // page_table[position] of `slots` ([slot][2][kv_heads * head_dim]) instead of the cache.
  const std::int32_t* page_table = nullptr;
  void* slots = nullptr;
  Dtype dtype = Dtype::kF32;
};
cudaError_t launch_qkv_epilogue(const QkvEpilogue& args, const Launch& launch);

// Causal attention of `rows` query rows (row r at first_position + r) over one layer's cache: for
// every (query head, row) the softmax of q.k * scale over the row's keys, written to
// `probabilities` (packed: row r, head h at heads * keys_before_row(r) + h * key_count), and the
// probability-weighted sum of the values, written to `out` in `dtype`. Query head h reads KV head
// h / (heads / kv_heads).
struct AttentionArgs {
  const float* queries = nullptr;  // row r, head h at r * query_stride + h * head_dim
  int query_stride = 0;
  const void* cache_keys = nullptr;  // [capacity][kv_heads * head_dim] in dtype
  const void* cache_values = nullptr;
  // With an external store: position p's key and value are in the slot page_table[p] names
  // (kernels/engine.hpp DeviceLayerSlots); -1 positions get probability 0 (left out of the
  // softmax, which renormalises over the rest). The cache pointers are then unused.
  const std::int32_t* page_table = nullptr;
  const void* t0_slots = nullptr;
  const void* staging_slots = nullptr;
  Dtype dtype = Dtype::kF32;
  float* probabilities = nullptr;
  void* out = nullptr;  // [rows][heads * head_dim] in dtype
  int rows = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int first_position = 0;
  // As QkvEpilogue::position_at, for calls of one row: row 0's position is read from device
  // memory, and first_position is then the largest it may be (it sizes the split path's grid
  // and scratch; chunks past a replay's keys return at once).
  const int* position_at = nullptr;
  int window = 0;  // sliding window in tokens; 0: global
  float scale = 1.0F;
};
cudaError_t launch_attention(const AttentionArgs& args, const Launch& launch);

// Split-key ("flash-decoding") attention, for calls of few rows: the per-head kernel above runs
// one block per (row, head), which at decode is heads blocks (32 for a 7B model, a quarter of an
// H200's SMs), each walking thousands of keys one dependent load after another. Here a block
// takes kSplitKeysPerChunk keys of one (row, head) and leaves (chunk max, chunk sum, unnormalised
// weighted values) in `scratch`; a second kernel per (row, head) rescales the chunks to the
// row's maximum, writes `out` and normalises the probabilities in place. Probabilities and `out`
// have the per-head kernel's layouts, so everything that reads them is unchanged.
//
// 64 keys per chunk: 4096 keys give 64 chunks, 2048 blocks for 32 heads (about 15 per SM on 132
// SMs), and even 512 keys give 256 blocks; a chunk's record (head_dim + 2 floats) is under 2% of
// the key and value bytes it summarises in BF16 at head_dim 128, so the combine pass is cheap.
// Smaller chunks would add blocks the GPU cannot run at once and combine traffic; larger ones
// leave SMs idle at a few hundred keys.
inline constexpr int kSplitKeysPerChunk = 64;
KVTIER_HOST_DEVICE inline int split_key_chunks(int keys) {
  return (keys + kSplitKeysPerChunk - 1) / kSplitKeysPerChunk;
}
// Floats of scratch the split path needs for `rows` rows from `first_position`: per (row, head,
// chunk of the last row's keys, which has the most) a record [max, sum, head_dim weighted sums].
inline std::int64_t split_key_scratch_floats(int rows, int heads, int head_dim, int first_position,
                                             int window) {
  const int chunks = split_key_chunks(key_count(first_position + rows - 1, window));
  return static_cast<std::int64_t>(rows) * heads * chunks *
         (static_cast<std::int64_t>(head_dim) + 2);
}
// `scratch` holds split_key_scratch_floats(...) floats; it is overwritten.
//
// With `arrivals` (rows * heads counters, zero, left zero) there is no second kernel: each chunk
// block counts itself in its (row, head)'s counter once its record is written, and the block
// that arrives last combines the row's records as the combine kernel does, with the same
// arithmetic, so `out` and the probabilities are bit for bit the two-kernel path's. It saves a
// launch and a kernel's fixed cost per layer; the combine then waits for no other (row, head).
cudaError_t launch_split_key_attention(const AttentionArgs& args, float* scratch,
                                       std::uint32_t* arrivals, const Launch& launch);

// The head mean of packed per-head probabilities: mean row r (packed at keys_before_row(r)) is
// the heads' rows added one after another and scaled once by 1/heads, as the tracer does.
cudaError_t launch_head_mean(const float* probabilities, float* mean, int rows, int heads,
                             int first_position, int window, cudaStream_t stream);

// What an observer is shown of one layer of a decode step (one row), gathered on the device into
// one record of float32: the row's keys and values (kv_width each, as the Q/K/V epilogue wrote
// them back into qkv), its queries (q_width), then its probabilities, every head's row (heads x
// keys) or their head mean (keys, as launch_head_mean computes it). A step's records go to the
// host in one copy instead of four per layer.
struct ObservedLayer {
  const float* qkv = nullptr;  // the step's row: queries, keys, values
  int q_width = 0;
  int kv_width = 0;
  const float* probabilities = nullptr;  // [heads][keys]
  int heads = 0;
  int keys = 0;
  bool head_mean = false;
  float* out = nullptr;  // observed_layer_floats(*this) floats
};
KVTIER_HOST_DEVICE inline std::int64_t observed_layer_floats(const ObservedLayer& layer) {
  return 2 * static_cast<std::int64_t>(layer.kv_width) + layer.q_width +
         static_cast<std::int64_t>(layer.keys) * (layer.head_mean ? 1 : layer.heads);
}
cudaError_t launch_gather_observation(const ObservedLayer& layer, cudaStream_t stream);

// out[r][c] = silu(gate_up[r][c]) * gate_up[r][intermediate + c], written in `dtype`.
cudaError_t launch_swiglu(const float* gate_up, int rows, int intermediate, void* out, Dtype dtype,
                          const Launch& launch);

// --- Small GEMMs (impl/cuda_gemv.cu) -------------------------------------------------------
// Calls of at most this many rows may use the warp-per-row GEMM (CudaGemm::kWarpRows).
inline constexpr int kWarpRowsMaxRows = 8;
// Whether launch_warp_rows_gemm takes these operands: 1..kWarpRowsMaxRows rows, in_features a
// multiple of a 16-byte load's elements, weight and input 16-byte aligned.
bool warp_rows_gemm_applies(Dtype dtype, int in_features, int rows, const void* weight,
                            const void* input);
// out[r][o] = sum_i input[r][i] * weight[o][i] (plus out[r][o] when `accumulate`), weight
// [out_features, in_features] and input [rows, in_features] in `dtype`, out float32; float32
// accumulation in another order than cuBLAS's. cudaErrorInvalidValue when it does not apply.
cudaError_t launch_warp_rows_gemm(const void* weight, Dtype dtype, int out_features,
                                  int in_features, const void* input, int rows, float* out,
                                  bool accumulate, const Launch& launch);
// The gate/up projection and SwiGLU in one kernel: a warp computes gate feature c (weight row c)
// and up feature c (row intermediate + c) as the GEMM above computes each, then writes
// out[r][c] = silu(gate) * up in `dtype` as launch_swiglu does, so `out` is bit for bit the GEMM
// followed by launch_swiglu, without the float32 [rows][2 * intermediate] in between or the
// second kernel. Operands as launch_warp_rows_gemm with out_features = 2 * intermediate.
cudaError_t launch_warp_rows_swiglu(const void* weight, Dtype dtype, int intermediate,
                                    int in_features, const void* input, int rows, void* out,
                                    const Launch& launch);
// For the GEMV benchmark: the same kernel for one BF16 row (no accumulation) with `rounds`
// 16-byte loads in flight per lane and `warps` warps a block, where the engine's has 4 and 8;
// the variants built are (2, 8), (8, 8), (4, 4) and (4, 16), others cudaErrorInvalidValue.
cudaError_t launch_warp_rows_gemm_variant(int rounds, int warps, const void* weight,
                                          int out_features, int in_features, const void* input,
                                          float* out, cudaStream_t stream);

// --- The live tiered cache's copies (impl/cuda_tiered_cache.cpp) ----------------------------
// A slot is one token-layer: [2][kv_heads * head_dim] in `dtype` at full precision, or the T2
// format of kernels/impl/kv_quantise.hpp (codes, then float32 scales) compressed. A batch moves
// slot pairs[2i] of `source` to slot pairs[2i + 1] of `target`; either side may be device memory
// or mapped pinned host memory (its device address), so one kernel performs a host-to-device,
// device-to-host or device-to-device batch however scattered its slots are.
struct SlotBatch {
  const void* source = nullptr;
  void* target = nullptr;
  const std::uint32_t* pairs = nullptr;  // device-readable, 2 * count entries
  int count = 0;
  int kv_heads = 0;
  int head_dim = 0;
  Dtype dtype = Dtype::kF32;
};
// Full precision to full precision.
cudaError_t launch_copy_slots(const SlotBatch& batch, cudaStream_t stream);
// Full precision to compressed.
cudaError_t launch_quantise_slots(const SlotBatch& batch, cudaStream_t stream);
// Compressed to full precision.
cudaError_t launch_dequantise_slots(const SlotBatch& batch, cudaStream_t stream);

// Host-side conversions of `count` values (round to nearest even), for recodes in host memory.
// To BF16 they round as CUDA's __float2bfloat16_rn does on the host (NaN as 0x7fff), in integer
// operations that vectorise: CUDA's host form branches value by value, about five times slower.
void host_to_float(Dtype dtype, const void* in, float* out, std::int64_t count);
void host_from_float(Dtype dtype, const float* in, void* out, std::int64_t count);
// One value's BF16 bits, as host_from_float writes them.
[[nodiscard]] std::uint16_t host_bfloat16_bits(float value);

}  // namespace kvtier::kernels::cuda
