#pragma once
// The CUDA engine's class (kernels/cuda_engine.hpp), shared by its sources: impl/cuda_engine.cpp
// (weights, KV cache, forward passes, decode graphs) and impl/cuda_engine_observe.cpp (what an
// observer is shown, through the pinned ring and the delivery thread). Host C++20.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda_engine.hpp"
#include "kernels/engine.hpp"
#include "kernels/impl/cuda_graph.hpp"
#include "kernels/impl/cuda_handles.hpp"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/observer_delivery.hpp"

namespace kvtier::kernels::detail {

using cuda::Checker;
using cuda::Cublas;
using cuda::device_dtype;
using cuda::DeviceMemory;
using cuda::Dtype;
using cuda::dtype_bytes;
using cuda::EventPool;
using cuda::PinnedMemory;
using cuda::size_text;
using cuda::Stream;

// A run of query rows whose attention is computed (and observed) together.
struct Chunk {
  int first_row = 0;
  int rows = 0;
  std::int64_t keys = 0;  // sum of the rows' key counts
};

// Where a forward pass's tokens and positions come from.
struct ForwardInputs {
  const void* host = nullptr;  // pinned: copied to `tokens` first
  std::size_t host_bytes = 0;
  std::int32_t* tokens = nullptr;  // device
  // Row 0's position in device memory (a graph's replay), or nullptr: first_position is it.
  const int* position_at = nullptr;
  // Row 0's position; with position_at, the largest it may be (it sizes launches).
  int first_position = 0;
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(std::shared_ptr<const ModelWeights> weights, const CudaEngineOptions& options);
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;
  CudaEngine(CudaEngine&&) = delete;
  CudaEngine& operator=(CudaEngine&&) = delete;
  ~CudaEngine() override;

  [[nodiscard]] const config::ModelSpec& spec() const override { return spec_; }
  [[nodiscard]] std::string_view backend() const override { return "cuda"; }
  [[nodiscard]] int position() const override { return position_; }

  std::span<const float> prefill(std::span<const std::int32_t> tokens) override {
    return run(tokens, true);
  }
  std::span<const float> decode(std::int32_t token) override { return run({&token, 1}, false); }
  void reset() override;
  void reserve(int positions) override;
  void set_observer(ForwardObserver* observer) override;
  void set_device_kv_store(DeviceKeyValueStore* store) override {
    select_device();
    device_store_ = store;
  }
  [[nodiscard]] const CudaEngineOptions& options() const { return options_; }
  [[nodiscard]] std::uint64_t weight_bytes() const { return weight_bytes_; }
  [[nodiscard]] CudaGraphCounts graph_counts() const { return graph_counts_; }

 private:
  struct Layer {
    DeviceMemory attention_norm;  // float32 [hidden]
    DeviceMemory qkv;             // [q_width + 2 kv_width, hidden]: wq, wk, wv
    DeviceMemory qkv_bias;        // float32 [qkv_width] (Qwen2) or empty
    DeviceMemory q_norm;          // float32 [head_dim] (Qwen3) or empty
    DeviceMemory k_norm;
    DeviceMemory wo;        // [hidden, q_width]
    DeviceMemory mlp_norm;  // float32 [hidden]
    DeviceMemory gate_up;   // [2 intermediate, hidden]: w_gate, w_up
    DeviceMemory down;      // [hidden, intermediate]
    DeviceMemory keys;      // KV cache [capacity][kv_width]
    DeviceMemory values;
  };

  void select_device() const { check_(cudaSetDevice(device_), "cudaSetDevice"); }
  // Checks a kernel launch (or cuBLAS call) named `what`; with KVTIER_CUDA_CHECK_KERNELS set in the
  // environment also waits for it, so that a fault is reported by the kernel that caused it
  // rather than by the next synchronisation (for diagnosis; slow).
  void launched(cudaError_t status, const std::string& what) const;
  void upload_weights();
  DeviceMemory upload_vector(const WeightTensor& weight, std::int64_t size);
  void upload_matrix(const WeightTensor& weight, std::int64_t rows, std::int64_t cols,
                     void* destination, DeviceMemory& staging);

  std::span<const float> run(std::span<const std::int32_t> tokens, bool prefill);
  std::span<const float> forward(std::span<const std::int32_t> tokens, bool prefill);
  // A decode step replayed from graph_ (CudaGraphs::kDecode), captured first when it is not
  // held for the buffers of this step.
  std::span<const float> decode_graphed(std::int32_t token);
  [[nodiscard]] cuda::StreamGraph::Key graph_key(int bound) const;
  // Everything of one forward pass from the token copy to the logits copy, on stream_.
  // `gathered_step_bytes`: the step's gathered observation (gathered_step_bytes()), 0 when the
  // observer, if any, takes per-layer records.
  void enqueue_forward(int rows, const std::vector<Chunk>& chunks, bool prefill,
                       ForwardObserver* observer, DeviceKeyValueStore* store,
                       const ForwardInputs& inputs, std::size_t gathered_step_bytes);
  [[nodiscard]] std::span<const float> finish_forward(int rows);
  void report_observer_failure();
  void abandon_deliveries() noexcept;
  void ensure_cache(int positions);
  void ensure_rows(int rows);
  [[nodiscard]] std::vector<Chunk> plan_chunks(int rows, bool observed) const;
  [[nodiscard]] bool splits_keys(const Chunk& chunk) const {
    return options_.attention == CudaAttention::kSplitKeys && chunk.rows <= kCudaSplitKeysMaxRows;
  }
  void ensure_ring(std::size_t bytes);

  void gemm(const void* weight, int out_features, int in_features, const void* input, int rows,
            float* output, bool accumulate, const cuda::Launch& launch);
  // The gate/up projection and SwiGLU of `rows` rows into activation_: one fused kernel
  // (CudaFusion::kOn, where the warp-rows GEMM takes the call) or the GEMM into gate_up_ and the
  // SwiGLU kernel.
  void gate_up_swiglu(const Layer& layer, int rows, const cuda::Launch& launch);
  void observe_key_values(ForwardObserver* observer, int layer, int rows);
  void observe_attention(ForwardObserver* observer, int layer, const Chunk& chunk, bool prefill);
  // The observer calls of keys and values staged at `host` ([keys of each row][values of each
  // row]) and of attention ([queries of each row][probabilities, packed]); delivery thread.
  void show_key_values(ForwardObserver* observer, int layer, int first_position, int count,
                       const float* host) const;
  void show_attention(ForwardObserver* observer, int layer, int first_position, int rows,
                      bool prefill, const float* host, std::size_t query_floats);
  // An observed decode step (one row, asynchronous delivery) gathers each layer's observation
  // on the device (cuda::ObservedLayer, into observed_) and copies the step's records to the
  // ring once, after its last kernel: one copy and one event a step instead of four copies and
  // two events a layer, each of which held up the next kernel.
  // (Steps whose records would take more than a quarter of the ring keep the per-layer copies.)
  // The bytes of the pass's gathered records; 0 when the pass gathers none.
  [[nodiscard]] std::size_t gathered_step_bytes(const ForwardObserver* observer, int rows,
                                                bool prefill, const std::vector<Chunk>& chunks);
  [[nodiscard]] cuda::ObservedLayer observed_layer(int layer, const Chunk& chunk);
  void gather_observed_layer(int layer, const Chunk& chunk);
  void observe_gathered_step(ForwardObserver* observer, const Chunk& chunk, std::size_t bytes);
  [[nodiscard]] std::byte* stage(std::size_t bytes, std::size_t& offset);
  void push_record(cudaEvent_t event, std::function<void()> deliver);

  std::shared_ptr<const ModelWeights> weights_;
  const config::ModelSpec& spec_;
  CudaEngineOptions options_;
  int device_;
  Checker check_;
  Dtype dtype_;
  int hidden_;
  int heads_;
  int kv_heads_;
  int head_dim_;
  int q_width_;    // heads * head_dim
  int kv_width_;   // kv_heads * head_dim
  int qkv_width_;  // q_width + 2 kv_width
  int intermediate_;
  int vocab_;
  int layers_count_;
  int max_positions_;
  int window_;
  float eps_;
  float scale_;
  bool tied_;
  bool check_kernels_;  // KVTIER_CUDA_CHECK_KERNELS

  std::uint64_t weight_bytes_ = 0;  // weight matrices and embeddings on the device
  ForwardObserver* observer_ = nullptr;
  DeviceKeyValueStore* device_store_ = nullptr;  // the live tiered cache, when attached
  int position_ = 0;
  int capacity_ = 0;  // KV cache positions
  int row_capacity_ = 0;

  // Declared in teardown order: the delivery queue (last) stops before anything it uses goes.
  Stream stream_;
  Cublas cublas_;
  DeviceMemory cublas_workspace_;  // set on cublas_ with decode graphs
  std::vector<Layer> layers_;
  DeviceMemory embedding_;
  DeviceMemory lm_head_;  // empty when tied to the embedding
  DeviceMemory final_norm_;
  DeviceMemory inverse_frequency_;
  // Scratch for the rows of one call.
  DeviceMemory tokens_;
  DeviceMemory x_;              // float32 [rows][hidden], the residual stream
  DeviceMemory normed_;         // [rows][hidden]
  DeviceMemory qkv_;            // float32 [rows][qkv_width]
  DeviceMemory attention_out_;  // [rows][q_width]
  DeviceMemory gate_up_;        // float32 [rows][2 intermediate]
  DeviceMemory activation_;     // [rows][intermediate]
  DeviceMemory probabilities_;  // float32, packed per head (cuda_kernels.cuh)
  DeviceMemory mean_;           // float32, packed head means
  DeviceMemory observed_;       // float32 records of an observed decode step's layers
  DeviceMemory split_scratch_;  // float32 chunk records of the split-key attention path
  // CudaFusion::kOn: the split path's arrival counters, one per (row, head) of a call of at
  // most kCudaSplitKeysMaxRows rows; zero between launches.
  DeviceMemory split_arrivals_;
  DeviceMemory logits_;  // float32 [vocab]
  PinnedMemory tokens_host_;
  PinnedMemory logits_host_;
  // Decode graphs: the replayed step's [token, position], written on the host before each
  // replay and copied by the graph's first node.
  PinnedMemory step_host_;
  DeviceMemory step_;
  cuda::StreamGraph graph_;
  CudaGraphCounts graph_counts_;
  EventPool events_;
  PinnedMemory ring_memory_;
  detail::StagingRing ring_{0};
  std::vector<float> broadcast_;  // the delivery thread's head-mean rows, one per head
  std::unique_ptr<detail::DeliveryQueue> delivery_;
};

}  // namespace kvtier::kernels::detail
