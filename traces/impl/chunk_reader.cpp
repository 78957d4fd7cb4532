#include "traces/impl/chunk_reader.hpp"

#include <zlib.h>

#include <H5Zpublic.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "traces/impl/h5.hpp"
#include "traces/impl/half_convert.hpp"

namespace kvtier::traces {

// Chunks hold the file's little-endian bytes and are decoded by assembling them as such.
static_assert(std::endian::native == std::endian::little,
              "the fast read path assumes a little-endian host");

namespace {

using h5::Blame;
using h5::Handle;

// Which filters a dataset declares, when they are ones this path decodes.
struct Filters {
  bool supported = true;
  bool shuffle = false;
  bool deflate = false;
};

Filters filters_of(hid_t creation) {
  Filters filters;
  const int count = H5Pget_nfilters(creation);
  if (count < 0 || count > 2) {
    filters.supported = false;
    return filters;
  }
  for (int i = 0; i < count; ++i) {
    unsigned flags = 0;
    std::size_t values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(creation, static_cast<unsigned>(i), &flags, &values,
                                               nullptr, 0, nullptr, nullptr);
    if (filter == H5Z_FILTER_SHUFFLE && i == 0) {
      filters.shuffle = true;
    } else if (filter == H5Z_FILTER_DEFLATE && !filters.deflate) {
      filters.deflate = true;
    } else {
      filters.supported = false;
    }
  }
  return filters;
}

}  // namespace

std::optional<ChunkReader> ChunkReader::open(hid_t dataset, WeightType type, std::uint32_t lanes,
                                             std::string where_text) {
  const Handle creation(H5Dget_create_plist(dataset), H5Pclose);
  if (!creation.valid() || H5Pget_layout(creation.get()) != H5D_CHUNKED) {
    return std::nullopt;
  }
  const Filters filters = filters_of(creation.get());
  const Handle space(H5Dget_space(dataset), H5Sclose);
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (!filters.supported || rank < 1 || rank > 2 || (lanes > 1 && rank != 2)) {
    return std::nullopt;
  }
  hsize_t dims[2] = {0, 0};
  hsize_t chunk[2] = {0, 0};
  if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0 ||
      H5Pget_chunk(creation.get(), rank, chunk) != rank) {
    return std::nullopt;
  }
  ChunkReader reader;
  reader.dataset_ = dataset;
  reader.type_ = type;
  reader.where_ = std::move(where_text);
  reader.rank_ = rank;
  reader.lanes_ = lanes;
  reader.shuffled_ = filters.shuffle;
  reader.deflated_ = filters.deflate;
  if (lanes > 1) {  // [lanes, columns], chunks [lanes, c]
    if (dims[0] != lanes || chunk[0] != lanes) {
      return std::nullopt;
    }
    reader.chunk_columns_ = chunk[1];
    reader.total_columns_ = dims[1];
  } else if (rank == 2) {  // [rows, width], chunks [r, width]: a flat sequence of r·width
    if (chunk[1] != dims[1]) {
      return std::nullopt;
    }
    reader.row_width_ = dims[1];
    reader.chunk_columns_ = chunk[0] * dims[1];
    reader.total_columns_ = dims[0] * dims[1];
  } else {
    reader.chunk_columns_ = chunk[0];
    reader.total_columns_ = dims[0];
  }
  if (reader.chunk_columns_ == 0 || reader.chunk_columns_ * lanes > (std::uint64_t{1} << 28)) {
    return std::nullopt;
  }
  return reader;
}

void ChunkReader::decode(std::uint64_t index, ChunkScratch& scratch) {
  if (index == decoded_index_) {
    return;
  }
  decoded_index_ = ~std::uint64_t{0};
  const std::size_t element = weight_bytes(type_);
  const std::size_t chunk_bytes = lanes_ * chunk_columns_ * element;
  hsize_t offset[2] = {0, 0};
  const std::uint64_t first = index * chunk_columns_;
  if (lanes_ > 1) {
    offset[1] = first;
  } else {
    offset[0] = rank_ == 2 ? first / row_width_ : first;
  }
  hsize_t stored = 0;
  if (H5Dget_chunk_storage_size(dataset_, offset, &stored) < 0 || stored == 0 ||
      stored > compressBound(static_cast<uLong>(chunk_bytes)) + 4096) {
    h5::raise(Blame::kInput, "missing or damaged chunk " + std::to_string(index), where_);
  }
  scratch.raw.resize(stored);
  std::uint32_t mask = 0;
  h5::check(H5Dread_chunk(dataset_, H5P_DEFAULT, offset, &mask, scratch.raw.data()), Blame::kInput,
            "cannot read a chunk (damaged or truncated file)", where_);
  // Bit i of the mask set: filter i was skipped for this chunk. Shuffle is filter 0 when
  // present, deflate the last one. Unshuffling is left to the read, which takes each element's
  // bytes from their planes directly.
  const unsigned deflate_bit = shuffled_ ? 2U : 1U;
  const bool inflate = deflated_ && (mask & deflate_bit) == 0;
  const bool unshuffle = shuffled_ && (mask & 1U) == 0 && element > 1;
  decoded_.resize(chunk_bytes);
  if (inflate) {
    uLongf size = static_cast<uLongf>(chunk_bytes);
    if (uncompress(decoded_.data(), &size, scratch.raw.data(), static_cast<uLong>(stored)) !=
            Z_OK ||
        size != chunk_bytes) {
      h5::raise(Blame::kInput, "chunk " + std::to_string(index) + " does not inflate", where_);
    }
  } else if (stored != chunk_bytes) {
    h5::raise(Blame::kInput, "chunk " + std::to_string(index) + " has the wrong size", where_);
  } else {
    std::memcpy(decoded_.data(), scratch.raw.data(), chunk_bytes);
  }
  planar_ = unshuffle;
  decoded_index_ = index;
}

bool ChunkReader::read(std::uint64_t first, std::uint64_t count, ChunkScratch& scratch,
                       float* out) {
  if (count == 0) {
    return true;
  }
  if (first + count > total_columns_ || first + count < first) {
    h5::raise(Blame::kInput, "read past the end of the dataset", where_);
  }
  const std::size_t element = weight_bytes(type_);
  const std::size_t chunk_elements = lanes_ * chunk_columns_;
  bool weights = true;
  std::uint64_t done = 0;
  while (done < count) {
    const std::uint64_t column = first + done;
    const std::uint64_t index = column / chunk_columns_;
    const std::uint64_t within = column % chunk_columns_;
    const std::uint64_t take = std::min(count - done, chunk_columns_ - within);
    decode(index, scratch);
    for (std::uint32_t lane = 0; lane < lanes_; ++lane) {
      float* target = out + lane * count + done;
      const std::size_t start = lane * chunk_columns_ + within;
      if (type_ == WeightType::kFloat16) {
        // Element i's low byte is in plane 0 and its high byte in plane 1 when shuffled,
        // side by side otherwise.
        const unsigned char* low = decoded_.data() + (planar_ ? start : 2 * start);
        const unsigned char* high = planar_ ? low + chunk_elements : low + 1;
        const std::size_t stride = planar_ ? 1 : 2;
        weights = byte_planes_to_floats(low, high, stride, target, take) && weights;
      } else {
        for (std::uint64_t i = 0; i < take; ++i) {
          std::uint32_t bits = 0;
          for (std::size_t k = 0; k < element; ++k) {
            const std::size_t at =
                planar_ ? k * chunk_elements + start + i : (start + i) * element + k;
            bits |= static_cast<std::uint32_t>(decoded_[at]) << (8 * k);
          }
          target[i] = std::bit_cast<float>(bits);
          weights = weights && is_weight(target[i]);
        }
      }
    }
    done += take;
  }
  return weights;
}

}  // namespace kvtier::traces
