#pragma once
// The fast read path for attention weights: chunks are fetched raw (H5Dread_chunk) and
// decoded here — inflate into a reused buffer, unshuffle, convert through a table — instead of
// through HDF5's filter pipeline and chunk cache, which allocate and copy each chunk several
// times. Used when a dataset is laid out and filtered the way kvtier writes it (chunks
// spanning the leading dimension, filters none / deflate / shuffle + deflate); any other
// layout falls back to H5Dread, so every valid file still reads. Internal to traces/.

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "traces/format.hpp"

namespace kvtier::traces {

// Buffers shared by all the chunk readers of a trace (only each dataset's last decoded chunk
// is kept per dataset).
struct ChunkScratch {
  std::vector<unsigned char> raw;     // a chunk as stored
  std::vector<std::uint16_t> halves;  // FP16 weights assembled from byte planes
};

class ChunkReader {
 public:
  // A reader for `dataset` of elements `type` when its layout and filters allow the fast path;
  // nullopt otherwise. `lanes` is the leading dimension of a [lanes, columns] dataset whose
  // chunks span all lanes (1 for 1-D datasets and for [rows, width] datasets whose chunks
  // span whole rows, read as one flat sequence).
  static std::optional<ChunkReader> open(hid_t dataset, WeightType type, std::uint32_t lanes,
                                         std::string where_text);

  // Columns [first, first + count) of every lane as float, lane-major, into `out`; returns
  // false when one is no weight (is_weight: NaN, infinite, negative or above 1). DataError when
  // a chunk is damaged.
  bool read(std::uint64_t first, std::uint64_t count, ChunkScratch& scratch, float* out);

 private:
  ChunkReader() = default;
  // Decodes chunk `index` into `decoded_` unless it is the one already there.
  void decode(std::uint64_t index, ChunkScratch& scratch);

  hid_t dataset_ = -1;
  WeightType type_ = WeightType::kFloat16;
  std::string where_;
  int rank_ = 1;
  std::uint32_t lanes_ = 1;
  std::uint64_t row_width_ = 1;      // elements per dataset row when lanes_ == 1 and rank 2
  std::uint64_t chunk_columns_ = 0;  // per lane
  std::uint64_t total_columns_ = 0;
  bool shuffled_ = false;
  bool deflated_ = false;
  // The last chunk decoded: lanes × chunk_columns elements, inflated but, when `planar_`,
  // still in shuffled byte planes (the read assembles elements straight from the planes).
  std::vector<unsigned char> decoded_;
  bool planar_ = false;
  std::uint64_t decoded_index_ = ~std::uint64_t{0};
};

}  // namespace kvtier::traces
