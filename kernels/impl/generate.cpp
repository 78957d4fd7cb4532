#include "kernels/generate.hpp"

#include <algorithm>
#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {

GenerationResult generate(Engine& engine, std::span<const std::int32_t> prompt,
                          const GenerationOptions& options) {
  if (options.max_new_tokens < 0) {
    throw ConfigError("max_new_tokens must not be negative");
  }
  if (prompt.empty()) {
    throw ConfigError("the prompt needs at least one token (BOS for an empty prompt)");
  }
  // The last new token is sampled but never run, so it needs no position of its own.
  const std::int64_t total =
      static_cast<std::int64_t>(prompt.size()) + std::max(0, options.max_new_tokens - 1);
  if (total > engine.spec().max_position_embeddings()) {
    throw DataError(std::to_string(prompt.size()) + " prompt tokens plus " +
                        std::to_string(options.max_new_tokens) +
                        " new tokens pass the model's max_position_embeddings (" +
                        std::to_string(engine.spec().max_position_embeddings()) + ")",
                    engine.spec().name());
  }
  Sampler sampler(options.sampling);
  GenerationResult result;
  result.tokens.assign(prompt.begin(), prompt.end());
  result.prompt_tokens = static_cast<int>(prompt.size());
  engine.reset();
  engine.reserve(static_cast<int>(total));
  if (options.max_new_tokens == 0) {
    static_cast<void>(engine.prefill(prompt));
    return result;
  }
  std::span<const float> logits = engine.prefill(prompt);
  for (int step = 0; step < options.max_new_tokens; ++step) {
    const std::int32_t next = sampler.sample(logits);
    result.tokens.push_back(next);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
        options.stop_tokens.end()) {
      result.stopped = true;
      break;
    }
    if (step + 1 < options.max_new_tokens) {
      logits = engine.decode(next);
    }
  }
  return result;
}

}  // namespace kvtier::kernels
