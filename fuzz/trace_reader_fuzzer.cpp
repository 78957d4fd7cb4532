// libFuzzer harness for the trace reader and validator (docs/FUZZING.md).
//
// Each input is written to a file (HDF5 opens files by name) and then opened, read whole and
// validated the way `kvtier trace info` and `kvtier trace validate` do. A kvtier::Error is
// the expected outcome for a damaged file; anything else (a crash, a sanitizer report, another
// exception type, a hang) is a finding.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/errors.hpp"
#include "traces/reader.hpp"
#include "traces/stats.hpp"
#include "traces/validate.hpp"

namespace {

// One scratch file per fuzzing process, in memory when /dev/shm exists.
const std::string& scratch_file() {
  static const std::string path = [] {
    const char* folder = std::getenv("KVTIER_FUZZ_DIR");
    std::string pattern =
        std::string(folder != nullptr ? folder : "/dev/shm") + "/kvtier-fuzz-XXXXXX";
    const int fd = mkstemp(pattern.data());
    if (fd < 0) {
      std::perror("mkstemp");
      std::abort();
    }
    close(fd);
    return pattern;
  }();
  return path;
}

void read_everything(const kvtier::traces::TraceReader& reader) {
  namespace traces = kvtier::traces;
  const traces::TraceShape& shape = reader.shape();
  // Bound the work per input: a mutated /meta can declare a huge (consistent) trace.
  if (shape.packed_elements() * shape.layers.count > (1U << 22)) {
    return;
  }
  (void)reader.read_tokens();
  traces::DenseRows mean;
  traces::HeadRows heads;
  traces::TopKRows topk;
  for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
    if (shape.has_mean) {
      reader.read_mean(layer, {0, shape.steps}, mean);
    }
    if (shape.has_heads) {
      reader.read_heads(layer, {0, shape.steps}, heads);
    }
    if (shape.has_topk) {
      reader.read_topk(layer, {0, shape.steps}, topk);
    }
    if (shape.has_prefill) {
      (void)reader.read_prefill_window(layer);
    }
    if (shape.has_key_norms) {
      (void)reader.read_key_norms(layer);
    }
  }
  traces::StatsOptions options;
  options.sample_steps = 16;
  (void)traces::compute_stats(reader, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const kvtier::traces::TraceReader reader(scratch_file());
    read_everything(reader);
  } catch (const kvtier::Error&) {
    // A refused file: the expected outcome.
  }
  const kvtier::traces::ValidationReport report = kvtier::traces::validate_trace(scratch_file());
  (void)report;
  return 0;
}
