#pragma once
// The model engine interface, implemented by the CPU reference (Eigen, float32) and the CUDA
// engine (kernels/cuda_engine.hpp), which is tested against its CPU twin.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "configs/schema/model.pb.h"
#include "kernels/forward_observer.hpp"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

// --- External KV store (the live tiered cache, kernels/tiered_cache.hpp) ---------------------
// A layer's keys and values as attention reads them when a KeyValueStore is attached.
struct LayerKeyValues {
  // Per KV head: [positions][head_dim] keys and values of positions 0 .. positions - 1,
  // contiguous; valid until the next call into the store.
  std::span<const float* const> keys;
  std::span<const float* const> values;
  // Per position: 0 for a token attention must skip (evicted: left out of the softmax, which
  // renormalises over the rest), non-zero otherwise. Empty: every position is read.
  std::span<const std::uint8_t> readable;
};

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  KeyValueStore() = default;
  KeyValueStore(const KeyValueStore&) = delete;
  KeyValueStore& operator=(const KeyValueStore&) = delete;
  KeyValueStore(KeyValueStore&&) = delete;
  KeyValueStore& operator=(KeyValueStore&&) = delete;

  // The key and value one position wrote into one layer (after k-norm and RoPE), in position
  // order; the spans are valid during the call only.
  virtual void store(const KeyValueWrite& write) = 0;
  // Called once per layer and forward call, after that call's positions were stored and before
  // the layer's attention: positions 0 .. positions - 1 as attention must read them.
  virtual LayerKeyValues load(int layer, int positions) = 0;
};

// The same on a device (the live tiered cache's CUDA backend, kernels/cuda_tiered_cache.hpp): the
// store owns the device memory keys and values live in, and the CUDA engine's kernels write and
// read it through a page table. Plain C++: device pointers are void*, a CUDA stream is passed as
// void*.
//
// A slot holds one token of one layer in the engine's compute dtype: the keys of every KV head,
// then their values ([2][kv_heads * head_dim]). A page-table entry e of a position says where:
// e >= 0 is slot e of `t0`; e <= -2 is slot -(e + 2) of `staging`; -1 is a position attention
// skips (evicted).
struct DeviceLayerSlots {
  void* t0 = nullptr;
  const void* staging = nullptr;
  const std::int32_t* page_table = nullptr;  // device, one entry per position
};

class DeviceKeyValueStore {
 public:
  virtual ~DeviceKeyValueStore() = default;
  DeviceKeyValueStore() = default;
  DeviceKeyValueStore(const DeviceKeyValueStore&) = delete;
  DeviceKeyValueStore& operator=(const DeviceKeyValueStore&) = delete;
  DeviceKeyValueStore(DeviceKeyValueStore&&) = delete;
  DeviceKeyValueStore& operator=(DeviceKeyValueStore&&) = delete;

  // At the start of a forward call of `rows` tokens from `first_position`, before the engine
  // enqueues anything on `stream`: the store takes the rows into T0 in every layer (their page
  // entries are T0 slots) and starts staging what attention reads. The previous forward call's
  // work on `stream` has completed by then (the engine synchronises the stream before a call
  // returns): between calls the store may rewrite its host-side page tables, reuse staging
  // regions and move slots without waiting for the engine's kernels.
  virtual void begin_forward(int first_position, int rows, void* stream) = 0;
  // Before the layer's first kernel: its slots and page table over positions 0 .. first_position
  // + rows - 1; work enqueued on `stream` after this call sees them staged.
  virtual DeviceLayerSlots layer(int layer, void* stream) = 0;
  // After the layer's attention kernels were enqueued on `stream`.
  virtual void end_layer(int layer, void* stream) = 0;
};
// ------------------------------------------------------------------------------------------------

class Engine {
 public:
  virtual ~Engine() = default;
  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) = delete;
  Engine& operator=(Engine&&) = delete;

  [[nodiscard]] virtual const config::ModelSpec& spec() const = 0;
  [[nodiscard]] virtual std::string_view backend() const = 0;  // "cpu", later "cuda"
  // Tokens in the KV cache; the next token runs at this position.
  [[nodiscard]] virtual int position() const = 0;

  // Runs `tokens` at positions position()... together (matrix products over all of them) and
  // returns the logits that follow the last one, valid until the next call. Throws DataError when
  // a token is outside the vocabulary or the positions pass max_position_embeddings.
  virtual std::span<const float> prefill(std::span<const std::int32_t> tokens) = 0;
  // One decode step: the logits after `token`.
  virtual std::span<const float> decode(std::int32_t token) = 0;

  // Empties the KV cache (position 0); keeps the observer.
  virtual void reset() = 0;
  // Sizes the KV cache for `positions` tokens up front, so that a long run does not regrow it.
  virtual void reserve(int positions) = 0;
  // Every attention computed from now on is shown to `observer` (not owned); nullptr detaches.
  virtual void set_observer(ForwardObserver* observer) = 0;
  // Keys and values go to `store` (not owned) instead of the engine's own cache, and attention
  // reads them back from it; nullptr returns to the engine's cache. Call between runs, after
  // reset(). Engines without support refuse (ConfigError).
  virtual void set_kv_store(KeyValueStore* store) {
    if (store != nullptr) {
      throw ConfigError("the " + std::string(backend()) +
                        " engine cannot run with an external KV store (the live tiered cache)");
    }
  }
  // The same for a device-side store (the CUDA engine).
  virtual void set_device_kv_store(DeviceKeyValueStore* store) {
    if (store != nullptr) {
      throw ConfigError("the " + std::string(backend()) +
                        " engine cannot run with a device-side KV store (the live tiered cache's "
                        "CUDA backend)");
    }
  }
};

struct CpuEngineOptions {
  // Threads that run the products and attention heads, the caller's included (at least 1).
  // Work is cut by the model's shape, not by this count, so results do not depend on it.
  int threads = 1;
};

// The CPU reference engine: float32, deterministic whatever the thread count.
[[nodiscard]] std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ModelWeights> weights,
                                                      const CpuEngineOptions& options = {});

}  // namespace kvtier::kernels
