#pragma once
// Compresses chunks on worker threads and writes them (H5Dwrite_chunk) on the calling thread,
// in the order they were submitted. Internal to traces/.
//
// Why: deflate is most of a writer's time, and it parallelises per chunk. HDF5 (a serial build)
// is only ever called from the calling thread, and writing in submission order makes the file
// the same byte for byte whatever the number of threads. At most a few chunks per worker are
// in flight, so memory stays bounded.

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

// Compresses one chunk (already shuffled into `planes` byte planes when planes > 1) into `out`
// as one zlib stream and returns its length, or 0 when level 1 finds it not worth deflating;
// chunk_pipeline.cpp says what level 1 does.
std::size_t deflate_chunk(const unsigned char* input, std::size_t size, std::size_t planes,
                          int level, std::vector<unsigned char>& out,
                          const std::string& where_text);

// One chunk to encode and write.
struct ChunkJob {
  hid_t dataset = -1;
  hsize_t offset[2] = {0, 0};
  std::vector<std::byte> data;  // the chunk in element order
  std::size_t element_bytes = 2;
  int level = 1;  // 0: written as it is
  std::string where;
  // Filled by the encoder.
  std::vector<unsigned char> encoded;
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
  // Stops the workers; chunks not yet written are dropped (the file is being abandoned).
  ~ChunkPipeline();

  void submit(std::unique_ptr<ChunkJob> job);
  // Writes every submitted chunk; throws the first failure.
  void drain();

 private:
  static void encode(ChunkJob& job) noexcept;
  void write_oldest();
  void work();

  std::size_t window_;
  std::deque<std::unique_ptr<ChunkJob>> in_flight_;  // submission order
  std::deque<ChunkJob*> to_encode_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvtier::traces
