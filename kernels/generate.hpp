#pragma once
// A whole run: the prompt as one prefill, then decode steps, each token chosen by a Sampler.
// An observer attached to the engine sees every step (the attention tracer hooks in there).

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/engine.hpp"
#include "kernels/sampler.hpp"

namespace kvtier::kernels {

struct GenerationOptions {
  int max_new_tokens = 0;
  SamplingOptions sampling;
  // Generation ends after producing any of these (EOS; llama2.c also stops at BOS).
  std::vector<std::int32_t> stop_tokens;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // prompt, then generated tokens (a stop token included)
  int prompt_tokens = 0;
  bool stopped = false;  // ended on a stop token rather than max_new_tokens

  [[nodiscard]] std::span<const std::int32_t> generated() const {
    return std::span<const std::int32_t>(tokens).subspan(static_cast<std::size_t>(prompt_tokens));
  }
};

// Runs on an engine at position 0 (it is reset first). Throws ConfigError for a negative
// max_new_tokens or an empty prompt, DataError when prompt + new tokens pass the model's
// positions.
[[nodiscard]] GenerationResult generate(Engine& engine, std::span<const std::int32_t> prompt,
                                        const GenerationOptions& options);

}  // namespace kvtier::kernels
