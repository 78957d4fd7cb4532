// Tokens per second of the CPU reference engine.
//
// Decoding (the default, as llama2.c's run.c -n POSITIONS does): greedy decoding from BOS for
// `positions` forward passes (one prefill of BOS, then decode steps). Prints one JSON line with
// every repeat's rate and the median. Pin it to one core (taskset) for the run.c comparison.
//
//   kvtier_bench_engine CHECKPOINT [positions] [repeats]
//
// Threads: the same decoding, plus a prefill of `positions` tokens, for each thread count in
// turn within every repeat (so the counts are measured side by side under the same load), on a
// checkpoint or on random weights in a model preset's shapes. One JSON line per thread count.
//
//   kvtier_bench_engine --threads 1,2 CHECKPOINT|random:PRESET [positions] [repeats]

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/median.hpp"
#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/random_model.hpp"

namespace {

namespace kk = kvtier::kernels;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

kk::ModelWeights load(const std::string& model) {
  if (model.rfind("random:", 0) != 0) {
    return kk::load_model(model);
  }
  const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
  const kvtier::config::ConfigLoader loader(presets);
  const kvtier::config::PresetFile* preset = presets.find("model", model.substr(7));
  if (preset == nullptr) {
    throw kvtier::ConfigError("no model preset " + model.substr(7));
  }
  kvtier::config::ModelSpec spec;
  (void)loader.load_preset(*preset, spec, {});
  return kk::random_model(spec);
}

struct Rates {
  std::vector<double> decode;
  std::vector<double> prefill;
  std::size_t generated = 0;
  long checksum = 0;  // sum of generated ids: equal runs decode the same tokens
};

using kvtier::bench::median;

void print_list(const std::vector<double>& values) {
  std::cout << "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::cout << (i == 0 ? "" : ",") << values[i];
  }
  std::cout << "]";
}

void decode_once(kk::Engine& engine, int positions, Rates& rates) {
  kk::GenerationOptions options;
  options.max_new_tokens = positions;  // = forward passes: BOS prefill + positions-1 decodes
  options.sampling = kk::SamplingOptions::greedy();
  const std::int32_t bos = 1;
  const auto start = Clock::now();
  const kk::GenerationResult result = kk::generate(engine, {&bos, 1}, options);
  rates.decode.push_back(static_cast<double>(positions) / seconds_since(start));
  rates.generated = result.generated().size();
  rates.checksum = 0;
  for (const std::int32_t token : result.generated()) {
    rates.checksum += token;
  }
}

void prefill_once(kk::Engine& engine, int positions, std::uint32_t vocab, Rates& rates) {
  std::vector<std::int32_t> prompt{1};
  for (int i = 1; i < positions; ++i) {
    prompt.push_back(static_cast<std::int32_t>((static_cast<std::uint32_t>(i) * 7919U) % vocab));
  }
  engine.reset();
  const auto start = Clock::now();
  static_cast<void>(engine.prefill(prompt));
  rates.prefill.push_back(static_cast<double>(positions) / seconds_since(start));
}

std::vector<int> thread_counts(const std::string& list) {
  std::vector<int> counts;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) {
    counts.push_back(std::atoi(item.c_str()));
    if (counts.back() < 1) {
      throw kvtier::ConfigError("--threads " + list + ": counts of at least 1, comma-separated");
    }
  }
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    std::vector<int> threads;
    if (args.size() >= 2 && args[0] == "--threads") {
      threads = thread_counts(args[1]);
      args.erase(args.begin(), args.begin() + 2);
    }
    if (args.empty()) {
      std::cerr << "usage: kvtier_bench_engine [--threads N,M,...] CHECKPOINT|random:PRESET "
                   "[positions] [repeats]\n";
      return 2;
    }
    const int positions = args.size() > 1 ? std::atoi(args[1].c_str()) : 256;
    const int repeats = args.size() > 2 ? std::atoi(args[2].c_str()) : 5;
    const auto weights = std::make_shared<const kk::ModelWeights>(load(args[0]));
    if (threads.empty()) {
      const auto engine = kk::make_cpu_engine(weights);
      Rates rates;
      for (int i = 0; i < repeats; ++i) {
        decode_once(*engine, positions, rates);
      }
      std::cout << "{\"model\":\"" << weights->spec.name() << "\",\"positions\":" << positions
                << ",\"generated\":" << rates.generated << ",\"checksum\":" << rates.checksum
                << ",\"tokens_per_s\":";
      print_list(rates.decode);
      std::cout << ",\"median_tokens_per_s\":" << median(rates.decode) << "}\n";
      return 0;
    }
    std::vector<std::unique_ptr<kk::Engine>> engines;
    for (const int count : threads) {
      kk::CpuEngineOptions options;
      options.threads = count;
      engines.push_back(kk::make_cpu_engine(weights, options));
    }
    std::vector<Rates> rates(threads.size());
    for (int i = 0; i < repeats; ++i) {
      for (std::size_t t = 0; t < threads.size(); ++t) {
        decode_once(*engines[t], positions, rates[t]);
        prefill_once(*engines[t], positions, weights->spec.vocab_size(), rates[t]);
      }
    }
    for (std::size_t t = 0; t < threads.size(); ++t) {
      std::cout << "{\"model\":\"" << weights->spec.name() << "\",\"threads\":" << threads[t]
                << ",\"positions\":" << positions << ",\"generated\":" << rates[t].generated
                << ",\"checksum\":" << rates[t].checksum << ",\"decode_tokens_per_s\":";
      print_list(rates[t].decode);
      std::cout << ",\"median_decode_tokens_per_s\":" << median(rates[t].decode)
                << ",\"prefill_tokens_per_s\":";
      print_list(rates[t].prefill);
      std::cout << ",\"median_prefill_tokens_per_s\":" << median(rates[t].prefill) << "}\n";
    }
  } catch (const kvtier::Error& error) {
    for (const std::string& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
