#include "traces/impl/chunk_stream.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "traces/impl/h5.hpp"

namespace kvtier::traces {

ChunkStream::ChunkStream(hid_t dataset, ChunkGeometry geometry, int deflate_level,
                         std::string where_text, ChunkPipeline& pipeline)
    : pipeline_(pipeline),
      dataset_(dataset),
      geometry_(geometry),
      deflate_level_(deflate_level),
      where_(std::move(where_text)),
      chunk_bytes_(geometry.lanes * geometry.chunk_columns * geometry.element_bytes) {}

void ChunkStream::append(const void* lane_major, std::uint64_t columns) {
  if (written_ + filled_ + columns > geometry_.total_columns) {
    h5::raise(h5::Blame::kOutput,
              "more data appended than the dataset holds (" +
                  std::to_string(written_ + filled_ + columns) + " > " +
                  std::to_string(geometry_.total_columns) + " elements)",
              where_);
  }
  const auto* source = static_cast<const unsigned char*>(lane_major);
  const std::size_t bytes = geometry_.element_bytes;
  std::uint64_t done = 0;
  while (done < columns) {
    chunk_.reserve(chunk_bytes_);  // no-op unless the buffer is new or was a smaller chunk's
    const std::uint64_t take = std::min(columns - done, geometry_.chunk_columns - filled_);
    for (std::uint32_t lane = 0; lane < geometry_.lanes; ++lane) {
      std::memcpy(chunk_.data() + (lane * geometry_.chunk_columns + filled_) * bytes,
                  source + (lane * columns + done) * bytes, take * bytes);
    }
    filled_ += take;
    done += take;
    if (filled_ == geometry_.chunk_columns) {
      flush_chunk();
    }
  }
}

void ChunkStream::flush_chunk() {
  const std::size_t bytes = geometry_.element_bytes;
  // Edge chunks are stored whole in HDF5; the part past the dataset's end is zero. (The buffer
  // is reused, so everything not appended is cleared here.)
  if (filled_ < geometry_.chunk_columns) {
    for (std::uint32_t lane = 0; lane < geometry_.lanes; ++lane) {
      std::memset(chunk_.data() + (lane * geometry_.chunk_columns + filled_) * bytes, 0,
                  (geometry_.chunk_columns - filled_) * bytes);
    }
  }
  std::unique_ptr<ChunkJob> job = pipeline_.acquire();
  job->dataset = dataset_;
  const std::uint64_t first_column = chunk_index_ * geometry_.chunk_columns;
  job->offset[0] = 0;
  job->offset[1] = 0;
  if (geometry_.lanes > 1) {
    job->offset[1] = first_column;
  } else if (geometry_.rank == 2) {
    job->offset[0] = first_column / geometry_.row_width;
  } else {
    job->offset[0] = first_column;
  }
  job->data.swap(chunk_);  // the stream goes on in the buffer of a chunk already written
  job->size = chunk_bytes_;
  job->fill = {geometry_.lanes, geometry_.chunk_columns, filled_};
  job->element_bytes = bytes;
  job->level = deflate_level_;
  job->where = where_;
  pipeline_.submit(std::move(job));
  written_ += filled_;
  filled_ = 0;
  ++chunk_index_;
}

void ChunkStream::finish() {
  if (finished_) {
    return;
  }
  if (filled_ > 0) {
    flush_chunk();
  }
  if (written_ != geometry_.total_columns) {
    h5::raise(h5::Blame::kOutput,
              "incomplete dataset: " + std::to_string(written_) + " of " +
                  std::to_string(geometry_.total_columns) + " elements written",
              where_);
  }
  finished_ = true;
}

}  // namespace kvtier::traces
