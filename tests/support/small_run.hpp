#pragma once
// A valid RunSpec small enough to simulate in milliseconds: Llama-3.1-8B on one H100 of an HGX
// node, 8 requests of 128 + 64 tokens, 4 in flight. The start of tests that need a run; its
// first line is the file's first, for tests that check positions in it.

#include <string>

namespace kvtier::test {

inline std::string small_run_text() {
  return R"(hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
model { preset: "Llama-3.1-8B" }
tensor_parallel_degree: 1
workload {
  closed_loop { concurrency: 4 num_requests: 8 prompt_tokens { fixed_tokens: 128 }
                output_tokens { fixed_tokens: 64 } }
  max_batch_size: 64
  prefill_chunk_tokens: 512
}
policy { name: "full" }
memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
engine { iteration_overhead_us: 1000 }
seed: 7
)";
}

}  // namespace kvtier::test
