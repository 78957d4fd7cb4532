#pragma once
// Writes one chunked dataset front to back, a chunk at a time, compressing each chunk itself
// (through a ChunkPipeline) and handing it to H5Dwrite_chunk. Internal to traces/.
//
// Why not H5Dwrite with HDF5's filters: appending rows of varying length through hyperslab
// writes makes HDF5 read back, re-filter and rewrite partly filled chunks, and its pipeline
// copies each chunk several times. Writing whole chunks directly keeps the writer at memory
// speed apart from deflate. The bytes written are exactly what HDF5's shuffle and deflate
// filters produce (byte transposition, then zlib's compress2), and the dataset declares those
// filters, so every HDF5 reader (h5dump included) decodes the chunks as usual.

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "traces/impl/chunk_pipeline.hpp"

namespace kvtier::traces {

// How a stream's elements map onto the dataset.
struct ChunkGeometry {
  // Lanes are written side by side: a [lanes, columns] dataset chunked [lanes, chunk_columns]
  // (per-head rows, one lane per head). With one lane the dataset is either 1-D [columns] or
  // 2-D [columns / row_width, row_width] with chunks spanning whole rows (top-k rows).
  std::uint32_t lanes = 1;
  std::uint32_t row_width = 1;  // elements per dataset row when lanes == 1 and rank is 2
  int rank = 1;
  std::uint64_t chunk_columns = 0;  // elements per lane in one chunk
  std::uint64_t total_columns = 0;  // elements per lane in the whole dataset
  std::size_t element_bytes = 2;
};

class ChunkStream {
 public:
  // `dataset` stays owned by the caller and must outlive the stream. `deflate_level` 0 writes
  // chunks uncompressed (the dataset then declares no filters).
  ChunkStream(hid_t dataset, ChunkGeometry geometry, int deflate_level, std::string where_text,
              ChunkPipeline& pipeline);

  // Appends `columns` columns. `lane_major` holds lanes × columns elements: lane 0's columns,
  // then lane 1's, each element `element_bytes` long in file byte order.
  void append(const void* lane_major, std::uint64_t columns);

  // Writes the last, partly filled chunk (zero padded, as HDF5 stores edge chunks) and checks
  // that the dataset received exactly `total_columns` columns.
  void finish();

  [[nodiscard]] std::uint64_t written_columns() const noexcept { return written_; }
  [[nodiscard]] bool finished() const noexcept { return finished_; }

 private:
  void flush_chunk();

  ChunkPipeline& pipeline_;
  hid_t dataset_;
  ChunkGeometry geometry_;
  int deflate_level_;
  std::string where_;
  std::size_t chunk_bytes_;  // lanes × chunk_columns elements
  // The chunk being filled; handed to the pipeline when full, for a written one's buffer.
  ByteBuffer chunk_;
  std::uint64_t filled_ = 0;  // columns in the current chunk
  std::uint64_t written_ = 0;
  std::uint64_t chunk_index_ = 0;
  bool finished_ = false;
};

}  // namespace kvtier::traces
