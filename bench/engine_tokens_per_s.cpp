// Tokens per second of the CPU reference engine: greedy decoding from BOS for `positions`
// forward passes (one prefill of BOS, then decode steps), as llama2.c's run.c -n POSITIONS does.
// Prints one JSON line with every repeat's rate and the median. Pin it to one core (taskset).
//
//   kvtier_bench_engine ../shared/fixtures/stories260K/stories260K.bin [positions] [repeats]

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kvtier_bench_engine CHECKPOINT [positions] [repeats]\n";
    return 2;
  }
  const int positions = argc > 2 ? std::atoi(argv[2]) : 256;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  try {
    namespace kk = kvtier::kernels;
    const auto weights = std::make_shared<const kk::ModelWeights>(kk::load_model(argv[1]));
    const auto engine = kk::make_cpu_engine(weights);
    kk::GenerationOptions options;
    options.max_new_tokens = positions;  // = forward passes: BOS prefill + positions-1 decodes
    options.sampling = kk::SamplingOptions::greedy();
    const std::int32_t bos = 1;
    std::vector<double> rates;
    std::size_t generated = 0;
    long checksum = 0;  // sum of generated ids: equal runs decode the same tokens
    for (int i = 0; i < repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const kk::GenerationResult result = kk::generate(*engine, {&bos, 1}, options);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      generated = result.generated().size();
      checksum = 0;
      for (const std::int32_t token : result.generated()) {
        checksum += token;
      }
      rates.push_back(static_cast<double>(positions) / seconds);
    }
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    std::cout << "{\"model\":\"" << weights->spec.name() << "\",\"positions\":" << positions
              << ",\"generated\":" << generated << ",\"checksum\":" << checksum
              << ",\"tokens_per_s\":[";
    for (std::size_t i = 0; i < rates.size(); ++i) {
      std::cout << (i == 0 ? "" : ",") << rates[i];
    }
    std::cout << "],\"median_tokens_per_s\":" << sorted[sorted.size() / 2] << "}\n";
  } catch (const kvtier::Error& error) {
    for (const std::string& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
