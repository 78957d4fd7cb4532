#pragma once
// Models with seeded random weights in a real architecture's shapes: for timing, which does not
// depend on weight values (trace-driven live runs, `kvtier live --model random:PRESET
// --follow-trace T`, and the CUDA decode benchmark). Not for anything that reads the tokens.

#include <cstdint>

#include "configs/schema/model.pb.h"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

struct RandomModelOptions {
  std::uint64_t seed = 1;
  // Every layer uses the first layer's tensors: host memory for one layer instead of all of them
  // (a 70B shape fits in a few GB), while every layer still reads a full layer's weights. Only a
  // model whose layer fits in the processor's caches decodes faster this way.
  bool share_layer_weights = true;
};

// Weights uniform in ±0.02·√3 (standard deviation 0.02), norms 1, biases (Qwen2) and q/k norm
// weights (Qwen3) as the spec asks; element i of a tensor is a function of (seed, tensor, i)
// only, so the values do not depend on the thread count. The spec is checked as a loaded
// checkpoint's is (check_engine_spec: DataError naming the field); `source` is "random:NAME".
[[nodiscard]] ModelWeights random_model(const config::ModelSpec& spec,
                                        const RandomModelOptions& options = {});

}  // namespace kvtier::kernels
