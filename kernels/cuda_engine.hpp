#pragma once
// The CUDA engine: the CPU engine's forward pass on an NVIDIA GPU (docs/ENGINE.md, "The CUDA
// engine"). Same interface, same architectures (Llama, Mistral sliding windows, Qwen2 biases,
// Qwen3 q/k norms, tied LM heads, both RoPE layouts and scalings), same observer calls.
//
// Weights are uploaded once, converted to the compute dtype; GEMMs are cuBLAS in that dtype with
// float32 accumulation and float32 outputs; the residual stream, norms, RoPE, softmax and the
// probabilities the observer sees are float32; the KV cache is in the compute dtype. In FP32 the
// engine differs from the CPU engine by rounding only.
//
// Declared in every build. Without the CUDA targets make_cuda_engine throws ConfigError "the
// CUDA engine is not available in this build".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/engine.hpp"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

// Storage of weights, KV cache and GEMM inputs.
enum class CudaComputeDtype { kBF16, kFP16, kFP32 };

// What on_attention's probabilities hold.
enum class ObserverRows {
  // Every head's softmax row, exactly as the CPU engine shows it.
  kPerHead,
  // The head mean, reduced on the device (the tracer's mean granularity): each head's row in the
  // AttentionStep is that mean, so the layout is the CPU engine's while the device-to-host copy
  // is 1/heads of it. Right for mean and top-k traces; wrong for per-head rows or a prefill window.
  kHeadMean,
};

// Which thread calls the observer.
enum class ObserverDelivery {
  // A delivery thread of the engine, from pinned host ring buffers the device copies into
  // asynchronously, so that observing does not stall decoding: calls for a forward pass may run
  // after prefill()/decode() return. They run in the CPU engine's order, one at a time;
  // set_observer() and reset() wait for every pending call (and rethrow an exception the
  // observer threw, which otherwise comes from the next prefill()/decode()). Detach an observer
  // (set_observer(nullptr)) before destroying it. No call happens after an exception has left
  // prefill()/decode(), or once the engine's destructor has begun.
  kAsynchronous,
  // The calling thread, within prefill()/decode(), after a device synchronisation per layer.
  kSynchronous,
};

// Which attention kernel runs (docs/ENGINE.md, "The CUDA engine").
enum class CudaAttention {
  // One block per (row, query head) walking all of the row's keys. Right for prefill, whose grid
  // is rows x heads blocks; at decode only heads blocks run, each latency-bound on its key loop.
  kPerHead,
  // Split keys ("flash-decoding"): blocks per (row, head, chunk of 64 keys), then a combine pass,
  // for calls of at most kCudaSplitKeysMaxRows rows (decode); larger calls use kPerHead. The same
  // probabilities and outputs up to rounding.
  kSplitKeys,
};
// Rows up to which kSplitKeys takes the split path. At 8 rows the per-head kernel already runs
// 8 x heads blocks (256 for 32 heads, about 2 per SM of an H200); beyond that its grid fills the
// GPU and the split path's extra scratch traffic and second launch stop paying.
inline constexpr int kCudaSplitKeysMaxRows = 8;

// Which GEMM runs calls of at most kCudaWarpRowsMaxRows rows (decode; docs/ENGINE.md).
enum class CudaGemm {
  // cuBLAS (cublasGemmEx) for every call.
  kCublas,
  // kvtier's warp-per-row kernel: one warp per output feature streaming its weight row in
  // 16-byte loads. Larger calls, and operands it does not take, stay with cuBLAS.
  kWarpRows,
};
// Rows up to which kWarpRows takes the warp-per-row kernel. On an H200 a 7B decode step's GEMMs
// streamed their weights at 0.77 and 0.76 of the HBM peak with it at 1 and 2 rows against
// cuBLAS's 0.74, and at 0.55 and 0.34 at 4 and 8 rows against 0.73 (bench/RESULTS.md). The
// kernel itself takes up to 8 (impl/cuda_kernels.cuh kWarpRowsMaxRows).
inline constexpr int kCudaWarpRowsMaxRows = 2;

// Whether decode steps are replayed from a CUDA graph (docs/ENGINE.md, "Decode graphs").
enum class CudaGraphs {
  // Every kernel launched from the host, every call.
  kOff,
  // A decode step (one token, not a prefill) with no observer and no device KV store is
  // captured into a graph and replayed, its token and position read from device memory. A
  // graph serves positions up to a power of two (at least 256) within the KV cache and is kept
  // while every buffer it uses stays where it was: captured again when the position passes
  // that bound or a buffer is reallocated (the cache grows geometrically), O(log n) times in
  // a decode. Other calls launch as kOff. The same kernels as kOff, the split path's grid sized
  // for the graph's bound (its extra chunks return at once); cuBLAS runs with a workspace of
  // its own, so its results may differ from kOff's by rounding.
  kDecode,
};

// Whether two kernels of every layer are folded into their neighbours (docs/ENGINE.md, "Fused
// and early-launched decode kernels").
enum class CudaFusion {
  kOff,
  // The gate/up projection applies SwiGLU as it writes, where the warp-rows GEMM runs it
  // (kWarpRows, calls of at most kCudaWarpRowsMaxRows rows), and the split-key path's chunks
  // are combined by each (row, head)'s last chunk block instead of a second kernel. The results,
  // observations included, are bit for bit kOff's.
  kOn,
};

// Whether a forward pass's kernels may start before the previous one ends (docs/ENGINE.md).
enum class CudaEarlyLaunch {
  kOff,
  // Passes with no observer and no device KV store (decode graphs' steps among them) launch
  // each kernel after the embedding as a programmatic dependent of the one before: its blocks
  // are scheduled while that one's last blocks run, a warp-rows GEMM asks L2 for its weight
  // rows, and each waits for the previous kernel before it touches anything else. The results
  // are bit for bit kOff's. Needs compute capability 9.0 (ConfigError on an older device).
  kProgrammatic,
};

struct CudaEngineOptions {
  int device = 0;  // CUDA device index
  CudaComputeDtype dtype = CudaComputeDtype::kBF16;
  ObserverRows observer_rows = ObserverRows::kPerHead;
  ObserverDelivery observer_delivery = ObserverDelivery::kAsynchronous;
  // The split path by default: on an H200 it passed the GPU tests and decoded a 7B shape 1.7x
  // (512-token context) to 2.9x (1,024-1,536) faster (docs/ENGINE.md, bench/RESULTS.md).
  CudaAttention attention = CudaAttention::kSplitKeys;
  // The warp-per-row kernel and decode graphs by default: on an H200 they passed the gpu tests,
  // and together decoded a 7B shape at 0.61 of the HBM roofline against 0.55 with cuBLAS and
  // launched steps (docs/ENGINE.md, bench/RESULTS.md).
  CudaGemm gemm = CudaGemm::kWarpRows;
  CudaGraphs graphs = CudaGraphs::kDecode;
  // Off until measured on a GPU (bench/cuda_decode.cpp's `fused` and `early` variants).
  CudaFusion fusion = CudaFusion::kOff;
  CudaEarlyLaunch early_launch = CudaEarlyLaunch::kOff;
  // Pinned host memory the observed rows are staged in; a larger ring lets the observer fall
  // further behind before decoding waits for it. Grown when one layer's rows need more.
  std::size_t observer_ring_bytes = std::size_t{256} << 20U;
};

[[nodiscard]] std::string_view cuda_compute_dtype_name(CudaComputeDtype dtype);
// "per-head" or "split-keys", as `--cuda-attention` spells them.
[[nodiscard]] constexpr std::string_view cuda_attention_name(CudaAttention attention) {
  return attention == CudaAttention::kSplitKeys ? "split-keys" : "per-head";
}

// "cublas" or "warp-rows", as `--cuda-gemm` spells them.
[[nodiscard]] constexpr std::string_view cuda_gemm_name(CudaGemm gemm) {
  return gemm == CudaGemm::kWarpRows ? "warp-rows" : "cublas";
}

// "off" or "decode" (the decode benchmark's `graphs` field).
[[nodiscard]] constexpr std::string_view cuda_graphs_name(CudaGraphs graphs) {
  return graphs == CudaGraphs::kDecode ? "decode" : "off";
}

// "off" or "on" (the decode benchmark's `fusion` field).
[[nodiscard]] constexpr std::string_view cuda_fusion_name(CudaFusion fusion) {
  return fusion == CudaFusion::kOn ? "on" : "off";
}

// "off" or "programmatic" (the decode benchmark's `early_launch` field).
[[nodiscard]] constexpr std::string_view cuda_early_launch_name(CudaEarlyLaunch early) {
  return early == CudaEarlyLaunch::kProgrammatic ? "programmatic" : "off";
}

// Uploads `weights` to the device and returns an engine (backend() "cuda"). Throws ConfigError
// when this build has no CUDA targets, no usable CUDA device is present, `options.device` does
// not exist or CudaEarlyLaunch::kProgrammatic is asked of a device older than compute
// capability 9.0; DataError for a model the engine cannot run (as the CPU engine); kvtier::Error
// (exit 1) naming the CUDA or cuBLAS call that failed, e.g. cudaMalloc when the model does not fit.
// The options `engine` was made with; ConfigError when it is not a CUDA engine.
[[nodiscard]] CudaEngineOptions cuda_engine_options(const Engine& engine);
// Device bytes of its weight matrices and embeddings; ConfigError when it is not a CUDA engine.
[[nodiscard]] std::uint64_t cuda_engine_weight_bytes(const Engine& engine);
// Decode steps of a CudaGraphs::kDecode engine since it was made: graphs captured, and steps
// run from a graph (each step of a capture included); ConfigError when it is not a CUDA engine.
struct CudaGraphCounts {
  std::uint64_t captures = 0;
  std::uint64_t replays = 0;
};
[[nodiscard]] CudaGraphCounts cuda_engine_graph_counts(const Engine& engine);

[[nodiscard]] std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const ModelWeights> weights,
                                                       CudaEngineOptions options = {});

}  // namespace kvtier::kernels
