#include "replay/demand_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "replay/trace_source.hpp"

namespace kvtier::replay {
namespace {

namespace fs = std::filesystem;

// Large reads keep hashing at disk speed; XXH3 itself runs at tens of GB/s.
constexpr std::size_t kHashBlockBytes = std::size_t{8} << 20;

// What identifies one version of a file without reading it (see demand_cache.hpp).
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
  std::int64_t modified_ns = 0;
  std::int64_t changed_ns = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

std::int64_t nanoseconds(const timespec& time) {
  return static_cast<std::int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

FileIdentity identity_of(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw DataError(std::string("cannot read the trace: ") + std::strerror(errno), path.string());
  }
  return {static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino),
          static_cast<std::uint64_t>(info.st_size), nanoseconds(info.st_mtim),
          nanoseconds(info.st_ctim)};
}

std::string hex(const unsigned char* bytes, std::size_t count) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(count * 2, '0');
  for (std::size_t i = 0; i < count; ++i) {
    text[2 * i] = kDigits[bytes[i] >> 4];
    text[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return text;
}

struct FileDescriptor {
  explicit FileDescriptor(int descriptor) : fd(descriptor) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) {
      (void)::close(fd);
    }
  }
  int fd;
};

// Reads the whole file through XXH3-128.
std::string hash_file(const fs::path& path) {
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0) {
    throw DataError(std::string("cannot open the trace: ") + std::strerror(errno), path.string());
  }
  const int descriptor = file.fd;
  (void)::posix_fadvise(descriptor, 0, 0, POSIX_FADV_SEQUENTIAL);
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                              XXH3_freeState);
  if (!state || XXH3_128bits_reset(state.get()) != XXH_OK) {
    throw std::bad_alloc();
  }
  std::vector<unsigned char> buffer(kHashBlockBytes);
  while (true) {
    const ssize_t got = ::read(descriptor, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw DataError(std::string("cannot read the trace: ") + std::strerror(errno), path.string());
    }
    if (got == 0) {
      break;
    }
    (void)XXH3_128bits_update(state.get(), buffer.data(), static_cast<std::size_t>(got));
  }
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state.get()));
  return hex(canonical.digest, sizeof(canonical.digest));
}

// Hashes the file and checks it did not change meanwhile (a hash of a half-written file must
// not be remembered under the finished file's identity).
std::string hash_stable(const fs::path& path, const FileIdentity& before) {
  std::string hash = hash_file(path);
  if (identity_of(path) != before) {
    throw DataError("the trace changed while it was being hashed", path.string());
  }
  return hash;
}

struct Remembered {
  FileIdentity identity;
  std::string hash;
};

std::mutex& memo_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, Remembered>& memo() {
  static std::map<std::string, Remembered> remembered;
  return remembered;
}

std::string memo_key(const fs::path& path) {
  return fs::absolute(path).lexically_normal().string();
}

// --- The hash index in the cache folder -----------------------------------------------------
// trace-hashes/<XXH3-64 of the absolute path>.txt, four lines:
//   kvtier-trace-hash 1
//   path <absolute path>
//   identity <device> <inode> <size> <mtime ns> <ctime ns>
//   xxh3-128 <hash>

constexpr std::string_view kIndexHeader = "kvtier-trace-hash 1";

fs::path index_file(const fs::path& cache_dir, const std::string& absolute) {
  return cache_dir / "trace-hashes" / (policy_key(absolute) + ".txt");
}

std::string index_text(const std::string& absolute, const FileIdentity& id,
                       const std::string& hash) {
  std::ostringstream text;
  text << kIndexHeader << "\npath " << absolute << "\nidentity " << id.device << ' ' << id.inode
       << ' ' << id.size << ' ' << id.modified_ns << ' ' << id.changed_ns << "\nxxh3-128 " << hash
       << '\n';
  return text.str();
}

// The hash the index remembers for this file identity, or empty.
std::string indexed_hash(const fs::path& file, const std::string& absolute,
                         const FileIdentity& id) {
  std::ifstream in(file);
  std::string expected = index_text(absolute, id, "");
  expected.pop_back();  // the hash and its newline follow "xxh3-128 "
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return {};
  }
  if (text.size() != expected.size() + 33 || text.compare(0, expected.size(), expected) != 0 ||
      text.back() != '\n') {
    return {};
  }
  std::string hash = text.substr(expected.size(), 32);
  for (const char c : hash) {
    if ((c < '0' || c > '9') && (c < 'a' || c > 'f')) {
      return {};
    }
  }
  return hash;
}

// trace_content_hash, also consulting and updating the index in `cache_dir`.
std::string cached_content_hash(const fs::path& trace, const fs::path& cache_dir) {
  const std::string absolute = memo_key(trace);
  const FileIdentity id = identity_of(trace);
  {
    const std::lock_guard<std::mutex> lock(memo_mutex());
    const auto found = memo().find(absolute);
    if (found != memo().end() && found->second.identity == id) {
      return found->second.hash;
    }
  }
  const fs::path index = index_file(cache_dir, absolute);
  std::string hash = indexed_hash(index, absolute, id);
  if (hash.empty()) {
    hash = hash_stable(trace, id);
    write_file_atomically(index, index_text(absolute, id, hash));
  }
  const std::lock_guard<std::mutex> lock(memo_mutex());
  memo()[absolute] = {id, hash};
  return hash;
}

// Why a cache entry cannot stand for this replay; empty when it can.
std::string mismatch(const DemandFile& entry, const DemandProvenance& wanted,
                     const ReplayShape& shape, const CompressedFormat& format) {
  const DemandProvenance& got = entry.provenance;
  if (got.trace_hash != wanted.trace_hash) {
    return "its trace hash is " + got.trace_hash;
  }
  if (got.policy != wanted.policy) {
    return "its policy is " + got.policy;
  }
  if (got.producer != wanted.producer) {
    return "it was written by " + got.producer;
  }
  if (entry.demand.steps() != shape.steps || entry.demand.layers() != shape.layers ||
      got.prompt_tokens != wanted.prompt_tokens || got.first_layer != wanted.first_layer ||
      got.from_topk != wanted.from_topk || got.model != wanted.model) {
    return "its dimensions differ from the trace's";
  }
  // The policy string fixes the format, unless the policy's code changed within a version.
  if (entry.demand.compressed_format() != format) {
    return "its compressed format differs from the policy's";
  }
  return {};
}

}  // namespace

std::string trace_content_hash(const fs::path& trace) {
  const std::string absolute = memo_key(trace);
  const FileIdentity id = identity_of(trace);
  {
    const std::lock_guard<std::mutex> lock(memo_mutex());
    const auto found = memo().find(absolute);
    if (found != memo().end() && found->second.identity == id) {
      return found->second.hash;
    }
  }
  std::string hash = hash_stable(trace, id);
  const std::lock_guard<std::mutex> lock(memo_mutex());
  memo()[absolute] = {id, hash};
  return hash;
}

std::string policy_key(std::string_view canonical_policy) {
  XXH64_canonical_t canonical;
  XXH64_canonicalFromHash(&canonical,
                          XXH3_64bits(canonical_policy.data(), canonical_policy.size()));
  return hex(canonical.digest, sizeof(canonical.digest));
}

std::string demand_cache_file_name(std::string_view trace_hash, std::string_view canonical_policy) {
  return std::string(trace_hash) + "-" + policy_key(canonical_policy) + ".h5";
}

std::string_view cache_outcome_name(CacheOutcome outcome) {
  switch (outcome) {
    case CacheOutcome::kOff: return "off";
    case CacheOutcome::kHit: return "hit";
    case CacheOutcome::kMiss: return "miss";
    case CacheOutcome::kReplaced: return "replaced";
  }
  return "unknown";
}

CachedReplay cached_replay(const fs::path& trace_path, const config::PolicySpec& policy,
                           const fs::path& cache_dir) {
  return cached_replay(trace_path, policy, cache_dir, builtin_policies());
}

CachedReplay cached_replay(const fs::path& trace_path, const config::PolicySpec& policy,
                           const fs::path& cache_dir, const PolicyRegistry& registry) {
  // Opening the trace checks it; the policy needs its shape. Both are cheap next to a replay.
  TraceAttention source(trace_path);
  const ReplayShape shape{source.layers(), source.prompt_tokens(), source.steps()};
  DemandProvenance provenance;
  const std::unique_ptr<Policy> instance = registry.create(policy, shape, &provenance.policy);
  provenance.trace_hash = cache_dir.empty() ? trace_content_hash(trace_path)
                                            : cached_content_hash(trace_path, cache_dir);
  provenance.trace_file = trace_path.filename().string();
  provenance.prompt_tokens = source.prompt_tokens();
  provenance.first_layer = source.first_layer();
  provenance.model = source.reader().meta().model().name();
  provenance.from_topk = source.from_topk();
  provenance.producer = demand_producer();

  CachedReplay result{ReplayDemand(0, 0), provenance, CacheOutcome::kOff, {}, {}};
  if (!cache_dir.empty()) {
    result.file = cache_dir / demand_cache_file_name(provenance.trace_hash, provenance.policy);
    result.outcome = CacheOutcome::kMiss;
    std::error_code error;
    if (fs::exists(result.file, error)) {
      // A damaged or foreign entry is replaced rather than trusted or fatal: the cache can
      // always be rebuilt from the trace.
      try {
        DemandFile entry = read_demand_file(result.file);
        result.note = mismatch(entry, provenance, shape, instance->compressed_format());
        if (result.note.empty()) {
          result.demand = std::move(entry.demand);
          result.demand.set_attends_compressed(instance->attends_compressed());
          result.outcome = CacheOutcome::kHit;
          return result;
        }
      } catch (const DataError& problem) {
        result.note = std::string(problem.what()) + " (" + problem.where() + ")";
      }
      result.outcome = CacheOutcome::kReplaced;
    }
  }
  result.demand = replay(source, *instance);
  if (!cache_dir.empty()) {
    write_demand_file(result.file, result.demand, provenance);
  }
  return result;
}

}  // namespace kvtier::replay
