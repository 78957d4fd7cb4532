#pragma once
// Replay demands shared by the simulations of one process: a sweep simulates many points over
// the same traces and policies, and replaying (or reading a demand file) once per (source,
// policy) instead of once per point is what makes large sweeps cheap. Thread-safe: the first
// caller for a key computes it, later and concurrent callers wait for and share the result.
//
// HDF5 (trace and demand files) is not thread-safe in Debian's serial build, so computations
// that read or write HDF5 run under one process-wide lock (hdf5_mutex); synthetic replays run
// in parallel.

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "replay/engine.hpp"

namespace kvtier::serving {

struct MemoDemand {
  replay::ReplayDemand demand;
  std::string canonical_policy;
  std::uint64_t prompt_tokens = 0;
  bool cache_hit = false;  // read from the demand cache folder rather than replayed
};

class DemandMemo {
 public:
  using Compute = std::function<MemoDemand()>;

  // The demand stored under `key`, computing it with `compute` the first time (holding
  // hdf5_mutex when `uses_hdf5`). An exception from `compute` reaches every caller waiting for
  // that key, and the key is not kept.
  [[nodiscard]] std::shared_ptr<const MemoDemand> get(const std::string& key,
                                                      const Compute& compute, bool uses_hdf5);
  [[nodiscard]] std::size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_future<std::shared_ptr<const MemoDemand>>> entries_;
};

// The lock every HDF5 access of a multi-threaded run takes.
[[nodiscard]] std::mutex& hdf5_mutex();

}  // namespace kvtier::serving
