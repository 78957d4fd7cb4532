#include "traces/impl/h5.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/errors.hpp"

namespace kvtier::traces::h5 {
namespace {

// HDF5 1.10 closes every file still open from an atexit handler. A file whose flush failed
// (disk full, file size limit) stays open after its failed H5Fclose, and closing it again at
// exit crashes inside the library (H5F__close_cb), turning a clean "cannot write" error into a
// segfault. kvtier closes every file it opens itself and checks the close, so the handler has
// nothing to do; it is turned off before the library initialises, which only works from a
// static initialiser (the first HDF5 call may come from any module). H5dont_atexit is C: it
// cannot throw, though it is not declared noexcept.
// NOLINTNEXTLINE(cert-err58-cpp)
[[maybe_unused]] const bool kNoCloseAtExit = []() noexcept {
  (void)H5dont_atexit();
  return true;
}();

}  // namespace

std::string where(const std::string& file, std::string_view object) {
  if (object.empty()) {
    return file;
  }
  std::string text = file;
  text += ", dataset ";
  text += object;
  return text;
}

void raise(Blame blame, const std::string& what, const std::string& where_text) {
  if (blame == Blame::kInput) {
    throw DataError(what, where_text);
  }
  throw Error(what, where_text, ExitCode::kRuntimeFailure);
}

void silence_library_errors() noexcept {
  (void)H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = std::exchange(other.id_, -1);
    closer_ = other.closer_;
  }
  return *this;
}

bool Handle::reset() noexcept {
  bool ok = true;
  if (id_ >= 0 && closer_ != nullptr) {
    ok = closer_(id_) >= 0;
  }
  id_ = -1;
  return ok;
}

Handle checked(hid_t id, Handle::Closer closer, Blame blame, const char* what,
               const std::string& where_text) {
  if (id < 0) {
    raise(blame, what, where_text);
  }
  return {id, closer};
}

void check(herr_t status, Blame blame, const char* what, const std::string& where_text) {
  if (status < 0) {
    raise(blame, what, where_text);
  }
}

Handle make_half_type() {
  const std::string where_text = "IEEE half type";
  Handle type = checked(H5Tcopy(H5T_IEEE_F32LE), H5Tclose, Blame::kOutput,
                        "cannot create the float16 type", where_text);
  // Sign bit 15, exponent bits 10..14 (bias 15), mantissa bits 0..9, two bytes.
  check(H5Tset_fields(type.get(), 15, 10, 5, 0, 10), Blame::kOutput, "cannot set float16 fields",
        where_text);
  check(H5Tset_size(type.get(), 2), Blame::kOutput, "cannot set float16 size", where_text);
  check(H5Tset_ebias(type.get(), 15), Blame::kOutput, "cannot set float16 bias", where_text);
  return type;
}

bool exists(hid_t file, std::string_view path) {
  std::size_t next = 1;
  while (next <= path.size()) {
    const std::size_t slash = path.find('/', next);
    const std::size_t end = slash == std::string_view::npos ? path.size() : slash;
    const std::string prefix(path.substr(0, end));
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0 ||
        H5Oexists_by_name(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      return false;
    }
    next = end + 1;
  }
  return true;
}

std::vector<hsize_t> dimensions(hid_t dataset, const std::string& where_text) {
  const Handle space = checked(H5Dget_space(dataset), H5Sclose, Blame::kInput,
                               "cannot read the dataspace", where_text);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > 8) {
    raise(Blame::kInput, "unreadable or unsupported dataspace", where_text);
  }
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    raise(Blame::kInput, "cannot read the dimensions", where_text);
  }
  return dims;
}

bool has_attribute(hid_t object, const char* name) {
  return H5Aexists(object, name) > 0;
}

std::string read_string_attribute(hid_t object, const char* name, const std::string& where_text) {
  const std::string what = std::string("unreadable string attribute '") + name + "'";
  if (!has_attribute(object, name)) {
    raise(Blame::kInput, std::string("missing attribute '") + name + "'", where_text);
  }
  const Handle attribute = checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, Blame::kInput,
                                   what.c_str(), where_text);
  const Handle type =
      checked(H5Aget_type(attribute.get()), H5Tclose, Blame::kInput, what.c_str(), where_text);
  if (H5Tget_class(type.get()) != H5T_STRING) {
    raise(Blame::kInput, std::string("attribute '") + name + "' is not a string", where_text);
  }
  const Handle space =
      checked(H5Aget_space(attribute.get()), H5Sclose, Blame::kInput, what.c_str(), where_text);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    raise(Blame::kInput, std::string("attribute '") + name + "' is not a single string",
          where_text);
  }
  if (H5Tis_variable_str(type.get()) > 0) {
    char* text = nullptr;
    const Handle memory =
        checked(H5Tcopy(H5T_C_S1), H5Tclose, Blame::kInput, what.c_str(), where_text);
    check(H5Tset_size(memory.get(), H5T_VARIABLE), Blame::kInput, what.c_str(), where_text);
    check(H5Aread(attribute.get(), memory.get(), &text), Blame::kInput, what.c_str(), where_text);
    std::string value = text != nullptr ? text : "";
    (void)H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (1U << 20)) {
    raise(Blame::kInput, what, where_text);
  }
  std::string value(size, '\0');
  check(H5Aread(attribute.get(), type.get(), value.data()), Blame::kInput, what.c_str(),
        where_text);
  value.resize(value.find('\0') == std::string::npos ? size : value.find('\0'));
  return value;
}

std::uint64_t read_uint_attribute(hid_t object, const char* name, const std::string& where_text) {
  const std::string what = std::string("unreadable integer attribute '") + name + "'";
  if (!has_attribute(object, name)) {
    raise(Blame::kInput, std::string("missing attribute '") + name + "'", where_text);
  }
  const Handle attribute = checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, Blame::kInput,
                                   what.c_str(), where_text);
  const Handle type =
      checked(H5Aget_type(attribute.get()), H5Tclose, Blame::kInput, what.c_str(), where_text);
  const Handle space =
      checked(H5Aget_space(attribute.get()), H5Sclose, Blame::kInput, what.c_str(), where_text);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1) {
    raise(Blame::kInput, std::string("attribute '") + name + "' is not one integer", where_text);
  }
  std::uint64_t value = 0;
  check(H5Aread(attribute.get(), H5T_NATIVE_UINT64, &value), Blame::kInput, what.c_str(),
        where_text);
  return value;
}

std::uint64_t storage_bytes(hid_t dataset) {
  return H5Dget_storage_size(dataset);
}

bool storage_consistent(hid_t dataset) {
  const Handle creation(H5Dget_create_plist(dataset), H5Pclose);
  const Handle space(H5Dget_space(dataset), H5Sclose);
  const Handle type(H5Dget_type(dataset), H5Tclose);
  if (!creation.valid() || !space.valid() || !type.valid()) {
    return false;
  }
  const H5D_layout_t layout = H5Pget_layout(creation.get());
  if (layout == H5D_CHUNKED) {
    return true;
  }
  if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS) {
    return false;
  }
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  const std::size_t element = H5Tget_size(type.get());
  return points >= 0 && element > 0 &&
         H5Dget_storage_size(dataset) == static_cast<hsize_t>(points) * element;
}

void check_chunks(hid_t dataset, std::span<const hsize_t> start, std::span<const hsize_t> count,
                  const std::string& where_text) {
  const Handle creation(H5Dget_create_plist(dataset), H5Pclose);
  if (!creation.valid() || H5Pget_layout(creation.get()) != H5D_CHUNKED) {
    return;  // compact and contiguous layouts were checked by storage_consistent
  }
  const int filters = H5Pget_nfilters(creation.get());
  int deflate_index = -1;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    std::size_t values = 0;
    if (H5Pget_filter2(creation.get(), static_cast<unsigned>(i), &flags, &values, nullptr, 0,
                       nullptr, nullptr) == H5Z_FILTER_DEFLATE) {
      deflate_index = i;
    }
  }
  const Handle type(H5Dget_type(dataset), H5Tclose);
  const auto rank = static_cast<int>(count.size());
  std::vector<hsize_t> chunk(count.size());
  if (!type.valid() || H5Pget_chunk(creation.get(), rank, chunk.data()) != rank) {
    raise(Blame::kInput, "unreadable chunk layout", where_text);
  }
  std::uint64_t chunk_bytes = H5Tget_size(type.get());
  for (const hsize_t n : chunk) {
    chunk_bytes *= n;
  }
  if (chunk_bytes == 0 || chunk_bytes > (std::uint64_t{1} << 31)) {
    raise(Blame::kInput, "damaged chunk layout", where_text);
  }
  // Every chunk the selection touches, odometer-style over the chunk grid.
  std::vector<hsize_t> first(count.size());
  std::vector<hsize_t> last(count.size());
  for (std::size_t d = 0; d < count.size(); ++d) {
    first[d] = start[d] / chunk[d];
    last[d] = (start[d] + count[d] - 1) / chunk[d];
  }
  std::vector<hsize_t> index = first;
  std::vector<hsize_t> offset(count.size());
  std::vector<unsigned char> raw;
  std::vector<unsigned char> inflated(chunk_bytes);
  while (true) {
    for (std::size_t d = 0; d < count.size(); ++d) {
      offset[d] = index[d] * chunk[d];
    }
    hsize_t stored = 0;
    if (H5Dget_chunk_storage_size(dataset, offset.data(), &stored) < 0 ||
        stored > compressBound(static_cast<uLong>(chunk_bytes)) + 4096) {
      raise(Blame::kInput, "damaged chunk index", where_text);
    }
    if (stored > 0) {  // an unwritten chunk reads as fill values
      raw.resize(stored);
      std::uint32_t mask = 0;
      check(H5Dread_chunk(dataset, H5P_DEFAULT, offset.data(), &mask, raw.data()), Blame::kInput,
            "cannot read a chunk (damaged or truncated file)", where_text);
      const bool deflated = deflate_index >= 0 && (mask & (1U << deflate_index)) == 0;
      uLongf size = static_cast<uLongf>(chunk_bytes);
      const bool ok = deflated ? uncompress(inflated.data(), &size, raw.data(),
                                            static_cast<uLong>(stored)) == Z_OK &&
                                     size == chunk_bytes
                               : stored == chunk_bytes;
      if (!ok) {
        raise(Blame::kInput, "damaged chunk (it does not decompress to its size)", where_text);
      }
    }
    std::size_t d = count.size();
    while (d > 0 && index[d - 1] == last[d - 1]) {
      index[d - 1] = first[d - 1];
      --d;
    }
    if (d == 0) {
      return;
    }
    ++index[d - 1];
  }
}

void read_block(hid_t dataset, hid_t memory_type, std::span<const hsize_t> start,
                std::span<const hsize_t> count, void* out, const std::string& where_text) {
  std::uint64_t elements = 1;
  for (const hsize_t n : count) {
    elements *= n;
  }
  if (elements == 0) {
    return;
  }
  // HDF5 1.10 trusts a chunk's filters to produce the chunk's size and reads past the buffer
  // when a damaged one does not; every chunk is therefore decompressed and checked first
  // (found by fuzzing, docs/FUZZING.md). Attention weights in kvtier's own layout take the
  // fast path (chunk_reader.hpp), which checks as it decodes, so this costs little there.
  check_chunks(dataset, start, count, where_text);
  const Handle file_space = checked(H5Dget_space(dataset), H5Sclose, Blame::kInput,
                                    "cannot read the dataspace", where_text);
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr),
        Blame::kInput, "cannot select the requested block", where_text);
  const Handle memory_space =
      checked(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose,
              Blame::kInput, "cannot create a memory dataspace", where_text);
  check(H5Dread(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, out),
        Blame::kInput, "cannot read data (damaged or truncated file)", where_text);
}

void read_1d(hid_t dataset, hid_t memory_type, std::uint64_t first, std::uint64_t count, void* out,
             const std::string& where_text) {
  const hsize_t start[1] = {first};
  const hsize_t size[1] = {count};
  read_block(dataset, memory_type, start, size, out, where_text);
}

void write_string_attribute(hid_t object, const char* name, std::string_view value,
                            const std::string& where_text) {
  const char* what = "cannot write a string attribute";
  const Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, Blame::kOutput, what, where_text);
  check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), Blame::kOutput, what,
        where_text);
  check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), Blame::kOutput, what, where_text);
  const Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, Blame::kOutput, what, where_text);
  const Handle attribute =
      checked(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
              Blame::kOutput, what, where_text);
  const std::string padded = value.empty() ? std::string(1, '\0') : std::string(value);
  check(H5Awrite(attribute.get(), type.get(), padded.data()), Blame::kOutput, what, where_text);
}

void write_uint_attribute(hid_t object, const char* name, std::uint64_t value,
                          const std::string& where_text) {
  const char* what = "cannot write an integer attribute";
  const Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, Blame::kOutput, what, where_text);
  const hid_t file_type = value <= 0xFFFFFFFFU ? H5T_STD_U32LE : H5T_STD_U64LE;
  const Handle attribute =
      checked(H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
              Blame::kOutput, what, where_text);
  check(H5Awrite(attribute.get(), H5T_NATIVE_UINT64, &value), Blame::kOutput, what, where_text);
}

Handle create_file(const std::string& path, const char* what, const std::string& file_name) {
  const Handle creation =
      checked(H5Pcreate(H5P_FILE_CREATE), H5Pclose, Blame::kOutput, what, file_name);
  check(H5Pset_obj_track_times(creation.get(), 0), Blame::kOutput, what, file_name);
  const Handle access =
      checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, Blame::kOutput, what, file_name);
  check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), Blame::kOutput, what,
        file_name);
  // HDF5's error stack is silenced; the operating system's reason is in errno.
  errno = 0;
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, creation.get(), access.get());
  if (file < 0) {
    const int reason = errno;
    raise(Blame::kOutput,
          std::string(what) + (reason != 0
                                   ? std::string(" (system error: ") + std::strerror(reason) + ")"
                                   : std::string()),
          file_name);
  }
  return {file, H5Fclose};
}

void create_parent_groups(hid_t file, std::string_view path, const std::string& file_name) {
  std::size_t slash = path.find('/', 1);
  while (slash != std::string_view::npos) {
    const std::string group(path.substr(0, slash));
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) <= 0) {
      const Handle properties = checked(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, Blame::kOutput,
                                        "cannot create a group", where(file_name, group));
      check(H5Pset_obj_track_times(properties.get(), 0), Blame::kOutput, "cannot create a group",
            where(file_name, group));
      (void)checked(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                    H5Gclose, Blame::kOutput, "cannot create a group", where(file_name, group));
    }
    slash = path.find('/', slash + 1);
  }
}

Handle chunked_properties(std::span<const hsize_t> chunk, int deflate_level,
                          std::size_t element_bytes, const std::string& where_text) {
  const char* what = "cannot set dataset creation properties";
  Handle properties =
      checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, Blame::kOutput, what, where_text);
  check(H5Pset_obj_track_times(properties.get(), 0), Blame::kOutput, what, where_text);
  check(H5Pset_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data()),
        Blame::kOutput, what, where_text);
  if (deflate_level > 0) {
    if (element_bytes > 1) {
      check(H5Pset_shuffle(properties.get()), Blame::kOutput, what, where_text);
    }
    check(H5Pset_deflate(properties.get(), static_cast<unsigned>(deflate_level)), Blame::kOutput,
          what, where_text);
  }
  return properties;
}

}  // namespace kvtier::traces::h5
