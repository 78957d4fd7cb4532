#pragma once
// The built-in policies, one description (name, parameters, factory) each; the registry
// (replay/registry.hpp) lists them. docs/REPLAY.md gives each policy's rule and sources.

#include <cstdint>
#include <span>
#include <vector>

#include "replay/registry.hpp"

namespace kvtier::replay {

[[nodiscard]] PolicyInfo full_policy_info();
[[nodiscard]] PolicyInfo tiered_policy_info();
[[nodiscard]] PolicyInfo streaming_policy_info();
[[nodiscard]] PolicyInfo h2o_policy_info();
[[nodiscard]] PolicyInfo tova_policy_info();
[[nodiscard]] PolicyInfo oracle_policy_info();
[[nodiscard]] PolicyInfo monarch_policy_info();
[[nodiscard]] PolicyInfo dms_policy_info();
[[nodiscard]] PolicyInfo snapkv_policy_info();
[[nodiscard]] PolicyInfo pyramidkv_policy_info();
[[nodiscard]] PolicyInfo adakv_policy_info();
[[nodiscard]] PolicyInfo knorm_policy_info();

// The selection rules of the prefill-time policies (SnapKV, PyramidKV, AdaKV), as plain
// functions so that tests can check them on small inputs.
enum class Pooling { kMax, kAverage };

// 1-D pooling with stride 1 and kernel / 2 positions of padding on each side, as torch's
// max_pool1d / avg_pool1d with padding = kernel / 2 (the average counts padding as zeros).
// An even kernel is widened by one (SnapKV's kernels are odd).
[[nodiscard]] std::vector<float> pool_scores(std::span<const float> scores, std::uint32_t kernel,
                                             Pooling pooling);

// SnapKV's score of each prefix position (0 .. prompt − window − 1) for every head: the mean
// over the last `window` prompt queries of their attention to it, then pooled. `weights` is a
// trace's prefill window, heads × trace_window × prompt (query i at position prompt −
// trace_window + i); needs window ≤ trace_window and window ≤ prompt. Result: [head][position].
[[nodiscard]] std::vector<std::vector<float>> snap_head_scores(
    std::span<const float> weights, std::uint32_t heads, std::uint32_t trace_window,
    std::uint64_t prompt, std::uint32_t window, std::uint32_t kernel, Pooling pooling);

// The positions of the k highest scores, ties to the earlier position, in ascending order.
[[nodiscard]] std::vector<std::uint64_t> top_positions(std::span<const float> scores,
                                                       std::uint64_t k);

// AdaKV's allocation: scores[h][position] for H heads; H · per_head positions are kept in all,
// each head first its own top ⌊floor_share · per_head⌋, the rest chosen jointly across heads by
// score (ties: earlier position, then lower head). Result: each head's positions, ascending.
[[nodiscard]] std::vector<std::vector<std::uint64_t>> adaptive_head_selection(
    const std::vector<std::vector<float>>& scores, std::uint64_t per_head, double floor_share);

}  // namespace kvtier::replay
