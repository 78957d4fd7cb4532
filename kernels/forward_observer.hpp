#pragma once
// What the forward pass lets an observer see: the softmax attention probabilities it used, per
// layer, query position and query head, and the keys and values it cached. The attention tracer
// implements this interface; with no observer attached the engine skips every call (one pointer
// test per layer).

#include <cstdint>
#include <span>

namespace kvtier::kernels {

// One query position's attention in one layer, every query head at once.
struct AttentionStep {
  int layer = 0;
  int query_position = 0;
  bool prefill = false;  // part of a prompt (Engine::prefill) rather than a decode step
  // Keys [first_key_position, first_key_position + key_count): all earlier positions, or the
  // last `sliding_window` of them.
  int first_key_position = 0;
  int key_count = 0;
  int query_heads = 0;
  int kv_heads = 0;  // query head h reads KV head h / (query_heads / kv_heads)
  int head_dim = 0;
  std::span<const float> queries;        // [query_heads * head_dim], after q-norm and RoPE
  std::span<const float> probabilities;  // [query_heads * key_count]; each head's row sums to 1

  [[nodiscard]] std::span<const float> head_probabilities(int head) const {
    return probabilities.subspan(static_cast<std::size_t>(head) * key_count,
                                 static_cast<std::size_t>(key_count));
  }
};

// The key and value one position wrote into one layer's cache.
struct KeyValueWrite {
  int layer = 0;
  int position = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::span<const float> keys;    // [kv_heads * head_dim], after k-norm and RoPE, as cached
  std::span<const float> values;  // [kv_heads * head_dim]
};

class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  ForwardObserver() = default;
  ForwardObserver(const ForwardObserver&) = default;
  ForwardObserver& operator=(const ForwardObserver&) = default;
  ForwardObserver(ForwardObserver&&) = default;
  ForwardObserver& operator=(ForwardObserver&&) = default;

  // Called for each layer and position before that position's attention runs.
  virtual void on_key_value(const KeyValueWrite& write) { static_cast<void>(write); }
  // Called for each layer and query position once its softmax is computed. The spans are valid
  // only during the call.
  virtual void on_attention(const AttentionStep& step) = 0;
};

}  // namespace kvtier::kernels
