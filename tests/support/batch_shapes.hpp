#pragma once
// Iterations to cost in tests of the iteration cost model.

#include <cstdint>

#include "hwmodels/iteration_cost.hpp"

namespace kvtier::test {

// `requests` decoding tokens, each over `context_each` tokens of KV.
inline hw::BatchShape decode(std::uint64_t requests, std::uint64_t context_each) {
  hw::BatchShape batch;
  batch.decode_tokens = requests;
  batch.decode_context_tokens = requests * context_each;
  batch.logits_tokens = requests;
  return batch;
}

// One prefill chunk of `tokens` after `before` tokens of its prompt.
inline hw::BatchShape prefill(std::uint64_t tokens, std::uint64_t before) {
  hw::BatchShape batch;
  batch.prefill.push_back({tokens, before});
  batch.logits_tokens = 1;
  return batch;
}

}  // namespace kvtier::test
