#pragma once
// How a policy stores a T2 (compressed) token, so that its bytes follow for any model shape: the
// codes of every K and V element plus the quantisation scales of each K and each V vector of one
// KV head (head_dim elements). The scales are counted per head vector, not per a number of
// elements, because the live cache's quantisation group is the head vector (one float32
// absmax / 127 scale per KV head for K and for V, kernels/tiered_cache.hpp): a replay over one
// model's trace is simulated on models with other head_dims, and only a per-head count carries
// over unchanged.

#include <cstdint>

namespace kvtier::replay {

struct CompressedFormat {
  // Bits of the code of one K or V element, scales excluded.
  double code_bits = 0.0;
  // Bytes of scales of one K or one V vector of one KV head (0: none stored, or folded into
  // code_bits as an average).
  std::uint32_t scale_bytes_per_head_vector = 0;

  // One token of one layer: K and V of `kv_heads` heads of `head_dim` elements each. kv_heads
  // may be a share of a tensor-parallel GPU (heads / TP).
  [[nodiscard]] double token_layer_bytes(double kv_heads, double head_dim) const noexcept {
    return vectors_bytes(2.0 * kv_heads, head_dim);
  }
  // `count` vectors of `width` values each (a latent attention's one latent per token-layer).
  [[nodiscard]] double vectors_bytes(double count, double width) const noexcept {
    return count * (width * code_bits / 8.0 + scale_bytes_per_head_vector);
  }

  friend bool operator==(const CompressedFormat&, const CompressedFormat&) = default;
};

// int8 codes and one float32 scale per head vector: the tiered hierarchy's 8-bit T2, as the
// live cache stores it (stories260K: 64 + 32 = 96 bytes per token-layer).
inline constexpr CompressedFormat kInt8HeadScaled{8.0, 4};

}  // namespace kvtier::replay
