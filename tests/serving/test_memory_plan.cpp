// The KV memory a request occupies: a token at a time, or in whole blocks, with and without a
// sliding window.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "serving/memory_plan.hpp"

using kvtier::serving::MemoryPlan;

namespace {

// Counts the blocks the held positions fall in, one position at a time.
std::uint64_t blocks_by_position(const MemoryPlan& plan, std::uint64_t tokens) {
  const std::uint64_t first =
      plan.window_tokens > 0 && tokens > plan.window_tokens ? tokens - plan.window_tokens : 0;
  std::uint64_t blocks = 0;
  std::uint64_t last_block = UINT64_MAX;
  for (std::uint64_t position = first; position < tokens; ++position) {
    if (position / plan.block_tokens != last_block) {
      last_block = position / plan.block_tokens;
      ++blocks;
    }
  }
  return blocks;
}

MemoryPlan plan_of(std::uint32_t block_tokens, std::uint64_t window_tokens) {
  MemoryPlan plan;
  plan.block_tokens = block_tokens;
  plan.window_tokens = window_tokens;
  plan.kv_bytes_per_token = 1024.0;
  return plan;
}

}  // namespace

TEST_CASE("without blocks a request occupies the tokens it holds", "[serving]") {
  const MemoryPlan plan = plan_of(0, 0);
  CHECK(plan.allocated_tokens(0) == 0);
  CHECK(plan.allocated_tokens(2221) == 2221);
  CHECK(plan.peak_allocated_tokens(2221) == 2221);
  CHECK(plan.kv_bytes_for(10) == 10 * 1024.0);
  const MemoryPlan window = plan_of(0, 4096);
  CHECK(window.allocated_tokens(5000) == 4096);
  CHECK(window.peak_allocated_tokens(5000) == 4096);
}

TEST_CASE("in blocks a request occupies whole blocks, the last one partly filled", "[serving]") {
  const MemoryPlan plan = plan_of(16, 0);
  CHECK(plan.allocated_tokens(0) == 0);
  CHECK(plan.allocated_tokens(1) == 16);
  CHECK(plan.allocated_tokens(16) == 16);
  CHECK(plan.allocated_tokens(17) == 32);
  CHECK(plan.allocated_tokens(2208) == 2208);
  CHECK(plan.allocated_tokens(2209) == 2224);
  CHECK(plan.peak_allocated_tokens(2209) == 2224);
  CHECK(plan.kv_bytes_for(17) == 32 * 1024.0);
  CHECK(plan.peak_kv_bytes_for(17) == 32 * 1024.0);
}

TEST_CASE("a sliding window in blocks spans the blocks its first and last positions fall in",
          "[serving]") {
  // Every block size against windows that are, are not, and are one off a multiple of it; the
  // peak is the most over every context up to the one asked.
  for (const std::uint32_t block : {1U, 2U, 3U, 16U, 64U}) {
    for (const std::uint64_t window : {1ULL, 5ULL, 16ULL, 17ULL, 31ULL, 32ULL, 33ULL, 100ULL}) {
      const MemoryPlan plan = plan_of(block, window);
      std::uint64_t peak = 0;
      for (std::uint64_t tokens = 1; tokens <= window + 3 * block + 5; ++tokens) {
        INFO("block " << block << ", window " << window << ", tokens " << tokens);
        const std::uint64_t expected = blocks_by_position(plan, tokens) * block;
        REQUIRE(plan.allocated_tokens(tokens) == expected);
        peak = std::max(peak, expected);
        REQUIRE(plan.peak_allocated_tokens(tokens) == peak);
      }
    }
  }
  // 4,096 positions in 16-token blocks: 256 blocks when they start a block, 257 otherwise.
  const MemoryPlan mistral = plan_of(16, 4096);
  CHECK(mistral.allocated_tokens(4096) == 4096);
  CHECK(mistral.allocated_tokens(4097) == 4112);
  CHECK(mistral.allocated_tokens(4112) == 4096);
  CHECK(mistral.peak_allocated_tokens(4112) == 4112);
}

TEST_CASE("a projected share a few ulps past a block's end takes no block more", "[serving]") {
  using kvtier::serving::in_whole_blocks;
  // A share of 83 start tokens over 47 of a trace prompt's 83, plus the step's own token: 48 in
  // exact arithmetic, a few ulps above in doubles.
  const double share = 83.0 * (47.0 / 83.0) + 1.0;
  REQUIRE(share > 48.0);
  CHECK(in_whole_blocks(share, 16) == 48.0);
  CHECK(in_whole_blocks(48.0, 16) == 48.0);
  CHECK(in_whole_blocks(48.001, 16) == 64.0);
  CHECK(in_whole_blocks(0.0, 16) == 0.0);
  CHECK(in_whole_blocks(0.5, 16) == 16.0);
  CHECK(in_whole_blocks(47.25, 0) == 47.25);  // no blocks: as it is
}
