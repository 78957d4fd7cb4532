// Replay speed: attention entries processed per second by a policy over a synthetic trace of
// head-mean rows (default 4,096 steps, 28 layers, 512-token prompt — a 7B Qwen-shaped trace).
// Rows are cut from a precomputed decaying pattern, so the figure measures the replay engine
// and the policy, not a generator or a decompressor.
//
//   kvtier_bench_replay POLICY [steps] [layers] [prompt]

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"

namespace {

class PatternAttention final : public kvtier::replay::AttentionSource {
 public:
  PatternAttention(std::uint32_t layers, std::uint64_t prompt, std::uint64_t steps)
      : layers_(layers), prompt_(prompt), steps_(steps) {
    const std::uint64_t longest = prompt + steps;
    pattern_.resize(longest);
    for (std::uint64_t distance = 0; distance < longest; ++distance) {
      pattern_[distance] = static_cast<float>(std::exp(-static_cast<double>(distance) / 64.0) +
                                              (distance % 97 == 3 ? 0.2 : 0.001));
    }
  }
  [[nodiscard]] std::uint32_t layers() const override { return layers_; }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return prompt_; }
  [[nodiscard]] std::uint64_t steps() const override { return steps_; }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override {
    const std::uint64_t visible = prompt_ + step + 1;
    rows.resize(layers_);
    for (auto& row : rows) {
      // Newest token first in the pattern: row[i] = pattern[visible - 1 - i] (unnormalised).
      row.assign(pattern_.rend() - static_cast<std::ptrdiff_t>(visible), pattern_.rend());
    }
  }

 private:
  std::uint32_t layers_;
  std::uint64_t prompt_;
  std::uint64_t steps_;
  std::vector<float> pattern_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kvtier_bench_replay POLICY [steps] [layers] [prompt]\n";
    return 2;
  }
  const std::uint64_t steps = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096;
  const auto layers =
      static_cast<std::uint32_t>(argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 28);
  const std::uint64_t prompt = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 512;
  try {
    PatternAttention source(layers, prompt, steps);
    const auto registry = kvtier::replay::builtin_policies();
    std::string canonical;
    auto policy = registry.create(kvtier::replay::parse_policy_string(argv[1]),
                                  {layers, prompt, steps}, &canonical);
    const auto start = std::chrono::steady_clock::now();
    const auto demand = kvtier::replay::replay(source, *policy);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double entries = static_cast<double>(layers) *
                           (static_cast<double>(steps) * static_cast<double>(prompt) +
                            static_cast<double>(steps) * static_cast<double>(steps + 1) / 2.0);
    std::cout << "{\"policy\": \"" << canonical << "\", \"steps\": " << steps
              << ", \"layers\": " << layers << ", \"prompt\": " << prompt
              << ", \"entries\": " << entries << ", \"seconds\": " << seconds
              << ", \"entries_per_s\": " << entries / seconds
              << ", \"mean_kept_mass\": " << demand.summary().mean_kept_mass << "}\n";
  } catch (const kvtier::Error& error) {
    std::cerr << error.lines().front() << "\n";
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
