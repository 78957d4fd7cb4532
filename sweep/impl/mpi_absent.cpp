// MpiJob in a build without MPI (KVTIER_MPI off or no MPI library found): `--mpi` is refused
// with the reason, and a sweep runs in one process as it always can.

#include "common/errors.hpp"
#include "sweep/mpi.hpp"

namespace kvtier::sweep {

bool MpiJob::available() {
  return false;
}

MpiJob::MpiJob() {
  throw ConfigError(
      "--mpi: this kvtier was built without MPI (install libopenmpi-dev and rebuild, with "
      "-DKVTIER_MPI=AUTO or ON); without it, run shards (--shard K/N) and kvtier sweep merge");
}

MpiJob::~MpiJob() = default;

int MpiJob::agree(const std::string& /*spec_hash*/, const std::exception_ptr& /*failure*/) const {
  return 0;
}

RunSummary MpiJob::coordinate(const Sweep& sweep, const config::ConfigLoader& loader,
                              const RunOptions& options) const {
  return run_sweep(sweep, loader, options);
}

int MpiJob::work(const Sweep& /*sweep*/, const config::ConfigLoader& /*loader*/,
                 const RunOptions& /*options*/) const {
  return 0;
}

void MpiJob::barrier() const {}

}  // namespace kvtier::sweep
