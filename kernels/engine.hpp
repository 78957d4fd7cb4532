#pragma once
// The model engine interface. The CPU reference (Eigen, float32) implements it now; a CUDA engine
// will implement the same interface and be tested against the CPU twin.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "configs/schema/model.pb.h"
#include "kernels/forward_observer.hpp"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

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
};

// The CPU reference engine: float32, single-threaded, deterministic.
[[nodiscard]] std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ModelWeights> weights);

}  // namespace kvtier::kernels
