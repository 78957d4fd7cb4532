// Host-link copies on a CUDA GPU, to calibrate the simulator's link model and to see which way of
// copying overlaps compute (needs a GPU to run).
//
//   kvtier_bench_cuda_copy [SLOT_BYTES] [REPEATS] [DEVICE]     (defaults 16384, 5, 0)
//
// The simulator prices a host copy of S bytes as T = t0 + S / B per direction (hwmodels/
// link_math.hpp; a LinkSpec's per_copy_overhead_us and measured BandwidthPoints). The PCIe Gen5
// x16 preset has t0 = 5 µs and B = 35.2 GB/s (an H100 SM-copy figure, REFERENCE.md §3). On an
// H200 the live cache's staging copies (launch_copy_slots over 16 KiB slots of mapped pinned
// memory) fitted about 9.9 µs per copy plus bytes at 48.9 GB/s H2D, and did not overlap the
// engine's kernels (docs/VALIDATION.md, "Live runs on an H200"). Those figures come from the
// live runs themselves; this benchmark measures the link apart from them, per method:
// - memcpy: one cudaMemcpyAsync of S contiguous bytes between pinned host memory
//   (cudaHostAlloc, default flags) and device memory: the DMA copy engines' best case;
// - slot_kernel: launch_copy_slots (the live cache's copy kernel) moving S / SLOT_BYTES slots
//   between mapped pinned host memory (cudaHostAllocMapped | cudaHostAllocPortable, as T1) and
//   device memory, the slots scattered over 64 MiB pools on both sides in a seeded shuffled
//   order, their pairs in mapped host memory as the cache's move batches keep them;
// - slot_kernel_device_pairs: the same with the pairs in device memory, as the cache's staging
//   reads its page table (a pair read from mapped memory costs the kernel a link round trip);
// - t2_kernels: the live cache's T2 moves over the same slots, compressed in mapped host memory
//   (kernels/impl/kv_quantise.hpp: 8,448 bytes for a 16 KiB slot): h2d dequantises T2 slots
//   into full device slots (launch_dequantise_slots), d2h quantises device slots into T2 ones
//   (launch_quantise_slots), their pairs in device memory; `bytes` counts the compressed bytes
//   that cross the link, as the simulator does;
// - memcpy_batch: the same scattered slots with one cudaMemcpyBatchAsync, one entry per slot,
//   hinted cudaMemcpyFlagPreferOverlapWithCompute (CUDA 12.8 and later only);
// - memcpy_batch_no_hint: the same without the hint (the driver may then copy with SMs);
// - memcpy_per_slot: the same slots with one cudaMemcpyAsync each (what the simulator's
//   per-copy overhead models), up to 4 MiB.
// Each in both directions, at the 13 powers of two from 16 KiB to 64 MiB (slot methods: whole
// slots, so `bytes` is the slots' bytes), on an idle GPU timed from an idle stream (a kernel's
// launch is then part of its time); again queued behind a gate, as the live cache queues its
// copies behind events: the copying stream waits for an event after a 3 ms one-thread kernel
// on another stream, the timer starts when it opens, and the copy, issued meanwhile, starts at
// once; then at 256 KiB, 4 MiB and 64 MiB under compute load: another stream (non-blocking) runs a
// memory-bound kernel that holds every SM (as many 256-thread blocks as fit, each a grid-stride
// loop reading a 2 GiB device buffer; bench/cuda_copy_load.cu), pass after pass. The copy is issued
// once the first pass has ended, so it starts while the others run; the passes cover 10 times the
// copy's idle time plus 1 ms. SM-driven copies should slow down or wait for the load to end; copies
// on the copy engines should not.
//
// Every figure is the median of REPEATS copies timed with CUDA events on the copying stream,
// after one untimed copy of the same size. The slot methods are checked first: each moves every
// slot of its largest size once and the target is compared with the source (exit 1 on a
// difference). A run moves about 1.2 GB per method and direction (less for memcpy_per_slot) and
// takes a few seconds on an H200; it stops measuring (with "truncated": true) after 45 s.
//
// One JSON line on stdout:
//   bench "cuda_copy", device (name), slot_bytes, repeats, kv_heads and head_dim (the BF16 slot
//   shape given to launch_copy_slots: 2 * 2 * kv_heads * head_dim = SLOT_BYTES), sm_count,
//   compute_load {buffer_bytes, blocks, threads_per_block, pass_us (median of one pass alone)},
//   unavailable (methods left out, with the reason), truncated, and series: one per method,
//   direction ("h2d" | "d2h") and load ("idle" | "queued" | "compute"), each
//   {method, direction, load, points, fit}. A point is {bytes, copies (calls or launches issued:
//   1, or one per slot for memcpy_per_slot), seconds_median, gb_per_s (bytes / seconds_median)};
//   under load it adds load_passes (passes launched) and covered (timed copies that ended before
//   the load did; fewer than REPEATS means the copy waited for the load); queued, gated (timed
//   copies issued before their gate opened; fewer than REPEATS means issuing was timed too).
//   fit is {t0_us,
//   gb_per_s} of seconds = t0 + bytes / B, least squares weighted by 1 / seconds^2 (relative
//   residuals, so the small copies set t0 and the large ones B), or null with fewer than two
//   points; figures that are not finite (B when the slope is not positive) are null.
// Exit codes: 0 done, 1 a CUDA call failed or a copy was wrong (one line on stderr), 2 usage.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/cuda_copy_load.cuh"
#include "bench/median.hpp"
#include "common/text_output.hpp"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/kv_quantise.hpp"

#if CUDART_VERSION >= 12080
#define KVTIER_BENCH_MEMCPY_BATCH 1
#endif

namespace {

namespace kc = kvtier::kernels::cuda;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;
constexpr std::size_t kMinBytes = 16 * kKiB;
constexpr std::size_t kMaxBytes = 64 * kMiB;  // also the size of every copy buffer
constexpr std::size_t kPerSlotMaxBytes = 4 * kMiB;
constexpr std::size_t kMinSlotBytes = 256;  // kv_heads 1, head_dim 64: bounds the slot counts
constexpr std::size_t kComputeSizes[] = {256 * kKiB, 4 * kMiB, 64 * kMiB};
constexpr std::size_t kLoadBytes = std::size_t{2} << 30U;
constexpr int kLoadThreads = kvtier::bench::kLoadThreads;
constexpr double kCoverFactor = 10.0;  // load passes cover this many idle copy times ...
constexpr double kCoverExtra = 1e-3;   // ... plus this many seconds,
constexpr double kCoverMax = 0.1;      // at most this many
constexpr int kMaxPasses = 1000;
constexpr double kBudgetSeconds = 45.0;
// How long a queued copy's gate stays closed: longer than issuing the slowest transfer (a
// 4 MiB transfer of one cudaMemcpyAsync per 16 KiB slot, 256 calls).
constexpr unsigned long long kGateNanoseconds = 3'000'000;
constexpr int kMaxRepeats = 100;
constexpr std::uint64_t kSeed = 0x6B76746965724350ULL;

class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check(cudaError_t status, const std::string& call) {
  if (status != cudaSuccess) {
    throw Failure(call + " failed: " + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ")");
  }
}

// --- Owning handles (destructors ignore errors: they run on teardown) ------------------------
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t bytes, const std::string& what) {
    check(cudaMalloc(&data_, bytes), "cudaMalloc (" + what + ")");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { static_cast<void>(cudaFree(data_)); }
  std::byte* get() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
};

class HostBuffer {
 public:
  HostBuffer(std::size_t bytes, unsigned flags, const std::string& what) {
    check(cudaHostAlloc(&data_, bytes, flags), "cudaHostAlloc (" + what + ")");
    if ((flags & cudaHostAllocMapped) != 0U) {
      check(cudaHostGetDevicePointer(&device_, data_, 0),
            "cudaHostGetDevicePointer (" + what + ")");
    }
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { static_cast<void>(cudaFreeHost(data_)); }
  std::byte* get() const { return static_cast<std::byte*>(data_); }
  // The device's address of mapped memory.
  std::byte* device() const { return static_cast<std::byte*>(device_); }

 private:
  void* data_ = nullptr;
  void* device_ = nullptr;
};

class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    static_cast<void>(cudaStreamSynchronize(stream_));
    static_cast<void>(cudaStreamDestroy(stream_));
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&event_), "cudaEventCreate"); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { static_cast<void>(cudaEventDestroy(event_)); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

double elapsed_seconds(const Event& start, const Event& stop) {
  float ms = 0.0F;
  check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

// --- Small helpers ------------------------------------------------------------------------------
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t x = (state += 0x9E3779B97F4A7C15ULL);
  x = (x ^ (x >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27U)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31U);
}

// A seeded Fisher-Yates shuffle of 0 .. n-1.
std::vector<std::uint32_t> shuffled(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) {
    order[i] = static_cast<std::uint32_t>(i);
  }
  std::uint64_t state = seed;
  for (std::size_t i = n; i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(splitmix64(state) % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

using kvtier::bench::median;

// JSON has no infinities or NaN: a figure that is not finite is null.
std::string json_number(double value) {
  return kvtier::json_number_or_null(value);
}

std::string json_string(const std::string& text) {
  return kvtier::json_escape(text);
}

bool parse_count(const char* text, std::uint64_t& value) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
    return false;
  }
  value = parsed;
  return true;
}

// --- Methods, series, fits ----------------------------------------------------------------------
enum class Method {
  kMemcpy,
  kSlotKernel,
  kSlotKernelDevicePairs,
  kT2Kernels,
  kMemcpyBatch,
  kMemcpyBatchNoHint,
  kMemcpyPerSlot
};
enum class Direction { kH2D, kD2H };

const char* method_name(Method method) {
  switch (method) {
    case Method::kMemcpy: return "memcpy";
    case Method::kSlotKernel: return "slot_kernel";
    case Method::kSlotKernelDevicePairs: return "slot_kernel_device_pairs";
    case Method::kT2Kernels: return "t2_kernels";
    case Method::kMemcpyBatch: return "memcpy_batch";
    case Method::kMemcpyBatchNoHint: return "memcpy_batch_no_hint";
    case Method::kMemcpyPerSlot: return "memcpy_per_slot";
  }
  return "?";
}

// How a copy is timed: on an idle GPU from an idle stream (its launch is part of its time);
// beside a compute load; or queued behind a gate on an idle GPU, its timer starting when the
// gate opens, by which time the copy has long been issued (its launch is not).
enum class Load { kIdle, kCompute, kQueued };

const char* load_name(Load load) {
  switch (load) {
    case Load::kIdle: return "idle";
    case Load::kCompute: return "compute";
    case Load::kQueued: return "queued";
  }
  return "?";
}

struct Point {
  std::uint64_t bytes = 0;
  std::uint64_t copies = 0;
  double seconds = 0.0;
  int load_passes = 0;  // under load only
  int covered = 0;      // under load only
  int gated = 0;        // queued only: timed copies issued before their gate opened
};

struct Series {
  Method method = Method::kMemcpy;
  Direction direction = Direction::kH2D;
  Load load = Load::kIdle;
  std::vector<Point> points;
};

struct Fit {
  double t0_seconds = 0.0;
  double bytes_per_second = 0.0;
};

// Least squares of seconds = t0 + bytes / B weighted by 1 / seconds^2, centred for accuracy.
bool fit_line(const std::vector<Point>& points, Fit& fit) {
  if (points.size() < 2) {
    return false;
  }
  double weights = 0.0;
  double mean_x = 0.0;
  double mean_y = 0.0;
  for (const Point& p : points) {
    const double w = 1.0 / (p.seconds * p.seconds);
    weights += w;
    mean_x += w * static_cast<double>(p.bytes);
    mean_y += w * p.seconds;
  }
  mean_x /= weights;
  mean_y /= weights;
  double sxx = 0.0;
  double sxy = 0.0;
  for (const Point& p : points) {
    const double w = 1.0 / (p.seconds * p.seconds);
    const double dx = static_cast<double>(p.bytes) - mean_x;
    sxx += w * dx * dx;
    sxy += w * dx * (p.seconds - mean_y);
  }
  const double slope = sxy / sxx;
  fit.t0_seconds = mean_y - slope * mean_x;
  fit.bytes_per_second = slope > 0.0 ? 1.0 / slope : std::nan("");
  return true;
}

std::string series_json(const Series& series) {
  std::ostringstream out;
  out << "{\"method\":\"" << method_name(series.method) << "\",\"direction\":\""
      << (series.direction == Direction::kH2D ? "h2d" : "d2h") << "\",\"load\":\""
      << load_name(series.load) << "\",\"points\":[";
  for (std::size_t i = 0; i < series.points.size(); ++i) {
    const Point& p = series.points[i];
    out << (i == 0 ? "" : ",") << "{\"bytes\":" << p.bytes << ",\"copies\":" << p.copies
        << ",\"seconds_median\":" << json_number(p.seconds)
        << ",\"gb_per_s\":" << json_number(static_cast<double>(p.bytes) / p.seconds / 1e9);
    if (series.load == Load::kCompute) {
      out << ",\"load_passes\":" << p.load_passes << ",\"covered\":" << p.covered;
    } else if (series.load == Load::kQueued) {
      out << ",\"gated\":" << p.gated;
    }
    out << "}";
  }
  out << "],\"fit\":";
  Fit fit;
  if (fit_line(series.points, fit)) {
    out << "{\"t0_us\":" << json_number(fit.t0_seconds * 1e6)
        << ",\"gb_per_s\":" << json_number(fit.bytes_per_second / 1e9) << "}";
  } else {
    out << "null";
  }
  out << "}";
  return out.str();
}

// --- The benchmark ------------------------------------------------------------------------------
class CopyBench {
 public:
  CopyBench(std::size_t slot_bytes, int kv_heads, int head_dim, int repeats)
      : slot_bytes_(slot_bytes),
        pool_slots_(kMaxBytes / slot_bytes),
        kv_heads_(kv_heads),
        head_dim_(head_dim),
        repeats_(repeats),
        pinned_(kMaxBytes, cudaHostAllocDefault, "pinned host buffer"),
        mapped_(kMaxBytes, cudaHostAllocMapped | cudaHostAllocPortable, "mapped host slots"),
        pairs_(std::size_t{4} * pool_slots_ * sizeof(std::uint32_t),
               cudaHostAllocMapped | cudaHostAllocPortable, "mapped slot pairs"),
        device_(kMaxBytes, "device buffer"),
        device_pairs_(std::size_t{4} * pool_slots_ * sizeof(std::uint32_t), "device slot pairs"),
        compressed_bytes_(static_cast<std::size_t>(
            kvtier::kernels::quantise::compressed_bytes(kv_heads, head_dim))),
        compressed_(pool_slots_ * compressed_bytes_, cudaHostAllocMapped | cudaHostAllocPortable,
                    "mapped compressed slots"),
        load_buffer_(kLoadBytes, "load buffer") {
    // Slot i of a batch: host slot host_order[i], device slot device_order[i].
    const std::vector<std::uint32_t> host_order = shuffled(pool_slots_, kSeed);
    const std::vector<std::uint32_t> device_order = shuffled(pool_slots_, kSeed + 1);
    auto* pairs = reinterpret_cast<std::uint32_t*>(pairs_.get());
    for (std::size_t i = 0; i < pool_slots_; ++i) {
      std::byte* host = mapped_.get() + host_order[i] * slot_bytes_;
      std::byte* device = device_.get() + device_order[i] * slot_bytes_;
      pairs[2 * i] = host_order[i];  // h2d: mapped host to device
      pairs[2 * i + 1] = device_order[i];
      pairs[2 * pool_slots_ + 2 * i] = device_order[i];  // d2h: device to mapped host
      pairs[2 * pool_slots_ + 2 * i + 1] = host_order[i];
      h2d_sources_.push_back(host);
      h2d_targets_.push_back(device);
      d2h_sources_.push_back(device);
      d2h_targets_.push_back(host);
    }
    sizes_.assign(pool_slots_, slot_bytes_);
    std::memset(pinned_.get(), 0, kMaxBytes);
    std::memset(mapped_.get(), 0, kMaxBytes);
    check(cudaMemset(device_.get(), 0, kMaxBytes), "cudaMemset (device buffer)");
    check(cudaMemset(load_buffer_.get(), 0, kLoadBytes), "cudaMemset (load buffer)");
    check(cudaMemcpy(device_pairs_.get(), pairs_.get(),
                     std::size_t{4} * pool_slots_ * sizeof(std::uint32_t), cudaMemcpyHostToDevice),
          "cudaMemcpy (device slot pairs)");

    cudaDeviceProp properties{};
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    sm_count_ = properties.multiProcessorCount;
    int per_sm = 0;
    check(kvtier::bench::load_blocks_per_sm(&per_sm),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    load_blocks_ = std::max(1, per_sm) * std::max(1, sm_count_);
    sink_ = std::make_unique<DeviceBuffer>(static_cast<std::size_t>(load_blocks_) * 4, "load sink");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (set-up)");
  }

  int sm_count() const { return sm_count_; }
  int load_blocks() const { return load_blocks_; }

  // Bytes one slot puts on the link with a slot method: T2's compressed slots, else the full.
  std::size_t unit_bytes(Method method) const {
    return method == Method::kT2Kernels ? compressed_bytes_ : slot_bytes_;
  }

  // Slots a transfer of `bytes` moves with a slot method.
  std::size_t slots_of(Method method, std::size_t bytes) const {
    return bytes / unit_bytes(method);
  }

  // Bytes a point of `method` at nominal size `size` (of full-precision slots) moves over the
  // link (0: the method skips the size).
  std::size_t point_bytes(Method method, std::size_t size) const {
    if (method == Method::kMemcpy) {
      return size;
    }
    if (method == Method::kMemcpyPerSlot && size > kPerSlotMaxBytes) {
      return 0;
    }
    return (size / slot_bytes_) * unit_bytes(method);
  }

  std::uint64_t copies_of(Method method, std::size_t bytes) const {
    return method == Method::kMemcpyPerSlot ? slots_of(method, bytes) : 1;
  }

  // A batch of `slots` slots between the host pool at `host` (its device address) and the device
  // buffer, in `direction`'s order, its pairs at `pairs` (h2d's, then d2h's).
  kc::SlotBatch slot_batch(bool h2d, void* host, const void* pairs, std::size_t slots) const {
    kc::SlotBatch batch;
    batch.source = h2d ? host : static_cast<const void*>(device_.get());
    batch.target = h2d ? static_cast<void*>(device_.get()) : host;
    batch.pairs = static_cast<const std::uint32_t*>(pairs) + (h2d ? 0 : 2 * pool_slots_);
    batch.count = static_cast<int>(slots);
    batch.kv_heads = kv_heads_;
    batch.head_dim = head_dim_;
    batch.dtype = kc::Dtype::kBF16;
    return batch;
  }

  // Enqueues one transfer of `bytes` on the copy stream.
  void enqueue(Method method, Direction direction, std::size_t bytes) {
    const bool h2d = direction == Direction::kH2D;
    const cudaStream_t stream = copy_stream_.get();
    const std::size_t slots = slots_of(method, bytes);
    std::vector<void*>& sources = h2d ? h2d_sources_ : d2h_sources_;
    std::vector<void*>& targets = h2d ? h2d_targets_ : d2h_targets_;
    switch (method) {
      case Method::kMemcpy:
        if (h2d) {
          check(
              cudaMemcpyAsync(device_.get(), pinned_.get(), bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (h2d)");
        } else {
          check(
              cudaMemcpyAsync(pinned_.get(), device_.get(), bytes, cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (d2h)");
        }
        return;
      case Method::kSlotKernel:
      case Method::kSlotKernelDevicePairs: {
        const kc::SlotBatch batch = slot_batch(
            h2d, mapped_.device(),
            method == Method::kSlotKernel ? pairs_.device() : device_pairs_.get(), slots);
        check(kc::launch_copy_slots(batch, stream), "launch_copy_slots");
        return;
      }
      case Method::kT2Kernels: {
        // T2 reads dequantise compressed host slots into full device slots, T2 writes quantise
        // device slots into compressed host ones, as the live cache's T2 moves.
        const kc::SlotBatch batch =
            slot_batch(h2d, compressed_.device(), device_pairs_.get(), slots);
        check(h2d ? kc::launch_dequantise_slots(batch, stream)
                  : kc::launch_quantise_slots(batch, stream),
              h2d ? "launch_dequantise_slots" : "launch_quantise_slots");
        return;
      }
      case Method::kMemcpyBatch:
      case Method::kMemcpyBatchNoHint:
        enqueue_batch(method == Method::kMemcpyBatch, sources, targets, slots);
        return;
      case Method::kMemcpyPerSlot:
        for (std::size_t i = 0; i < slots; ++i) {
          check(cudaMemcpyAsync(targets[i], sources[i], slot_bytes_,
                                h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync (per slot)");
        }
        return;
    }
  }

  // Whether cudaMemcpyBatchAsync takes a one-slot batch here; empty when it does, else why not.
  std::string probe_batch() {
#ifdef KVTIER_BENCH_MEMCPY_BATCH
    const cudaError_t status = call_batch(true, h2d_sources_, h2d_targets_, 1);
    if (status != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return std::string("cudaMemcpyBatchAsync failed: ") + cudaGetErrorName(status);
    }
    check(cudaStreamSynchronize(copy_stream_.get()), "cudaStreamSynchronize (batch probe)");
    return "";
#else
    return "built with CUDA older than 12.8";
#endif
  }

  // T2: quantises every device slot into the compressed pool and dequantises it back, each
  // compared with the host's arithmetic (kernels/impl/kv_quantise.hpp) byte for byte.
  void verify_t2() {
    const std::size_t elements = kMaxBytes / 2;  // BF16
    std::vector<float> values(elements);
    for (std::size_t i = 0; i < elements; ++i) {
      values[i] = static_cast<float>(static_cast<int>((i * 2654435761U) % 2001U) - 1000) / 1000.0F;
    }
    kc::host_from_float(kc::Dtype::kBF16, values.data(), pinned_.get(),
                        static_cast<std::int64_t>(elements));
    kc::host_to_float(kc::Dtype::kBF16, pinned_.get(), values.data(),
                      static_cast<std::int64_t>(elements));  // the values the device holds
    const cudaStream_t stream = copy_stream_.get();
    check(cudaMemcpyAsync(device_.get(), pinned_.get(), kMaxBytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (verify t2)");
    std::memset(compressed_.get(), 0, pool_slots_ * compressed_bytes_);
    const std::size_t all = pool_slots_ * compressed_bytes_;
    enqueue(Method::kT2Kernels, Direction::kD2H, all);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (verify t2)");
    const auto* pairs = reinterpret_cast<const std::uint32_t*>(pairs_.get());
    const std::size_t slot_elements = slot_bytes_ / 2;
    std::vector<std::int8_t> expected(compressed_bytes_);
    std::vector<float> back(slot_elements);
    for (std::size_t i = 0; i < pool_slots_; ++i) {
      const std::uint32_t device_slot = pairs[2 * pool_slots_ + 2 * i];
      const std::uint32_t host_slot = pairs[2 * pool_slots_ + 2 * i + 1];
      kvtier::kernels::quantise::quantise_token(values.data() + device_slot * slot_elements,
                                                kv_heads_, head_dim_, expected.data());
      if (std::memcmp(expected.data(), compressed_.get() + host_slot * compressed_bytes_,
                      compressed_bytes_) != 0) {
        throw Failure("verification failed: t2_kernels d2h slot " + std::to_string(i) +
                      " differs from the host's quantisation");
      }
    }
    check(cudaMemsetAsync(device_.get(), 0, kMaxBytes, stream), "cudaMemsetAsync (verify t2)");
    enqueue(Method::kT2Kernels, Direction::kH2D, all);
    check(cudaMemcpyAsync(pinned_.get(), device_.get(), kMaxBytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (verify t2)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (verify t2)");
    std::vector<std::uint16_t> want(slot_elements);
    for (std::size_t i = 0; i < pool_slots_; ++i) {
      const std::uint32_t host_slot = pairs[2 * i];
      const std::uint32_t device_slot = pairs[2 * i + 1];
      kvtier::kernels::quantise::dequantise_token(
          reinterpret_cast<const std::int8_t*>(compressed_.get() + host_slot * compressed_bytes_),
          kv_heads_, head_dim_, back.data());
      kc::host_from_float(kc::Dtype::kBF16, back.data(), want.data(),
                          static_cast<std::int64_t>(slot_elements));
      if (std::memcmp(want.data(), pinned_.get() + device_slot * slot_bytes_, slot_bytes_) != 0) {
        throw Failure("verification failed: t2_kernels h2d slot " + std::to_string(i) +
                      " differs from the host's dequantisation");
      }
    }
  }

  // Moves every slot of `method`'s largest transfer once and compares target with source.
  void verify(Method method, Direction direction) {
    if (method == Method::kT2Kernels) {
      if (direction == Direction::kH2D) {
        verify_t2();  // both directions
      }
      return;
    }
    const std::size_t bytes =
        point_bytes(method, method == Method::kMemcpyPerSlot ? kPerSlotMaxBytes : kMaxBytes);
    const std::size_t slots = slots_of(method, bytes);
    if (slots == 0) {
      return;
    }
    auto* pattern = reinterpret_cast<std::uint32_t*>(pinned_.get());
    for (std::size_t i = 0; i < kMaxBytes / 4; ++i) {
      pattern[i] = static_cast<std::uint32_t>(i) * 2654435761U + 1U;
    }
    const bool h2d = direction == Direction::kH2D;
    const cudaStream_t stream = copy_stream_.get();
    if (h2d) {
      std::memcpy(mapped_.get(), pinned_.get(), kMaxBytes);
      check(cudaMemsetAsync(device_.get(), 0, kMaxBytes, stream), "cudaMemsetAsync (verify)");
    } else {
      check(
          cudaMemcpyAsync(device_.get(), pinned_.get(), kMaxBytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (verify)");
      std::memset(mapped_.get(), 0, kMaxBytes);
    }
    enqueue(method, direction, bytes);
    if (h2d) {
      check(
          cudaMemcpyAsync(pinned_.get(), device_.get(), kMaxBytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (verify)");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (verify)");
    // h2d: the device's copy is in pinned_, the source in mapped_; d2h the other way round.
    const std::vector<void*>& sources = h2d ? h2d_sources_ : d2h_sources_;
    const std::vector<void*>& targets = h2d ? h2d_targets_ : d2h_targets_;
    const std::byte* source_base = h2d ? mapped_.get() : device_.get();
    const std::byte* target_base = h2d ? device_.get() : mapped_.get();
    const std::byte* source_view = h2d ? mapped_.get() : pinned_.get();
    const std::byte* target_view = h2d ? pinned_.get() : mapped_.get();
    for (std::size_t i = 0; i < slots; ++i) {
      const std::byte* in = source_view + (static_cast<const std::byte*>(sources[i]) - source_base);
      const std::byte* out =
          target_view + (static_cast<const std::byte*>(targets[i]) - target_base);
      if (std::memcmp(in, out, slot_bytes_) != 0) {
        throw Failure(std::string("verification failed: ") + method_name(method) + " " +
                      (h2d ? "h2d" : "d2h") + " slot " + std::to_string(i) + " differs");
      }
    }
  }

  // One pass of the load kernel alone (median of 3, after one untimed).
  double pass_seconds() {
    std::vector<double> times;
    for (int i = 0; i < 4; ++i) {
      check(cudaEventRecord(start_.get(), load_stream_.get()), "cudaEventRecord");
      launch_load();
      check(cudaEventRecord(stop_.get(), load_stream_.get()), "cudaEventRecord");
      check(cudaEventSynchronize(stop_.get()), "cudaEventSynchronize (load pass)");
      if (i > 0) {
        times.push_back(elapsed_seconds(start_, stop_));
      }
    }
    pass_seconds_ = median(times);
    if (!(pass_seconds_ > 0.0) || !std::isfinite(pass_seconds_)) {
      throw Failure("the load kernel's pass took no measurable time");
    }
    return pass_seconds_;
  }

  // The median of REPEATS timed transfers after one untimed; under compute load, each under
  // load passes covering kCoverFactor times `idle_seconds` plus kCoverExtra.
  Point measure(Method method, Direction direction, std::size_t bytes, Load load,
                double idle_seconds) {
    Point point;
    point.bytes = bytes;
    point.copies = copies_of(method, bytes);
    time_once(method, direction, bytes);  // warm-up, idle
    const bool loaded = load == Load::kCompute;
    if (loaded) {
      const double cover = std::min(kCoverMax, kCoverFactor * idle_seconds + kCoverExtra);
      point.load_passes =
          std::min(kMaxPasses, 2 + static_cast<int>(std::ceil(cover / pass_seconds_)));
    }
    std::vector<double> times;
    for (int r = 0; r < repeats_; ++r) {
      if (loaded) {
        bool covered = false;
        times.push_back(time_loaded(method, direction, bytes, point.load_passes, covered));
        point.covered += covered ? 1 : 0;
      } else if (load == Load::kQueued) {
        bool gated = false;
        times.push_back(time_queued(method, direction, bytes, gated));
        point.gated += gated ? 1 : 0;
      } else {
        times.push_back(time_once(method, direction, bytes));
      }
    }
    point.seconds = median(times);
    return point;
  }

 private:
  void launch_load() {
    check(kvtier::bench::launch_load(load_blocks_, load_buffer_.get(), kLoadBytes / 16,
                                     reinterpret_cast<unsigned*>(sink_->get()), load_stream_.get()),
          "load kernel launch");
  }

  double time_once(Method method, Direction direction, std::size_t bytes) {
    check(cudaEventRecord(start_.get(), copy_stream_.get()), "cudaEventRecord");
    enqueue(method, direction, bytes);
    check(cudaEventRecord(stop_.get(), copy_stream_.get()), "cudaEventRecord");
    check(cudaEventSynchronize(stop_.get()), "cudaEventSynchronize (copy)");
    return elapsed_seconds(start_, stop_);
  }

  // The copy issued behind a gate of kGateNanoseconds on the load stream, timed from when the
  // gate opens. `gated`: the copy was issued before it opened (else the time includes issuing).
  double time_queued(Method method, Direction direction, std::size_t bytes, bool& gated) {
    check(kvtier::bench::launch_spin(kGateNanoseconds, load_stream_.get()), "gate kernel launch");
    check(cudaEventRecord(gate_.get(), load_stream_.get()), "cudaEventRecord");
    check(cudaStreamWaitEvent(copy_stream_.get(), gate_.get(), 0), "cudaStreamWaitEvent");
    check(cudaEventRecord(start_.get(), copy_stream_.get()), "cudaEventRecord");
    enqueue(method, direction, bytes);
    check(cudaEventRecord(stop_.get(), copy_stream_.get()), "cudaEventRecord");
    const cudaError_t gate = cudaEventQuery(gate_.get());
    gated = gate == cudaErrorNotReady;
    if (gated) {
      static_cast<void>(cudaGetLastError());  // not ready is no error to keep
    } else {
      check(gate, "cudaEventQuery (gate)");
    }
    check(cudaEventSynchronize(stop_.get()), "cudaEventSynchronize (copy)");
    return elapsed_seconds(start_, stop_);
  }

  // `passes` load passes; the copy is issued once the first has ended. `covered`: the load was
  // still running when the copy ended.
  double time_loaded(Method method, Direction direction, std::size_t bytes, int passes,
                     bool& covered) {
    launch_load();
    check(cudaEventRecord(first_pass_.get(), load_stream_.get()), "cudaEventRecord");
    for (int p = 1; p < passes; ++p) {
      launch_load();
    }
    check(cudaEventRecord(load_end_.get(), load_stream_.get()), "cudaEventRecord");
    check(cudaEventSynchronize(first_pass_.get()), "cudaEventSynchronize (first load pass)");
    check(cudaEventRecord(start_.get(), copy_stream_.get()), "cudaEventRecord");
    enqueue(method, direction, bytes);
    check(cudaEventRecord(stop_.get(), copy_stream_.get()), "cudaEventRecord");
    check(cudaEventSynchronize(stop_.get()), "cudaEventSynchronize (copy)");
    check(cudaEventSynchronize(load_end_.get()), "cudaEventSynchronize (load)");
    covered = elapsed_seconds(stop_, load_end_) > 0.0;
    return elapsed_seconds(start_, stop_);
  }

  void enqueue_batch(bool hint, std::vector<void*>& sources, std::vector<void*>& targets,
                     std::size_t slots) {
#ifdef KVTIER_BENCH_MEMCPY_BATCH
    check(call_batch(hint, sources, targets, slots), "cudaMemcpyBatchAsync");
#else
    static_cast<void>(hint);
    static_cast<void>(sources);
    static_cast<void>(targets);
    static_cast<void>(slots);
    throw Failure("cudaMemcpyBatchAsync needs CUDA 12.8");
#endif
  }

#ifdef KVTIER_BENCH_MEMCPY_BATCH
  cudaError_t call_batch(bool hint, std::vector<void*>& sources, std::vector<void*>& targets,
                         std::size_t slots) {
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = hint ? cudaMemcpyFlagPreferOverlapWithCompute : cudaMemcpyFlagDefault;
    std::size_t first = 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(targets.data(), sources.data(), sizes_.data(), slots, &attributes,
                                &first, 1, copy_stream_.get());
#else
    std::size_t failed = 0;
    return cudaMemcpyBatchAsync(targets.data(), sources.data(), sizes_.data(), slots, &attributes,
                                &first, 1, &failed, copy_stream_.get());
#endif
  }
#endif

  std::size_t slot_bytes_;
  std::size_t pool_slots_;
  int kv_heads_;
  int head_dim_;
  int repeats_;
  int sm_count_ = 0;
  int load_blocks_ = 0;
  double pass_seconds_ = 0.0;
  HostBuffer pinned_;  // memcpy's host side; the readback of verifications
  HostBuffer mapped_;  // the slot methods' host pool (as T1)
  HostBuffer pairs_;   // launch_copy_slots' pairs: h2d's, then d2h's
  DeviceBuffer device_;
  DeviceBuffer device_pairs_;     // pairs_ copied to device memory
  std::size_t compressed_bytes_;  // a T2 slot's
  HostBuffer compressed_;         // the T2 method's host pool (as T2)
  DeviceBuffer load_buffer_;
  std::unique_ptr<DeviceBuffer> sink_;
  std::vector<void*> h2d_sources_;
  std::vector<void*> h2d_targets_;
  std::vector<void*> d2h_sources_;
  std::vector<void*> d2h_targets_;
  std::vector<std::size_t> sizes_;
  // Streams and events last: destroyed first, the streams waiting for their work.
  Event start_;
  Event stop_;
  Event first_pass_;
  Event gate_;
  Event load_end_;
  Stream load_stream_;
  Stream copy_stream_;
};

int usage(const std::string& why) {
  std::cerr << "kvtier_bench_cuda_copy: " << why
            << "\nusage: kvtier_bench_cuda_copy [SLOT_BYTES] [REPEATS] [DEVICE]  (defaults 16384 5 "
               "0; SLOT_BYTES a multiple of 4, 256 .. 64 MiB, REPEATS 1.."
            << kMaxRepeats << ")\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const auto began = Clock::now();
  std::uint64_t slot_bytes = 16384;
  std::uint64_t repeats = 5;
  std::uint64_t device = 0;
  if (argc > 4 || (argc > 1 && !parse_count(argv[1], slot_bytes)) ||
      (argc > 2 && !parse_count(argv[2], repeats)) || (argc > 3 && !parse_count(argv[3], device))) {
    return usage("bad arguments");
  }
  // A BF16 slot is [2][kv_heads * head_dim] two-byte values: 4 * kv_heads * head_dim bytes.
  if (slot_bytes < kMinSlotBytes || slot_bytes % 4 != 0 || slot_bytes > kMaxBytes) {
    return usage("SLOT_BYTES " + std::to_string(slot_bytes) +
                 " is not a BF16 slot size (4 * kv_heads * head_dim) of 256 bytes to 64 MiB");
  }
  if (repeats < 1 || repeats > static_cast<std::uint64_t>(kMaxRepeats)) {
    return usage("REPEATS must be 1.." + std::to_string(kMaxRepeats));
  }
  const std::uint64_t values = slot_bytes / 4;  // kv_heads * head_dim
  const int head_dim = static_cast<int>(values % 128 == 0 ? 128 : values);
  const int kv_heads = static_cast<int>(values / static_cast<std::uint64_t>(head_dim));

  try {
    int devices = 0;
    check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (device >= static_cast<std::uint64_t>(devices)) {
      return usage("no CUDA device " + std::to_string(device) + " (" + std::to_string(devices) +
                   " present)");
    }
    check(cudaSetDevice(static_cast<int>(device)), "cudaSetDevice");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, static_cast<int>(device)),
          "cudaGetDeviceProperties");

    CopyBench bench(static_cast<std::size_t>(slot_bytes), kv_heads, head_dim,
                    static_cast<int>(repeats));
    std::vector<Method> methods = {Method::kMemcpy, Method::kSlotKernel,
                                   Method::kSlotKernelDevicePairs, Method::kT2Kernels};
    std::vector<std::string> unavailable;
    const std::string batch_problem = bench.probe_batch();
    if (batch_problem.empty()) {
      methods.push_back(Method::kMemcpyBatch);
      methods.push_back(Method::kMemcpyBatchNoHint);
    } else {
      unavailable.push_back("memcpy_batch: " + batch_problem);
      std::cerr << "kvtier_bench_cuda_copy: memcpy_batch left out: " << batch_problem << "\n";
    }
    methods.push_back(Method::kMemcpyPerSlot);
    // A method that fails its check or its copies is left out, with the reason, rather than
    // losing the others' figures. (A device fault poisons the context; that still ends it all.)
    const auto leave_out = [&](Method method, const std::string& why) {
      unavailable.push_back(std::string(method_name(method)) + ": " + why);
      std::cerr << "kvtier_bench_cuda_copy: " << method_name(method) << " left out: " << why
                << "\n";
      static_cast<void>(cudaGetLastError());
    };
    std::vector<Method> checked;
    for (const Method method : methods) {
      try {
        if (method != Method::kMemcpy) {
          bench.verify(method, Direction::kH2D);
          bench.verify(method, Direction::kD2H);
        }
        checked.push_back(method);
      } catch (const Failure& failure) {
        leave_out(method, failure.what());
      }
    }
    methods = checked;
    const double pass_seconds = bench.pass_seconds();

    // Sizes: 16 KiB .. 64 MiB.
    std::vector<std::size_t> sizes;
    for (std::size_t size = kMinBytes; size <= kMaxBytes; size *= 2) {
      sizes.push_back(size);
    }
    std::vector<Series> all;
    bool truncated = false;
    const auto out_of_time = [&] {
      truncated =
          truncated || std::chrono::duration<double>(Clock::now() - began).count() > kBudgetSeconds;
      return truncated;
    };
    for (const Method method : methods) {
      std::vector<Series> series;  // the method's, kept only when all of them ran
      try {
        for (const Direction direction : {Direction::kH2D, Direction::kD2H}) {
          Series idle{method, direction, Load::kIdle, {}};
          Series queued{method, direction, Load::kQueued, {}};
          std::map<std::size_t, double> idle_seconds;  // by bytes
          for (const std::size_t size : sizes) {
            const std::size_t bytes = bench.point_bytes(method, size);
            if (bytes == 0 || out_of_time()) {
              continue;
            }
            idle.points.push_back(bench.measure(method, direction, bytes, Load::kIdle, -1.0));
            idle_seconds[bytes] = idle.points.back().seconds;
            queued.points.push_back(bench.measure(method, direction, bytes, Load::kQueued, -1.0));
          }
          Series loaded{method, direction, Load::kCompute, {}};
          for (const std::size_t size : kComputeSizes) {
            const std::size_t bytes = bench.point_bytes(method, size);
            const auto idle_time = idle_seconds.find(bytes);
            if (bytes == 0 || idle_time == idle_seconds.end() || out_of_time()) {
              continue;
            }
            loaded.points.push_back(
                bench.measure(method, direction, bytes, Load::kCompute, idle_time->second));
          }
          series.push_back(std::move(idle));
          series.push_back(std::move(queued));
          series.push_back(std::move(loaded));
        }
      } catch (const Failure& failure) {
        leave_out(method, failure.what());
        continue;
      }
      for (Series& one : series) {
        all.push_back(std::move(one));
      }
    }

    std::ostringstream out;
    out << "{\"bench\":\"cuda_copy\",\"device\":" << json_string(properties.name)
        << ",\"slot_bytes\":" << slot_bytes << ",\"repeats\":" << repeats
        << ",\"kv_heads\":" << kv_heads << ",\"head_dim\":" << head_dim
        << ",\"sm_count\":" << bench.sm_count()
        << ",\"compute_load\":{\"buffer_bytes\":" << kLoadBytes
        << ",\"blocks\":" << bench.load_blocks() << ",\"threads_per_block\":" << kLoadThreads
        << ",\"pass_us\":" << json_number(pass_seconds * 1e6) << "},\"unavailable\":[";
    for (std::size_t i = 0; i < unavailable.size(); ++i) {
      out << (i == 0 ? "" : ",") << json_string(unavailable[i]);
    }
    out << "],\"truncated\":" << (truncated ? "true" : "false") << ",\"series\":[";
    for (std::size_t i = 0; i < all.size(); ++i) {
      out << (i == 0 ? "" : ",") << series_json(all[i]);
    }
    out << "]}\n";
    std::cout << out.str() << std::flush;
  } catch (const Failure& failure) {
    std::cerr << "kvtier_bench_cuda_copy: " << failure.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "kvtier_bench_cuda_copy: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
