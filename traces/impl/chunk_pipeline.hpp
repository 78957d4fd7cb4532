#pragma once
// Compresses chunks on worker threads and writes them (H5Dwrite_chunk) on the calling thread,
// in the order they were submitted. Internal to traces/.
//
// Why: deflate is most of a writer's time, and it parallelises per chunk. HDF5 (a serial build)
// is only ever called from the calling thread, and writing in submission order makes the file
// the same byte for byte whatever the number of threads (the writer drains the pipeline before
// it writes a dataset itself). At most a few chunks per worker are in flight, so memory stays
// bounded.
//
// Nothing is allocated per chunk once a writer is under way: written jobs (their chunk and
// compressed buffers) return to a pool that the next chunks reuse, and every worker keeps its
// own shuffle buffer and zlib memory. Buffers are never zero-filled; every byte that is read was
// written.

#include <hdf5.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::traces {

// A byte buffer that keeps its memory when reused: contents are undefined after reserve(), which
// only ever grows it.
class ByteBuffer {
 public:
  // At least `bytes` bytes; contents are lost when it has to grow.
  void reserve(std::size_t bytes);
  [[nodiscard]] unsigned char* data() noexcept { return bytes_.get(); }
  [[nodiscard]] const unsigned char* data() const noexcept { return bytes_.get(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  void swap(ByteBuffer& other) noexcept;

 private:
  std::unique_ptr<unsigned char[]> bytes_;
  std::size_t capacity_ = 0;
};

// Memory for zlib's deflate state, kept from one chunk to the next: every deflateInit2 asks for
// the same blocks (state, window, hash chains and heads, pending output, ~260 KB), and handing
// back the previous chunk's saves allocating, and on worker threads page-faulting, them for
// every chunk (an arena trims freed memory). zlib's output does not depend on where its memory
// comes from.
class ZlibMemory {
 public:
  // The next block, of at least `bytes` bytes; nullptr when out of memory (zlib's convention).
  void* allocate(std::size_t bytes) noexcept;
  // Every block is free again (after deflateEnd).
  void release_all() noexcept { used_ = 0; }

 private:
  std::vector<ByteBuffer> blocks_;
  std::size_t used_ = 0;
};

// Where a chunk holds data: `lanes` runs of `lane_elements` elements each, of which only the
// first `filled_elements` were appended; the rest is zero (the padding of an edge chunk). The
// encoder then shuffles and counts only the filled parts (the result is the same).
struct ChunkFill {
  std::size_t lanes = 1;
  std::size_t lane_elements = 0;
  std::size_t filled_elements = 0;
};

// Room for the zlib stream of a `size`-byte chunk (what deflate_chunk may write).
[[nodiscard]] std::size_t deflate_bound(std::size_t size);

// Compresses one chunk (already shuffled into `planes` byte planes when planes > 1, each plane
// laid out as `fill` says, with elements of one byte) into `out` as one zlib stream and returns
// its length, or 0 when level 1 finds it not worth deflating; chunk_pipeline.cpp says what
// level 1 does. zlib's memory comes from `memory`.
std::size_t deflate_chunk(const unsigned char* input, std::size_t size, std::size_t planes,
                          const ChunkFill& fill, int level, ByteBuffer& out, ZlibMemory& memory,
                          const std::string& where_text);

// One chunk to encode and write.
struct ChunkJob {
  hid_t dataset = -1;
  hsize_t offset[2] = {0, 0};
  ByteBuffer data;       // the chunk in element order: `size` bytes
  std::size_t size = 0;  // bytes of the chunk
  ChunkFill fill;        // which elements of `data` were appended; the others are zero
  std::size_t element_bytes = 2;
  int level = 1;  // 0: written as it is
  std::string where;
  // Filled by the encoder.
  ByteBuffer encoded;
  std::size_t encoded_bytes = 0;
  std::uint32_t filter_mask = 0;  // bit i set: filter i skipped for this chunk
  std::string error;
  bool done = false;
};

class ChunkPipeline {
 public:
  // `workers` 0 encodes on the calling thread.
  explicit ChunkPipeline(unsigned workers);
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;
  ChunkPipeline(ChunkPipeline&&) = delete;
  ChunkPipeline& operator=(ChunkPipeline&&) = delete;
  // Stops the workers; chunks not yet written are dropped (the file is being abandoned).
  ~ChunkPipeline();

  // A job to fill and submit: a written one when there is one (its buffers keep their memory),
  // else a new one. Its fields are to be set by the caller; `data` holds whatever it held.
  [[nodiscard]] std::unique_ptr<ChunkJob> acquire();
  void submit(std::unique_ptr<ChunkJob> job);
  // Writes every submitted chunk; throws the first failure.
  void drain();

 private:
  // A worker's (or the calling thread's) scratch, reused for every chunk it encodes.
  struct Encoder {
    ByteBuffer shuffled;
    ZlibMemory zlib;
  };

  static void encode(ChunkJob& job, Encoder& encoder) noexcept;
  void write_oldest();
  void work();

  std::size_t window_;
  std::deque<std::unique_ptr<ChunkJob>> in_flight_;  // submission order
  std::vector<std::unique_ptr<ChunkJob>> written_;   // free jobs, only touched by the caller
  Encoder caller_encoder_;                           // when there are no workers
  std::deque<ChunkJob*> to_encode_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvtier::traces
