#include "traces/impl/chunk_pipeline.hpp"

#include <zlib.h>

#include <array>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "traces/impl/h5.hpp"

namespace kvtier::traces {
namespace {

using Histogram = std::array<std::uint32_t, 256>;

// Counts byte values. Eight tables, added up at the end, so that runs of one byte value (the
// exponent planes of FP16 weights, zeros) do not wait on the increments of a single counter.
class ByteCounter {
 public:
  void add(const unsigned char* data, std::size_t size) {
    std::size_t i = 0;
    for (; i + 8 <= size; i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, data + i, sizeof(word));
      for (std::size_t table = 0; table < tables_.size(); ++table) {
        ++tables_[table][(word >> (8 * table)) & 0xFFU];
      }
    }
    for (; i < size; ++i) {
      ++tables_[0][data[i]];
    }
  }

  [[nodiscard]] Histogram total() const {
    Histogram counts{};
    for (std::size_t value = 0; value < counts.size(); ++value) {
      for (const Histogram& table : tables_) {
        counts[value] += table[value];
      }
    }
    return counts;
  }

 private:
  std::array<Histogram, 8> tables_{};
};

// Bits per byte of a histogram of `size` bytes: 8 for random bytes.
double byte_entropy(const Histogram& counts, std::size_t size) {
  double entropy = 0.0;
  for (const std::uint32_t count : counts) {
    if (count > 0) {
      const double p = static_cast<double>(count) / static_cast<double>(size);
      entropy -= p * std::log2(p);
    }
  }
  return entropy;
}

// The histogram of one byte plane of `plane_bytes` bytes laid out as `fill` says: only the
// filled parts are read, the zeros after them are counted.
Histogram plane_histogram(const unsigned char* plane, std::size_t plane_bytes,
                          const ChunkFill& fill) {
  ByteCounter counter;
  if (fill.lanes * fill.lane_elements != plane_bytes || fill.filled_elements > fill.lane_elements) {
    counter.add(plane, plane_bytes);
    return counter.total();
  }
  for (std::size_t lane = 0; lane < fill.lanes; ++lane) {
    counter.add(plane + lane * fill.lane_elements, fill.filled_elements);
  }
  Histogram counts = counter.total();
  counts[0] += static_cast<std::uint32_t>(fill.lanes * (fill.lane_elements - fill.filled_elements));
  return counts;
}

// HDF5's shuffle filter for `count` elements of `Bytes` bytes: byte k of each element goes to
// plane k, `plane_stride` bytes after plane k - 1. A fixed element size lets the compiler
// vectorise the byte transposition.
template <std::size_t Bytes>
void shuffle_elements(const unsigned char* input, std::size_t count, unsigned char* output,
                      std::size_t plane_stride) {
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t k = 0; k < Bytes; ++k) {
      output[k * plane_stride + i] = input[i * Bytes + k];
    }
  }
}

void shuffle_elements(const unsigned char* input, std::size_t count, std::size_t bytes,
                      unsigned char* output, std::size_t plane_stride) {
  switch (bytes) {
    case 2: shuffle_elements<2>(input, count, output, plane_stride); return;
    case 4: shuffle_elements<4>(input, count, output, plane_stride); return;
    case 8: shuffle_elements<8>(input, count, output, plane_stride); return;
    default:
      for (std::size_t i = 0; i < count; ++i) {
        for (std::size_t k = 0; k < bytes; ++k) {
          output[k * plane_stride + i] = input[i * bytes + k];
        }
      }
  }
}

// Shuffles a chunk of `size` bytes laid out as `fill` says into `output`: the filled parts are
// transposed, the zeros after them written as zeros (what transposing them would give).
void shuffle_chunk(const unsigned char* input, std::size_t size, std::size_t bytes,
                   const ChunkFill& fill, unsigned char* output) {
  const std::size_t elements = size / bytes;
  if (fill.lanes * fill.lane_elements != elements || fill.filled_elements > fill.lane_elements) {
    shuffle_elements(input, elements, bytes, output, elements);
    return;
  }
  const std::size_t padding = fill.lane_elements - fill.filled_elements;
  for (std::size_t lane = 0; lane < fill.lanes; ++lane) {
    const std::size_t first = lane * fill.lane_elements;
    shuffle_elements(input + first * bytes, fill.filled_elements, bytes, output + first, elements);
    for (std::size_t k = 0; padding > 0 && k < bytes; ++k) {
      std::memset(output + k * elements + first + fill.filled_elements, 0, padding);
    }
  }
}

// Above this many bits per byte a byte plane is stored rather than Huffman-coded: coding it
// would save under a quarter of its size, while decoding literals is most of a reader's time
// (stored blocks inflate at memory speed). The low bytes of FP16 attention weights (random
// mantissa bits) land here; the high bytes (sign and exponent) do not.
constexpr double kStoreAboveBitsPerByte = 6.0;

// Level 1 writes a chunk without deflate (the filter skipped for that chunk, which HDF5's
// optional deflate filter allows) when coding would save less than a quarter of it: such
// chunks (full-entropy weights) then read at memory speed instead of at zlib's Huffman decoding
// speed, for at most a third more disk.
constexpr double kStoreAboveShare = 0.75;

// Element sizes up to this many bytes keep their planes' entropies on the stack.
constexpr std::size_t kMaxStackPlanes = 8;

voidpf zlib_allocate(voidpf opaque, uInt items, uInt size) {
  return static_cast<ZlibMemory*>(opaque)->allocate(std::size_t{items} * size);
}

void zlib_free(voidpf /*opaque*/, voidpf /*address*/) {}  // ZlibMemory::release_all

// Ends an initialised deflate stream when it goes out of scope, and frees its memory for the
// next chunk.
class DeflateEnd {
 public:
  DeflateEnd(z_stream& stream, ZlibMemory& memory) : stream_(stream), memory_(memory) {}
  DeflateEnd(const DeflateEnd&) = delete;
  DeflateEnd& operator=(const DeflateEnd&) = delete;
  DeflateEnd(DeflateEnd&&) = delete;
  DeflateEnd& operator=(DeflateEnd&&) = delete;
  ~DeflateEnd() {
    deflateEnd(&stream_);
    memory_.release_all();
  }

 private:
  z_stream& stream_;
  ZlibMemory& memory_;
};

}  // namespace

void* ZlibMemory::allocate(std::size_t bytes) noexcept {
  try {
    if (used_ == blocks_.size()) {
      blocks_.emplace_back();
    }
    ByteBuffer& block = blocks_[used_];
    block.reserve(bytes);
    ++used_;
    return block.data();
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

void ByteBuffer::reserve(std::size_t bytes) {
  if (bytes > capacity_) {
    bytes_ = std::make_unique_for_overwrite<unsigned char[]>(bytes);
    capacity_ = bytes;
  }
}

void ByteBuffer::swap(ByteBuffer& other) noexcept {
  std::swap(bytes_, other.bytes_);
  std::swap(capacity_, other.capacity_);
}

std::size_t deflate_bound(std::size_t size) {
  // Stored blocks grow the data by 5 bytes per 16 KiB at most; compressBound covers deflate.
  return compressBound(static_cast<uLong>(size)) + size / 1024 + 64;
}

// One zlib stream per chunk, as HDF5's deflate filter expects. Level 1 is kvtier's fast mode:
// each shuffled byte plane is either run-length + Huffman coded (Z_RLE: finds the runs of
// equal exponent bytes and zeros that make up most of the gain, at a fraction of the cost of
// a match search) or, when it looks random, stored. Levels 2..9 are zlib's usual deflate at
// that level, for the smallest files. Either way the stream is plain deflate that every
// inflate (HDF5's filter included) decodes.
std::size_t deflate_chunk(const unsigned char* input, std::size_t size, std::size_t planes,
                          const ChunkFill& fill, int level, ByteBuffer& out, ZlibMemory& memory,
                          const std::string& where_text) {
  z_stream stream{};
  stream.zalloc = zlib_allocate;
  stream.zfree = zlib_free;
  stream.opaque = &memory;
  const bool fast = level == 1;
  const std::size_t plane_bytes = size / planes;
  std::array<double, kMaxStackPlanes> stack_entropy{};
  std::vector<double> heap_entropy;
  double* entropy = stack_entropy.data();
  if (planes > kMaxStackPlanes) {
    heap_entropy.assign(planes, 0.0);
    entropy = heap_entropy.data();
  }
  double estimate = 0.0;  // bytes after coding, by the planes' entropies
  for (std::size_t plane = 0; fast && plane < planes; ++plane) {
    entropy[plane] =
        byte_entropy(plane_histogram(input + plane * plane_bytes, plane_bytes, fill), plane_bytes);
    estimate += static_cast<double>(plane_bytes) *
                (entropy[plane] > kStoreAboveBitsPerByte ? 1.0 : entropy[plane] / 8.0);
  }
  if (fast && estimate > kStoreAboveShare * static_cast<double>(size)) {
    return 0;
  }
  auto plane_level = [&](std::size_t plane) {
    return fast && entropy[plane] > kStoreAboveBitsPerByte ? 0 : level;
  };
  const int strategy = fast ? Z_RLE : Z_DEFAULT_STRATEGY;
  int current = fast ? plane_level(0) : level;
  if (deflateInit2(&stream, current, Z_DEFLATED, 15, 8, strategy) != Z_OK) {
    memory.release_all();
    h5::raise(h5::Blame::kOutput, "deflate failed", where_text);
  }
  bool ok = true;
  std::size_t written = 0;
  {
    const DeflateEnd end(stream, memory);
    // The room offered is always deflate_bound(size), whatever `out` holds: how zlib cuts stored
    // blocks depends on it, and the bytes must not depend on which buffer a chunk reuses.
    const std::size_t room = deflate_bound(size);
    out.reserve(room);
    stream.next_out = out.data();
    stream.avail_out = static_cast<uInt>(room);
    const std::size_t steps = fast ? planes : 1;
    for (std::size_t plane = 0; plane < steps && ok; ++plane) {
      if (fast && plane > 0) {
        const int wanted = plane_level(plane);
        if (wanted != current) {
          ok = deflateParams(&stream, wanted, strategy) == Z_OK;
          current = wanted;
        }
      }
      const std::size_t begin = fast ? plane * plane_bytes : 0;
      const std::size_t length = fast ? (plane + 1 == steps ? size - begin : plane_bytes) : size;
      stream.next_in = const_cast<unsigned char*>(input + begin);  // zlib's API is not const
      stream.avail_in = static_cast<uInt>(length);
      const int flush = plane + 1 == steps ? Z_FINISH : Z_NO_FLUSH;
      const int status = deflate(&stream, flush);
      ok = ok && (flush == Z_FINISH ? status == Z_STREAM_END : status == Z_OK) &&
           stream.avail_in == 0;
    }
    written = stream.total_out;
  }
  if (!ok) {
    h5::raise(h5::Blame::kOutput, "deflate failed", where_text);
  }
  return written;
}

ChunkPipeline::ChunkPipeline(unsigned workers) : window_(4 * std::size_t{workers} + 2) {
  for (unsigned i = 0; i < workers; ++i) {
    workers_.emplace_back([this] { work(); });
  }
}

ChunkPipeline::~ChunkPipeline() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();
  }
}

void ChunkPipeline::encode(ChunkJob& job, Encoder& encoder) noexcept {
  try {
    if (job.level == 0) {
      job.encoded_bytes = job.size;
      return;
    }
    const std::size_t bytes = job.element_bytes;
    const unsigned char* input = job.data.data();
    if (bytes > 1) {
      // HDF5's shuffle filter: byte k of every element, for k = 0 .. bytes-1, in turn.
      encoder.shuffled.reserve(job.size);
      shuffle_chunk(input, job.size, bytes, job.fill, encoder.shuffled.data());
      input = encoder.shuffled.data();
    }
    // In the planes (or the unshuffled bytes) an element is one byte.
    job.encoded_bytes = deflate_chunk(input, job.size, bytes, job.fill, job.level, job.encoded,
                                      encoder.zlib, job.where);
    if (job.encoded_bytes == 0) {  // not worth deflating: store the (shuffled) chunk as it is
      const std::size_t deflate_filter = bytes > 1 ? 1 : 0;  // after shuffle, when present
      job.filter_mask = 1U << deflate_filter;
      if (bytes > 1) {
        job.encoded.swap(encoder.shuffled);  // the shuffled chunk is the payload
      } else {
        job.encoded.reserve(job.size);
        std::memcpy(job.encoded.data(), input, job.size);
      }
      job.encoded_bytes = job.size;
    }
  } catch (const std::exception& error) {
    job.error = error.what();
  }
}

void ChunkPipeline::work() {
  Encoder encoder;
  while (true) {
    ChunkJob* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || !to_encode_.empty(); });
      if (stopping_) {
        return;
      }
      job = to_encode_.front();
      to_encode_.pop_front();
    }
    encode(*job, encoder);
    {
      const std::lock_guard lock(mutex_);
      job->done = true;
    }
    job_done_.notify_all();
  }
}

std::unique_ptr<ChunkJob> ChunkPipeline::acquire() {
  if (written_.empty()) {
    return std::make_unique<ChunkJob>();
  }
  std::unique_ptr<ChunkJob> job = std::move(written_.back());
  written_.pop_back();
  return job;
}

void ChunkPipeline::submit(std::unique_ptr<ChunkJob> job) {
  job->encoded_bytes = 0;
  job->filter_mask = 0;
  job->error.clear();
  job->done = false;
  if (workers_.empty()) {
    encode(*job, caller_encoder_);
    job->done = true;
    in_flight_.push_back(std::move(job));
    write_oldest();
    return;
  }
  {
    const std::lock_guard lock(mutex_);
    to_encode_.push_back(job.get());
    in_flight_.push_back(std::move(job));
  }
  work_ready_.notify_one();
  while (in_flight_.size() > window_) {
    write_oldest();
  }
}

void ChunkPipeline::write_oldest() {
  ChunkJob* job = in_flight_.front().get();
  {
    std::unique_lock lock(mutex_);
    job_done_.wait(lock, [job] { return job->done; });
  }
  if (!job->error.empty()) {
    h5::raise(h5::Blame::kOutput, job->error, job->where);
  }
  const void* payload = job->level == 0 ? static_cast<const void*>(job->data.data())
                                        : static_cast<const void*>(job->encoded.data());
  h5::check(H5Dwrite_chunk(job->dataset, H5P_DEFAULT, job->filter_mask, job->offset,
                           job->encoded_bytes, payload),
            h5::Blame::kOutput, "cannot write a chunk", job->where);
  written_.push_back(std::move(in_flight_.front()));
  in_flight_.pop_front();
}

void ChunkPipeline::drain() {
  while (!in_flight_.empty()) {
    write_oldest();
  }
}

}  // namespace kvtier::traces
