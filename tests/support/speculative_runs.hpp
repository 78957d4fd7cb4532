#pragma once
// Sets that turn on speculative decoding with a one-layer drafter, for tests of engine.speculative.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::test {

// `extra` and the sets drafting `drafts` tokens a step accepted with probability `acceptance`.
inline std::vector<std::string> speculative_sets(std::uint32_t drafts, double acceptance,
                                                 std::vector<std::string> extra = {}) {
  extra.insert(extra.end(), {"engine.speculative.draft_tokens=" + std::to_string(drafts),
                             "engine.speculative.acceptance_rate=" + std::to_string(acceptance),
                             "engine.speculative.draft_layers=1"});
  return extra;
}

}  // namespace kvtier::test
