// The CUDA engine (kernels/cuda_engine.hpp, docs/ENGINE.md "The CUDA engine").
//
// Host code in C++20: it implements the Engine interface, whose std::span nvcc cannot compile in
// the C++17 the project's CUDA sources use; it drives the CUDA runtime and cuBLAS, and launches
// the device kernels of cuda_kernels.cu through their plain-C++ launchers.
//
// One forward pass, every token of the call together as in the CPU engine:
//   embedding → per layer: RMSNorm → fused Q/K/V GEMM → bias, q/k-norm, RoPE, KV store
//   (one kernel) → attention (probabilities kept) → O GEMM (+residual) → RMSNorm → fused
//   gate/up GEMM → SwiGLU → down GEMM (+residual) → final RMSNorm of the last row → LM head.
// GEMMs are cublasGemmEx in the compute dtype with float32 accumulation and float32 outputs (or,
// with CudaGemm::kWarpRows, calls of at most kCudaWarpRowsMaxRows rows run impl/cuda_gemv.cu).
// With an observer, what it is shown is copied out as the pass runs (impl/cuda_engine_observe.cpp).
// With CudaGraphs::kDecode, a decode step without observer or device store is replayed from a
// CUDA graph (impl/cuda_graph.hpp), its token and position read from device memory.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/impl/cuda_engine_impl.hpp"
#include "kernels/impl/cuda_linear.hpp"
#include "kernels/rotary.hpp"

namespace kvtier::kernels::detail {
namespace {

// Floats of attention probabilities a call keeps on the device at once without an observer
// (128 MiB); longer prompts run their attention in chunks of query rows.
constexpr std::int64_t kAttentionScratchFloats = std::int64_t{32} << 20U;
// Floats converted per upload step (64 MiB of float32 staging on the device).
constexpr std::int64_t kUploadStagingFloats = std::int64_t{16} << 20U;
constexpr int kMaxHeadDim = 1024;

void require_shape(const WeightTensor& weight, std::int64_t rows, std::int64_t cols,
                   const std::string& where) {
  if (!weight.present() || weight.rows * weight.cols != rows * cols) {
    throw DataError("weight '" + weight.name + "' has " + std::to_string(weight.rows) + " x " +
                        std::to_string(weight.cols) +
                        " values; the model's configuration implies " + std::to_string(rows) +
                        " x " + std::to_string(cols),
                    where);
  }
}

// Decode graphs serve positions up to a power of two, at least this one: short decodes
// capture once.
constexpr int kGraphMinPositions = 256;

// cuBLAS's workspace under graph capture, which must not allocate: NVIDIA's recommended size
// on Hopper (the cuBLAS documentation, cublasSetWorkspace).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20U;

// Replaces `memory` by at least `bytes` (at least twice its size: grown geometrically, as
// cudaFree synchronises) when it holds fewer.
void grow(DeviceMemory& memory, std::size_t bytes, const Checker& check) {
  if (bytes > memory.bytes()) {
    memory = DeviceMemory(std::max(bytes, 2 * memory.bytes()), check);
  }
}

}  // namespace

CudaEngine::CudaEngine(std::shared_ptr<const ModelWeights> weights,
                       const CudaEngineOptions& options)
    : weights_(std::move(weights)),
      spec_(weights_->spec),
      options_(options),
      device_(options.device),
      check_(options.device),
      dtype_(device_dtype(options.dtype)),
      hidden_(static_cast<int>(spec_.hidden_size())),
      heads_(static_cast<int>(spec_.num_attention_heads())),
      kv_heads_(static_cast<int>(spec_.num_key_value_heads())),
      head_dim_(static_cast<int>(spec_.head_dim())),
      q_width_(heads_ * head_dim_),
      kv_width_(kv_heads_ * head_dim_),
      qkv_width_(q_width_ + 2 * kv_width_),
      intermediate_(static_cast<int>(spec_.intermediate_size())),
      vocab_(static_cast<int>(spec_.vocab_size())),
      layers_count_(static_cast<int>(spec_.num_hidden_layers())),
      max_positions_(static_cast<int>(spec_.max_position_embeddings())),
      window_(spec_.has_sliding_window() ? static_cast<int>(spec_.sliding_window()) : 0),
      eps_(static_cast<float>(spec_.rms_norm_eps())),
      scale_(1.0F / std::sqrt(static_cast<float>(spec_.head_dim()))),
      tied_(weights_->lm_head.data == weights_->token_embedding.data),
      check_kernels_(std::getenv("KVTIER_CUDA_CHECK_KERNELS") != nullptr),
      stream_(check_, options.device),
      cublas_(check_, stream_.get()),
      events_(check_, false) {
  if (head_dim_ > kMaxHeadDim) {
    throw ConfigError("head_dim " + std::to_string(head_dim_) +
                          " is more than the CUDA engine supports (" + std::to_string(kMaxHeadDim) +
                          ")",
                      weights_->source);
  }
  if (static_cast<int>(weights_->layers.size()) != layers_count_) {
    throw DataError("the model has " + std::to_string(weights_->layers.size()) +
                        " layers of weights; num_hidden_layers is " + std::to_string(layers_count_),
                    weights_->source);
  }
  if (options_.early_launch == CudaEarlyLaunch::kProgrammatic) {
    int major = 0;
    check_(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
           "cudaDeviceGetAttribute");
    if (major < 9) {
      throw ConfigError(
          "early kernel launches (programmatic dependent launch) need compute "
          "capability 9.0 or later; CUDA device " +
          std::to_string(device_) + " is " + std::to_string(major) + ".x");
    }
    if (!cuda::early_launch_compiled()) {
      throw ConfigError(
          "early kernel launches need kernels compiled for compute capability 9.0 "
          "or later (CMAKE_CUDA_ARCHITECTURES 90 or above); this build runs older "
          "code on CUDA device " +
          std::to_string(device_));
    }
  }
  upload_weights();
  if (options_.fusion == CudaFusion::kOn) {
    split_arrivals_ = DeviceMemory(
        static_cast<std::size_t>(kCudaSplitKeysMaxRows) * heads_ * sizeof(std::uint32_t), check_);
    check_(cudaMemsetAsync(split_arrivals_.get(), 0, split_arrivals_.bytes(), stream_.get()),
           "cudaMemsetAsync (split-key arrivals)");
  }
  if (options_.graphs == CudaGraphs::kDecode) {
    cublas_workspace_ = DeviceMemory(kCublasWorkspaceBytes, check_);
    check_(cublasSetWorkspace(cublas_.get(), cublas_workspace_.get(), cublas_workspace_.bytes()),
           "cublasSetWorkspace");
    step_ = DeviceMemory(2 * sizeof(std::int32_t), check_);
    step_host_ = PinnedMemory(2 * sizeof(std::int32_t), check_);
  }
  logits_ = DeviceMemory(static_cast<std::size_t>(vocab_) * sizeof(float), check_);
  logits_host_ = PinnedMemory(static_cast<std::size_t>(vocab_) * sizeof(float), check_);
  check_(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (weight upload)");
  const int device = device_;
  const Checker check = check_;
  delivery_ = std::make_unique<detail::DeliveryQueue>(
      options_.observer_delivery == ObserverDelivery::kAsynchronous,
      [device, check] { check(cudaSetDevice(device), "cudaSetDevice (delivery thread)"); });
}

CudaEngine::~CudaEngine() {
  static_cast<void>(cudaSetDevice(device_));
  delivery_.reset();  // releases what is queued without calling the observer
  static_cast<void>(cudaStreamSynchronize(stream_.get()));
}

void CudaEngine::launched(cudaError_t status, const std::string& what) const {
  check_(status, what + " launch");
  if (check_kernels_) {
    check_(cudaStreamSynchronize(stream_.get()), what + " (KVTIER_CUDA_CHECK_KERNELS)");
  }
}

DeviceMemory CudaEngine::upload_vector(const WeightTensor& weight, std::int64_t size) {
  require_shape(weight, 1, size, weights_->source);
  DeviceMemory memory(static_cast<std::size_t>(size) * sizeof(float), check_);
  check_(cudaMemcpyAsync(memory.get(), weight.data, memory.bytes(), cudaMemcpyHostToDevice,
                         stream_.get()),
         "cudaMemcpyAsync (upload of " + weight.name + ")");
  return memory;
}

void CudaEngine::upload_matrix(const WeightTensor& weight, std::int64_t rows, std::int64_t cols,
                               void* destination, DeviceMemory& staging) {
  require_shape(weight, rows, cols, weights_->source);
  const std::int64_t count = rows * cols;
  if (dtype_ == Dtype::kF32) {
    check_(cudaMemcpyAsync(destination, weight.data, static_cast<std::size_t>(count) * 4,
                           cudaMemcpyHostToDevice, stream_.get()),
           "cudaMemcpyAsync (upload of " + weight.name + ")");
    return;
  }
  if (staging.get() == nullptr) {
    staging = DeviceMemory(static_cast<std::size_t>(kUploadStagingFloats) * 4, check_);
  }
  // Through the float32 staging buffer, converted on the device (round to nearest even). Stream
  // order keeps each piece's copy, conversion and the next copy apart.
  for (std::int64_t done = 0; done < count; done += kUploadStagingFloats) {
    const std::int64_t piece = std::min(kUploadStagingFloats, count - done);
    check_(cudaMemcpyAsync(staging.get(), weight.data + done, static_cast<std::size_t>(piece) * 4,
                           cudaMemcpyHostToDevice, stream_.get()),
           "cudaMemcpyAsync (upload of " + weight.name + ")");
    launched(cuda::launch_convert(staging.floats(), static_cast<std::byte*>(destination) + done * 2,
                                  dtype_, piece, stream_.get()),
             "convert kernel (" + weight.name + ")");
  }
}

void CudaEngine::upload_weights() {
  const std::size_t element = dtype_bytes(dtype_);
  const auto elements = [&](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * element;
  };
  // What the weights need, checked against what is free, so that a model too large for the
  // device fails with its size rather than with the cudaMalloc of some layer.
  const std::size_t per_layer = elements(qkv_width_, hidden_) + elements(hidden_, q_width_) +
                                elements(2 * std::int64_t{intermediate_}, hidden_) +
                                elements(hidden_, intermediate_);
  const std::size_t needed = per_layer * static_cast<std::size_t>(layers_count_) +
                             elements(vocab_, hidden_) * (tied_ ? 1 : 2);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  check_(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (needed > free_bytes) {
    throw Error("the model's weights need " + size_text(static_cast<double>(needed)) + " in " +
                    std::string(cuda_compute_dtype_name(options_.dtype)) + "; the device has " +
                    size_text(static_cast<double>(free_bytes)) + " free of " +
                    size_text(static_cast<double>(total_bytes)),
                check_.where(), ExitCode::kRuntimeFailure);
  }

  weight_bytes_ = needed;
  DeviceMemory staging;
  embedding_ = DeviceMemory(elements(vocab_, hidden_), check_);
  upload_matrix(weights_->token_embedding, vocab_, hidden_, embedding_.get(), staging);
  if (!tied_) {
    lm_head_ = DeviceMemory(elements(vocab_, hidden_), check_);
    upload_matrix(weights_->lm_head, vocab_, hidden_, lm_head_.get(), staging);
  }
  final_norm_ = upload_vector(weights_->final_norm, hidden_);
  const RotaryEmbedding rotary(spec_, weights_->rope_layout);
  const std::span<const float> frequencies = rotary.inverse_frequencies();
  inverse_frequency_ = DeviceMemory(frequencies.size_bytes(), check_);
  check_(cudaMemcpyAsync(inverse_frequency_.get(), frequencies.data(), frequencies.size_bytes(),
                         cudaMemcpyHostToDevice, stream_.get()),
         "cudaMemcpyAsync (rotary frequencies)");
  // The pageable source of the frequencies dies with `rotary`: wait for that copy.
  check_(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");

  layers_.resize(static_cast<std::size_t>(layers_count_));
  for (int index = 0; index < layers_count_; ++index) {
    const LayerWeights& w = weights_->layers[static_cast<std::size_t>(index)];
    Layer& layer = layers_[static_cast<std::size_t>(index)];
    layer.attention_norm = upload_vector(w.attention_norm, hidden_);
    layer.mlp_norm = upload_vector(w.mlp_norm, hidden_);
    auto* qkv = static_cast<std::byte*>(
        (layer.qkv = DeviceMemory(elements(qkv_width_, hidden_), check_)).get());
    upload_matrix(w.wq, q_width_, hidden_, qkv, staging);
    upload_matrix(w.wk, kv_width_, hidden_, qkv + elements(q_width_, hidden_), staging);
    upload_matrix(w.wv, kv_width_, hidden_, qkv + elements(q_width_ + kv_width_, hidden_), staging);
    layer.wo = DeviceMemory(elements(hidden_, q_width_), check_);
    upload_matrix(w.wo, hidden_, q_width_, layer.wo.get(), staging);
    auto* gate_up = static_cast<std::byte*>(
        (layer.gate_up = DeviceMemory(elements(2 * std::int64_t{intermediate_}, hidden_), check_))
            .get());
    upload_matrix(w.w_gate, intermediate_, hidden_, gate_up, staging);
    upload_matrix(w.w_up, intermediate_, hidden_, gate_up + elements(intermediate_, hidden_),
                  staging);
    layer.down = DeviceMemory(elements(hidden_, intermediate_), check_);
    upload_matrix(w.w_down, hidden_, intermediate_, layer.down.get(), staging);
    if (w.q_bias.present()) {
      require_shape(w.k_bias, 1, kv_width_, weights_->source);
      require_shape(w.v_bias, 1, kv_width_, weights_->source);
      require_shape(w.q_bias, 1, q_width_, weights_->source);
      layer.qkv_bias = DeviceMemory(static_cast<std::size_t>(qkv_width_) * 4, check_);
      float* bias = layer.qkv_bias.floats();
      const auto copy = [&](const WeightTensor& part, int offset, int size) {
        check_(cudaMemcpyAsync(bias + offset, part.data, static_cast<std::size_t>(size) * 4,
                               cudaMemcpyHostToDevice, stream_.get()),
               "cudaMemcpyAsync (upload of " + part.name + ")");
      };
      copy(w.q_bias, 0, q_width_);
      copy(w.k_bias, q_width_, kv_width_);
      copy(w.v_bias, q_width_ + kv_width_, kv_width_);
    }
    if (w.q_norm.present()) {
      layer.q_norm = upload_vector(w.q_norm, head_dim_);
      layer.k_norm = upload_vector(w.k_norm, head_dim_);
    }
  }
  // The staging buffer is freed on return; the copies and conversions that read it must be done.
  check_(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (weight upload)");
}

void CudaEngine::reset() {
  select_device();
  position_ = 0;
  delivery_->flush();
}

void CudaEngine::reserve(int positions) {
  select_device();
  ensure_cache(std::min(positions, max_positions_));
}

void CudaEngine::ensure_cache(int positions) {
  if (positions <= capacity_) {
    return;
  }
  // Grow geometrically so a long decode reallocates O(log n) times, as the CPU engine.
  const int capacity = std::min(max_positions_, std::max(positions, 2 * capacity_));
  const std::size_t bytes = static_cast<std::size_t>(capacity) *
                            static_cast<std::size_t>(kv_width_) * dtype_bytes(dtype_);
  const std::size_t used = static_cast<std::size_t>(position_) *
                           static_cast<std::size_t>(kv_width_) * dtype_bytes(dtype_);
  for (Layer& layer : layers_) {
    DeviceMemory keys(bytes, check_);
    DeviceMemory values(bytes, check_);
    if (used > 0) {
      check_(cudaMemcpyAsync(keys.get(), layer.keys.get(), used, cudaMemcpyDeviceToDevice,
                             stream_.get()),
             "cudaMemcpyAsync (KV cache growth)");
      check_(cudaMemcpyAsync(values.get(), layer.values.get(), used, cudaMemcpyDeviceToDevice,
                             stream_.get()),
             "cudaMemcpyAsync (KV cache growth)");
      // The old buffers are freed when replaced: the copies must have read them.
      check_(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (KV cache growth)");
    }
    layer.keys = std::move(keys);
    layer.values = std::move(values);
  }
  capacity_ = capacity;
}

void CudaEngine::ensure_rows(int rows) {
  if (rows <= row_capacity_) {
    return;
  }
  // Called at the start of a call, when the stream is idle, so old buffers can go at once.
  const auto size = static_cast<std::size_t>(rows);
  const std::size_t element = dtype_bytes(dtype_);
  tokens_ = DeviceMemory(size * sizeof(std::int32_t), check_);
  x_ = DeviceMemory(size * static_cast<std::size_t>(hidden_) * 4, check_);
  normed_ = DeviceMemory(size * static_cast<std::size_t>(hidden_) * element, check_);
  qkv_ = DeviceMemory(size * static_cast<std::size_t>(qkv_width_) * 4, check_);
  attention_out_ = DeviceMemory(size * static_cast<std::size_t>(q_width_) * element, check_);
  gate_up_ = DeviceMemory(size * 2 * static_cast<std::size_t>(intermediate_) * 4, check_);
  activation_ = DeviceMemory(size * static_cast<std::size_t>(intermediate_) * element, check_);
  tokens_host_ = PinnedMemory(size * sizeof(std::int32_t), check_);
  row_capacity_ = rows;
}

std::vector<Chunk> CudaEngine::plan_chunks(int rows, bool observed) const {
  // Probabilities (and, observed, the queries) of a chunk fit the scratch budget, or with an
  // observer a quarter of the ring, so that several records can be in flight.
  const std::int64_t budget =
      observed ? std::max<std::int64_t>(1, static_cast<std::int64_t>(ring_.capacity() / 16))
               : kAttentionScratchFloats;
  std::vector<Chunk> chunks;
  Chunk chunk;
  for (int row = 0; row < rows; ++row) {
    const std::int64_t keys = cuda::key_count(position_ + row, window_);
    const std::int64_t floats =
        static_cast<std::int64_t>(heads_) * (chunk.keys + keys) +
        (observed ? static_cast<std::int64_t>(chunk.rows + 1) * q_width_ : 0);
    if (chunk.rows > 0 && floats > budget) {
      chunks.push_back(chunk);
      chunk = Chunk{row, 0, 0};
    }
    ++chunk.rows;
    chunk.keys += keys;
  }
  chunks.push_back(chunk);
  return chunks;
}

void CudaEngine::gemm(const void* weight, int out_features, int in_features, const void* input,
                      int rows, float* output, bool accumulate, const cuda::Launch& launch) {
  if (options_.gemm == CudaGemm::kWarpRows && rows <= kCudaWarpRowsMaxRows &&
      cuda::warp_rows_gemm_applies(dtype_, in_features, rows, weight, input)) {
    launched(cuda::launch_warp_rows_gemm(weight, dtype_, out_features, in_features, input, rows,
                                         output, accumulate, launch),
             "warp-rows gemm kernel");
    return;
  }
  check_(cuda::cublas_linear(cublas_.get(), dtype_, weight, out_features, in_features, input, rows,
                             output, accumulate),
         "cublasGemmEx");
  if (check_kernels_) {
    launched(cudaSuccess, "cublasGemmEx");
  }
}

void CudaEngine::gate_up_swiglu(const Layer& layer, int rows, const cuda::Launch& launch) {
  if (options_.fusion == CudaFusion::kOn && options_.gemm == CudaGemm::kWarpRows &&
      rows <= kCudaWarpRowsMaxRows &&
      cuda::warp_rows_gemm_applies(dtype_, hidden_, rows, layer.gate_up.get(), normed_.get())) {
    launched(cuda::launch_warp_rows_swiglu(layer.gate_up.get(), dtype_, intermediate_, hidden_,
                                           normed_.get(), rows, activation_.get(), launch),
             "warp-rows gate/up and swiglu kernel");
    return;
  }
  gemm(layer.gate_up.get(), 2 * intermediate_, hidden_, normed_.get(), rows, gate_up_.floats(),
       false, launch);
  launched(cuda::launch_swiglu(gate_up_.floats(), rows, intermediate_, activation_.get(), dtype_,
                               launch),
           "swiglu kernel");
}

static_assert(kCudaWarpRowsMaxRows <= cuda::kWarpRowsMaxRows,
              "the option's row limit is within the kernel's");

std::span<const float> CudaEngine::run(std::span<const std::int32_t> tokens, bool prefill) {
  select_device();
  report_observer_failure();
  check_forward_tokens(spec_, position_, tokens);
  try {
    return forward(tokens, prefill);
  } catch (...) {
    // Kernels enqueued before the failure may still run: the next call must not free or resize
    // what they use.
    static_cast<void>(cudaStreamSynchronize(stream_.get()));
    abandon_deliveries();
    throw;
  }
}

std::span<const float> CudaEngine::forward(std::span<const std::int32_t> tokens, bool prefill) {
  const int rows = static_cast<int>(tokens.size());
  ForwardObserver* observer = observer_;
  DeviceKeyValueStore* store = device_store_;
  // KVTIER_CUDA_CHECK_KERNELS waits after each launch, which a capture cannot.
  if (options_.graphs == CudaGraphs::kDecode && !prefill && rows == 1 && observer == nullptr &&
      store == nullptr && !check_kernels_) {
    return decode_graphed(tokens.front());
  }
  if (store == nullptr) {
    ensure_cache(position_ + rows);
  } else {
    store->begin_forward(position_, rows, stream_.get());
  }
  ensure_rows(rows);
  if (observer != nullptr) {
    ensure_ring(options_.observer_ring_bytes);
  }
  const std::vector<Chunk> chunks = plan_chunks(rows, observer != nullptr);
  std::int64_t most_keys = 0;
  for (const Chunk& chunk : chunks) {
    most_keys = std::max(most_keys, chunk.keys);
  }
  // Decode steps need one key more each time: grown geometrically.
  grow(probabilities_, static_cast<std::size_t>(most_keys) * heads_ * 4, check_);
  std::int64_t split_floats = 0;
  for (const Chunk& chunk : chunks) {
    if (splits_keys(chunk)) {
      split_floats = std::max(split_floats,
                              cuda::split_key_scratch_floats(chunk.rows, heads_, head_dim_,
                                                             position_ + chunk.first_row, window_));
    }
  }
  grow(split_scratch_, static_cast<std::size_t>(split_floats) * 4, check_);
  const std::size_t gathered_bytes = gathered_step_bytes(observer, rows, prefill, chunks);
  if (options_.observer_rows == ObserverRows::kHeadMean && observer != nullptr &&
      gathered_bytes == 0) {
    grow(mean_, static_cast<std::size_t>(most_keys) * 4, check_);
  }
  grow(observed_, gathered_bytes, check_);
  std::memcpy(tokens_host_.get(), tokens.data(), tokens.size_bytes());
  enqueue_forward(rows, chunks, prefill, observer, store,
                  {tokens_host_.get(), tokens.size_bytes(),
                   static_cast<std::int32_t*>(tokens_.get()), nullptr, position_},
                  gathered_bytes);
  return finish_forward(rows);
}

std::span<const float> CudaEngine::finish_forward(int rows) {
  check_(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize (forward pass)");
  position_ += rows;
  return {reinterpret_cast<const float*>(logits_host_.get()), static_cast<std::size_t>(vocab_)};
}

std::span<const float> CudaEngine::decode_graphed(std::int32_t token) {
  ensure_cache(position_ + 1);
  ensure_rows(1);
  // The graph serves positions below `bound`: a power of two, so that the split path's grid,
  // sized for it, launches at most about twice the blocks a step needs, and a decode captures
  // O(log n) times.
  const int bound = std::min(
      capacity_, std::max(kGraphMinPositions,
                          static_cast<int>(std::bit_ceil(static_cast<unsigned>(position_ + 1)))));
  const int last = bound - 1;
  const Chunk chunk{0, 1, cuda::key_count(last, window_)};
  grow(probabilities_, static_cast<std::size_t>(chunk.keys) * heads_ * 4, check_);
  if (splits_keys(chunk)) {
    grow(split_scratch_,
         static_cast<std::size_t>(
             cuda::split_key_scratch_floats(1, heads_, head_dim_, last, window_)) *
             4,
         check_);
  }
  cuda::StreamGraph::Key key = graph_key(bound);
  if (!graph_.holds(key)) {
    const ForwardInputs inputs{step_host_.get(), step_host_.bytes(),
                               static_cast<std::int32_t*>(step_.get()),
                               static_cast<const int*>(step_.get()) + 1, last};
    graph_.capture(stream_.get(), check_, std::move(key),
                   [&] { enqueue_forward(1, {chunk}, false, nullptr, nullptr, inputs, 0); });
    ++graph_counts_.captures;
  }
  // The previous replay has finished (finish_forward): its inputs can be overwritten.
  auto* step = reinterpret_cast<std::int32_t*>(step_host_.get());
  step[0] = token;
  step[1] = position_;
  graph_.launch(stream_.get(), check_);
  ++graph_counts_.replays;
  return finish_forward(1);
}

cuda::StreamGraph::Key CudaEngine::graph_key(int bound) const {
  const auto address = [](const auto& memory) {
    return reinterpret_cast<std::uintptr_t>(memory.get());
  };
  cuda::StreamGraph::Key key{static_cast<std::uintptr_t>(bound),
                             address(probabilities_),
                             address(split_scratch_),
                             address(x_),
                             address(normed_),
                             address(qkv_),
                             address(attention_out_),
                             address(gate_up_),
                             address(activation_),
                             address(logits_),
                             address(logits_host_),
                             address(step_),
                             address(step_host_)};
  for (const Layer& layer : layers_) {
    key.push_back(address(layer.keys));
    key.push_back(address(layer.values));
  }
  return key;
}

void CudaEngine::enqueue_forward(int rows, const std::vector<Chunk>& chunks, bool prefill,
                                 ForwardObserver* observer, DeviceKeyValueStore* store,
                                 const ForwardInputs& inputs, std::size_t gathered_step_bytes) {
  cudaStream_t stream = stream_.get();
  // The embedding follows a copy, not a kernel: launched plainly, as any kernel of a pass whose
  // observer or store synchronises with other streams.
  const cuda::Launch launch(stream, options_.early_launch == CudaEarlyLaunch::kProgrammatic &&
                                        observer == nullptr && store == nullptr);
  const bool gathered = gathered_step_bytes > 0;
  const std::size_t element = dtype_bytes(dtype_);
  check_(cudaMemcpyAsync(inputs.tokens, inputs.host, inputs.host_bytes, cudaMemcpyHostToDevice,
                         stream),
         "cudaMemcpyAsync (tokens)");
  launched(cuda::launch_embedding(embedding_.get(), dtype_, inputs.tokens, rows, hidden_,
                                  x_.floats(), stream),
           "embedding kernel");
  for (int index = 0; index < layers_count_; ++index) {
    Layer& layer = layers_[static_cast<std::size_t>(index)];
    const DeviceLayerSlots slots =
        store != nullptr ? store->layer(index, stream) : DeviceLayerSlots{};
    launched(cuda::launch_rms_norm(x_.floats(), layer.attention_norm.floats(), rows, hidden_, eps_,
                                   normed_.get(), dtype_, launch),
             "rms_norm kernel");
    gemm(layer.qkv.get(), qkv_width_, hidden_, normed_.get(), rows, qkv_.floats(), false, launch);
    cuda::QkvEpilogue epilogue;
    epilogue.qkv = qkv_.floats();
    epilogue.row_stride = qkv_width_;
    epilogue.rows = rows;
    epilogue.heads = heads_;
    epilogue.kv_heads = kv_heads_;
    epilogue.head_dim = head_dim_;
    epilogue.first_position = inputs.first_position;
    epilogue.position_at = inputs.position_at;
    epilogue.bias = layer.qkv_bias.floats();
    epilogue.q_gain = layer.q_norm.floats();
    epilogue.k_gain = layer.k_norm.floats();
    epilogue.eps = eps_;
    epilogue.inverse_frequency = inverse_frequency_.floats();
    epilogue.interleaved_pairs = weights_->rope_layout == RopeLayout::kInterleavedPairs;
    epilogue.cache_keys = layer.keys.get();
    epilogue.cache_values = layer.values.get();
    epilogue.page_table = slots.page_table;
    epilogue.slots = slots.t0;
    epilogue.dtype = dtype_;
    launched(cuda::launch_qkv_epilogue(epilogue, launch), "qkv epilogue kernel");
    if (observer != nullptr && !gathered) {
      observe_key_values(observer, index, rows);
    }
    for (const Chunk& chunk : chunks) {
      cuda::AttentionArgs attention;
      attention.queries = qkv_.floats() + static_cast<std::ptrdiff_t>(chunk.first_row) * qkv_width_;
      attention.query_stride = qkv_width_;
      attention.cache_keys = layer.keys.get();
      attention.cache_values = layer.values.get();
      attention.page_table = slots.page_table;
      attention.t0_slots = slots.t0;
      attention.staging_slots = slots.staging;
      attention.dtype = dtype_;
      attention.probabilities = probabilities_.floats();
      attention.out = static_cast<std::byte*>(attention_out_.get()) +
                      static_cast<std::size_t>(chunk.first_row) * q_width_ * element;
      attention.rows = chunk.rows;
      attention.heads = heads_;
      attention.kv_heads = kv_heads_;
      attention.head_dim = head_dim_;
      attention.first_position = inputs.first_position + chunk.first_row;
      attention.position_at = inputs.position_at;
      attention.window = window_;
      attention.scale = scale_;
      if (splits_keys(chunk)) {
        auto* arrivals = static_cast<std::uint32_t*>(split_arrivals_.get());  // null: unfused
        launched(
            cuda::launch_split_key_attention(attention, split_scratch_.floats(), arrivals, launch),
            "split-key attention kernels");
      } else {
        launched(cuda::launch_attention(attention, launch), "attention kernel");
      }
      if (gathered) {
        gather_observed_layer(index, chunk);
      } else if (observer != nullptr) {
        observe_attention(observer, index, chunk, prefill);
      }
    }
    if (store != nullptr) {
      store->end_layer(index, stream);
    }
    gemm(layer.wo.get(), hidden_, q_width_, attention_out_.get(), rows, x_.floats(), true, launch);
    launched(cuda::launch_rms_norm(x_.floats(), layer.mlp_norm.floats(), rows, hidden_, eps_,
                                   normed_.get(), dtype_, launch),
             "rms_norm kernel");
    gate_up_swiglu(layer, rows, launch);
    gemm(layer.down.get(), hidden_, intermediate_, activation_.get(), rows, x_.floats(), true,
         launch);
  }

  // Only the last token's logits are needed: normalise and project that row alone.
  launched(
      cuda::launch_rms_norm(x_.floats() + static_cast<std::ptrdiff_t>(rows - 1) * hidden_,
                            final_norm_.floats(), 1, hidden_, eps_, normed_.get(), dtype_, launch),
      "rms_norm kernel (final norm)");
  gemm(tied_ ? embedding_.get() : lm_head_.get(), vocab_, hidden_, normed_.get(), 1,
       logits_.floats(), false, launch);
  check_(cudaMemcpyAsync(logits_host_.get(), logits_.get(), static_cast<std::size_t>(vocab_) * 4,
                         cudaMemcpyDeviceToHost, stream),
         "cudaMemcpyAsync (logits)");
  if (gathered) {
    observe_gathered_step(observer, chunks.front(), gathered_step_bytes);
  }
}

}  // namespace kvtier::kernels::detail

namespace kvtier::kernels {

using detail::CudaEngine;

std::string_view cuda_compute_dtype_name(CudaComputeDtype dtype) {
  switch (dtype) {
    case CudaComputeDtype::kBF16: return "bf16";
    case CudaComputeDtype::kFP16: return "fp16";
    case CudaComputeDtype::kFP32: return "fp32";
  }
  return "unknown";
}

namespace {

// `engine` as the CUDA engine it must be; ConfigError when it is another.
const CudaEngine& as_cuda(const Engine& engine) {
  const auto* cuda = dynamic_cast<const CudaEngine*>(&engine);
  if (cuda == nullptr) {
    throw ConfigError("the " + std::string(engine.backend()) + " engine is not a CUDA engine");
  }
  return *cuda;
}

}  // namespace

CudaEngineOptions cuda_engine_options(const Engine& engine) {
  return as_cuda(engine).options();
}

std::uint64_t cuda_engine_weight_bytes(const Engine& engine) {
  return as_cuda(engine).weight_bytes();
}

CudaGraphCounts cuda_engine_graph_counts(const Engine& engine) {
  return as_cuda(engine).graph_counts();
}

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const ModelWeights> weights,
                                         CudaEngineOptions options) {
  if (!weights) {
    throw ConfigError("make_cuda_engine: no model weights");
  }
  check_engine_spec(weights->spec, weights->source);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw ConfigError(std::string("the CUDA engine is not available: no usable CUDA device (") +
                      (status != cudaSuccess ? cudaGetErrorString(status) : "none found") + ")");
  }
  if (options.device < 0 || options.device >= count) {
    throw ConfigError("CUDA device " + std::to_string(options.device) +
                      " does not exist: this machine has " + std::to_string(count) + " (0 .. " +
                      std::to_string(count - 1) + ")");
  }
  if (options.observer_ring_bytes < detail::StagingRing::kAlignment) {
    throw ConfigError("observer_ring_bytes must be at least " +
                      std::to_string(detail::StagingRing::kAlignment));
  }
  return std::make_unique<CudaEngine>(std::move(weights), options);
}

}  // namespace kvtier::kernels
