// Wall time of whole serving simulations: loads a RunSpec, simulates it `repeats` times and
// prints one JSON line with every run's wall time and the median.
//
//   kvtier_bench_serving configs/examples/llama70b-tp4-1000.textproto [repeats]

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kvtier_bench_serving RUN.textproto [repeats]\n";
    return 2;
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  try {
    const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
    const kvtier::config::ConfigLoader loader(presets);
    kvtier::config::RunSpec run;
    (void)loader.load_file(argv[1], run, {});
    std::vector<double> seconds;
    std::uint64_t events = 0;
    double iterations = 0.0;
    for (int i = 0; i < repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const auto report = kvtier::serving::simulate(run);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      events = report.events;
      for (const auto& metric : report.metrics) {
        iterations = metric.name == "iterations" ? metric.value : iterations;
      }
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    std::cout << "{\"config\": \"" << argv[1] << "\", \"repeats\": " << repeats
              << ", \"iterations\": " << iterations << ", \"events\": " << events
              << ", \"median_wall_s\": " << sorted[sorted.size() / 2] << ", \"wall_s\": [";
    for (size_t i = 0; i < seconds.size(); ++i) {
      std::cout << (i == 0 ? "" : ", ") << seconds[i];
    }
    std::cout << "]}\n";
  } catch (const kvtier::Error& error) {
    for (const auto& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
