#include "traces/impl/chunk_pipeline.hpp"

#include <zlib.h>

#include <array>
#include <cmath>

#include "common/errors.hpp"
#include "traces/impl/h5.hpp"

namespace kvtier::traces {
namespace {

// Bits per byte of a byte sequence's histogram: 8 for random bytes.
double byte_entropy(const unsigned char* data, std::size_t size) {
  std::array<std::uint32_t, 256> counts{};
  for (std::size_t i = 0; i < size; ++i) {
    ++counts[data[i]];
  }
  double entropy = 0.0;
  for (const std::uint32_t count : counts) {
    if (count > 0) {
      const double p = static_cast<double>(count) / static_cast<double>(size);
      entropy -= p * std::log2(p);
    }
  }
  return entropy;
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

}  // namespace

// One zlib stream per chunk, as HDF5's deflate filter expects. Level 1 is kvtier's fast mode:
// each shuffled byte plane is either run-length + Huffman coded (Z_RLE: finds the runs of
// equal exponent bytes and zeros that make up most of the gain, at a fraction of the cost of
// a match search) or, when it looks random, stored. Levels 2..9 are zlib's usual deflate at
// that level, for the smallest files. Either way the stream is plain deflate that every
// inflate (HDF5's filter included) decodes.
std::size_t deflate_chunk(const unsigned char* input, std::size_t size, std::size_t planes,
                          int level, std::vector<unsigned char>& out,
                          const std::string& where_text) {
  z_stream stream{};
  const bool fast = level == 1;
  const std::size_t plane_bytes = size / planes;
  std::vector<double> entropy(planes, 0.0);
  double estimate = 0.0;  // bytes after coding, by the planes' entropies
  for (std::size_t plane = 0; fast && plane < planes; ++plane) {
    entropy[plane] = byte_entropy(input + plane * plane_bytes, plane_bytes);
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
    h5::raise(h5::Blame::kOutput, "deflate failed", where_text);
  }
  // Stored blocks grow the data by 5 bytes per 16 KiB at most; compressBound covers deflate.
  out.resize(compressBound(static_cast<uLong>(size)) + size / 1024 + 64);
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  bool ok = true;
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
    ok =
        ok && (flush == Z_FINISH ? status == Z_STREAM_END : status == Z_OK) && stream.avail_in == 0;
  }
  const std::size_t written = stream.total_out;
  deflateEnd(&stream);
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

void ChunkPipeline::encode(ChunkJob& job) noexcept {
  try {
    if (job.level == 0) {
      job.encoded_bytes = job.data.size();
      return;
    }
    const std::size_t bytes = job.element_bytes;
    const auto* input = reinterpret_cast<const unsigned char*>(job.data.data());
    std::vector<unsigned char> shuffled;
    if (bytes > 1) {
      // HDF5's shuffle filter: byte k of every element, for k = 0 .. bytes-1, in turn.
      shuffled.resize(job.data.size());
      const std::size_t elements = job.data.size() / bytes;
      for (std::size_t k = 0; k < bytes; ++k) {
        unsigned char* plane = shuffled.data() + k * elements;
        for (std::size_t i = 0; i < elements; ++i) {
          plane[i] = input[i * bytes + k];
        }
      }
      input = shuffled.data();
    }
    job.encoded_bytes =
        deflate_chunk(input, job.data.size(), bytes, job.level, job.encoded, job.where);
    if (job.encoded_bytes == 0) {  // not worth deflating: store the (shuffled) chunk as it is
      const std::size_t deflate_filter = bytes > 1 ? 1 : 0;  // after shuffle, when present
      job.filter_mask = 1U << deflate_filter;
      job.encoded.assign(input, input + job.data.size());
      job.encoded_bytes = job.data.size();
    }
  } catch (const std::exception& error) {
    job.error = error.what();
  }
}

void ChunkPipeline::work() {
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
    encode(*job);
    {
      const std::lock_guard lock(mutex_);
      job->done = true;
    }
    job_done_.notify_all();
  }
}

void ChunkPipeline::submit(std::unique_ptr<ChunkJob> job) {
  if (workers_.empty()) {
    encode(*job);
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
  in_flight_.pop_front();
}

void ChunkPipeline::drain() {
  while (!in_flight_.empty()) {
    write_oldest();
  }
}

}  // namespace kvtier::traces
