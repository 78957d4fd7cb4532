#pragma once
// Sweeps over the processes of an MPI job (`mpiexec -n R kvtier sweep SPEC --mpi`,
// docs/SWEEPS.md, "MPI"). Rank 0 owns the sweep folder: it claims it, resumes the points already
// there, hands the others out one at a time to whichever process asks (itself included, on its
// --jobs threads), writes every point file and the results. The other ranks compute what they
// are handed on their own --jobs threads and send back the point file's bytes, so only rank 0
// needs the folder, and the results are the same bytes as a run in one process.
//
// Built only with MPI (KVTIER_MPI, the top-level CMakeLists.txt); without it, MpiJob's
// constructor refuses with a ConfigError and nothing else is reached.

#include <exception>
#include <string>

#include "configs/loader.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep {

class MpiJob {
 public:
  // Whether this kvtier was built with MPI.
  [[nodiscard]] static bool available();

  // MPI_Init_thread (only the calling thread talks to MPI). ConfigError when not available().
  MpiJob();
  // MPI_Finalize (nothing in a build without MPI, where the constructor refuses).
  ~MpiJob();  // NOLINT(performance-trivially-destructible)
  MpiJob(const MpiJob&) = delete;
  MpiJob& operator=(const MpiJob&) = delete;
  MpiJob(MpiJob&&) = delete;
  MpiJob& operator=(MpiJob&&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

  // Collective: every rank passes what loading the spec gave it, the resolved spec's hash or
  // the error that loading threw. Returns 0 when every rank loaded the same spec. Otherwise rank
  // 0 throws (its own error, else the lowest failing rank's, or a ConfigError naming the first
  // rank whose spec differs) and every other rank returns that error's exit code, to end with
  // quietly: one report, from rank 0.
  [[nodiscard]] int agree(const std::string& spec_hash, const std::exception_ptr& failure) const;

  // Rank 0, collective: run_sweep with the points shared among the ranks.
  [[nodiscard]] RunSummary coordinate(const Sweep& sweep, const config::ConfigLoader& loader,
                                      const RunOptions& options) const;
  // The other ranks, collective: computes the points rank 0 hands out, on options.jobs threads,
  // until it has none left; returns the exit code the job ends with (rank 0 reports why).
  [[nodiscard]] int work(const Sweep& sweep, const config::ConfigLoader& loader,
                         const RunOptions& options) const;
  // Collective: returns once every rank has called it. Rank 0 reports a failure before it, so
  // that no rank ends (and has the launcher stop the others) before the report is out:
  // MPI_Finalize need not wait for every rank.
  void barrier() const;

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace kvtier::sweep
