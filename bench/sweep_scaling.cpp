// Wall time of a 1,000-point sweep at --jobs 1 and 2, run alternately: batch (10) x context
// (10) x policy (10: full and nine tiered variants) over TinyLlama-1.1B on an HGX H100 node,
// demands from a synthetic reasoning trace, so every tiered demand is replayed once and shared
// by the 10 batch points that need it. Each run starts from an empty folder (points, results)
// and a fresh DemandMemo. Prints one JSON line: every run's wall time, the medians, the
// speedup of 2 jobs over 1, and the median CPU time of each (user + system, whole process).
//
//   kvtier_bench_sweep [repeats] [scratch folder]
//   kvtier_bench_sweep --spec     # prints the spec, for bench/sweep_mpi.sh

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "bench/median.hpp"
#include "common/errors.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "sweep/sweep.hpp"

namespace {

constexpr const char* kSpec = R"(
name: "bench-sweep-scaling"
mode: GRID
base {
  hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
  model { preset: "TinyLlama-1.1B" }
  tensor_parallel_degree: 1
  workload {
    closed_loop { concurrency: 1 num_requests: 16 prompt_tokens { fixed_tokens: 256 }
                  output_tokens { fixed_tokens: 64 } }
    max_batch_size: 64
    prefill_chunk_tokens: 2048
  }
  policy { name: "full" }
  tiering { synthetic_pattern: "reasoning" prefetch_lookahead_layers: 2 host_allocation: PINNED
            copy_method: COPY_ENGINES }
  memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
  engine { iteration_overhead_us: 1750 }
  seed: 1
}
axis { path: "workload.closed_loop.concurrency"
       values: ["1", "2", "3", "4", "6", "8", "10", "12", "14", "16"] }
axis { path: "workload.closed_loop.prompt_tokens.fixed_tokens"
       values: ["128", "256", "384", "512", "640", "768", "896", "1024", "1280", "1536"] }
axis { path: "policy"
       values: ["full", "tiered:hbm=0.25,evict=0.1", "tiered:hbm=0.5,evict=0.1",
                "tiered:hbm=0.75,evict=0.1", "tiered:hbm=0.5,evict=0",
                "tiered:hbm=0.5,evict=0.2", "tiered:hbm=0.5,evict=0.1,compress=0.5",
                "tiered:hbm=0.5,evict=0.1,prefetch=differential",
                "tiered:hbm=0.5,evict=0.1,delta=16", "tiered:hbm=0.25,evict=0.1,compress=1"] }
)";

// User + system CPU seconds of the whole process so far.
double cpu_seconds() {
  rusage usage{};
  (void)getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

using kvtier::bench::median;

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--spec") {
    std::cout << "# proto-message: SweepSpec" << kSpec;
    return 0;
  }
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const std::filesystem::path scratch =
      argc > 2 ? std::filesystem::path(argv[2])
               : std::filesystem::temp_directory_path() / "kvtier-bench-sweep";
  try {
    const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
    const kvtier::config::ConfigLoader loader(presets);
    const kvtier::sweep::Sweep sweep =
        kvtier::sweep::load_sweep_text(kSpec, "bench/sweep_scaling.cpp", loader);
    const std::uint64_t points = kvtier::sweep::point_count(sweep.spec);
    std::vector<double> seconds[2];
    std::vector<double> cpu[2];
    std::uint64_t rows = 0;
    for (int r = 0; r < repeats; ++r) {
      for (unsigned jobs = 1; jobs <= 2; ++jobs) {
        kvtier::sweep::RunOptions options;
        // A new folder each run, all removed at the end: file creation right after mass
        // deletion in the same folder is slower on ext4 and would be timed too.
        options.out = scratch / ("run" + std::to_string(r) + "-jobs" + std::to_string(jobs));
        options.jobs = jobs;
        std::filesystem::remove_all(options.out);
        const double cpu_start = cpu_seconds();
        const auto start = std::chrono::steady_clock::now();
        const auto summary = kvtier::sweep::run_sweep(sweep, loader, options);
        seconds[jobs - 1].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        cpu[jobs - 1].push_back(cpu_seconds() - cpu_start);
        rows = summary.table.rows.size();
        if (summary.failed_points > 0) {
          std::cerr << "kvtier_bench_sweep: " << summary.failed_points << " points failed\n";
          return 1;
        }
      }
    }
    std::filesystem::remove_all(scratch);
    const double one = median(seconds[0]);
    const double two = median(seconds[1]);
    std::cout << "{\"points\": " << points << ", \"rows\": " << rows << ", \"repeats\": " << repeats
              << ", \"median_wall_s_jobs1\": " << one << ", \"median_wall_s_jobs2\": " << two
              << ", \"speedup\": " << one / two;
    for (unsigned jobs = 1; jobs <= 2; ++jobs) {
      std::cout << ", \"median_cpu_s_jobs" << jobs << "\": " << median(cpu[jobs - 1])
                << ", \"wall_s_jobs" << jobs << "\": [";
      for (std::size_t i = 0; i < seconds[jobs - 1].size(); ++i) {
        std::cout << (i == 0 ? "" : ", ") << seconds[jobs - 1][i];
      }
      std::cout << "]";
    }
    std::cout << "}\n";
  } catch (const kvtier::Error& error) {
    for (const auto& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
