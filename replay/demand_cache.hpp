#pragma once
// Replay once, reuse everywhere: the demand of a policy over a trace, cached in a folder of
// demand files keyed by (trace content, canonical policy). The tier-aware simulator and sweeps
// call cached_replay() for every (trace, policy) point; the first call replays and writes the
// file, later calls (in this or any other process) read it back.
//
// The key is the XXH3-128 hash of the trace file's bytes, not its path or timestamps: any
// rewrite of the file — new content, or the same rows recompressed or rechunked — gives a new
// key, so an entry is never stale for its trace (a re-chunked copy replays once more, which is
// the cheap side of the trade). The policy part of the key is the canonical policy string with
// every parameter spelt out, so "tiered" and "tiered:hbm=0.5" (the default) share an entry.
//
// Hashing reads the whole trace (GB/s, bounded by the disk). A hash is remembered per file
// identity — path, device, inode, size, modification and status-change times in nanoseconds —
// in memory for the process, and in the cache folder (trace-hashes/) across processes, so a
// sweep over cached points does not reread multi-GB traces. The status-change time cannot be
// set by programs (unlike the modification time, which `cp -p` and rsync preserve), so any
// rewrite or replacement of the file changes the identity and the hash is recomputed (given
// nanosecond timestamps; docs/REPLAY.md notes file systems with coarse ones).
//
// Not thread-safe across calls that touch HDF5 (the serial HDF5 library is not): run replays of
// a sweep one at a time per process, or in separate processes sharing the cache folder (files
// are written under a temporary name and renamed, so readers never see half a file).

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "configs/schema/policy.pb.h"
#include "replay/demand_file.hpp"
#include "replay/engine.hpp"
#include "replay/registry.hpp"

namespace kvtier::replay {

// XXH3-128 of the file's bytes as 32 lowercase hex digits (XXH128's canonical, big-endian
// form, the same as `xxhsum -H2` prints), streamed in 8 MiB blocks. Remembered per file
// identity within the process. DataError when the file cannot be read.
[[nodiscard]] std::string trace_content_hash(const std::filesystem::path& trace);

// XXH3-64 of the canonical policy string, 16 lowercase hex digits.
[[nodiscard]] std::string policy_key(std::string_view canonical_policy);

// "<trace hash>-<policy key>.h5": a cache entry's file name.
[[nodiscard]] std::string demand_cache_file_name(std::string_view trace_hash,
                                                 std::string_view canonical_policy);

enum class CacheOutcome {
  kOff,       // no cache folder given: replayed, nothing written
  kHit,       // read from the cache
  kMiss,      // replayed and written to the cache
  kReplaced,  // an unreadable or mismatched entry was replayed and written again
};

[[nodiscard]] std::string_view cache_outcome_name(CacheOutcome outcome);  // "hit", "miss", ...

struct CachedReplay {
  ReplayDemand demand;
  DemandProvenance provenance;  // trace hash, canonical policy, model, from_topk, ...
  CacheOutcome outcome = CacheOutcome::kOff;
  std::filesystem::path file;  // the cache entry; empty when the cache is off
  std::string note;            // for kReplaced: why the old entry was not used
  [[nodiscard]] bool hit() const noexcept { return outcome == CacheOutcome::kHit; }
};

// The demand of `policy` over the trace at `trace_path`. With an empty `cache_dir` this
// replays and writes nothing. Otherwise the entry cache_dir/demand_cache_file_name(...) is read
// when it exists and its attributes match (trace hash, canonical policy, steps, layers, and the
// kvtier version that wrote it — a release may change what replay computes); else the trace is
// replayed and the entry written (the folder is created when missing).
//
// Errors: ConfigError (exit 2) for an unknown policy or parameter; DataError (exit 3) for a
// trace that cannot be read or lacks data the policy needs (the engine's message); kvtier::Error
// (exit 1) when the cache folder cannot be written.
[[nodiscard]] CachedReplay cached_replay(const std::filesystem::path& trace_path,
                                         const config::PolicySpec& policy,
                                         const std::filesystem::path& cache_dir);
// The same with policies from `registry` (tests, or policies outside builtin_policies()).
[[nodiscard]] CachedReplay cached_replay(const std::filesystem::path& trace_path,
                                         const config::PolicySpec& policy,
                                         const std::filesystem::path& cache_dir,
                                         const PolicyRegistry& registry);

}  // namespace kvtier::replay
