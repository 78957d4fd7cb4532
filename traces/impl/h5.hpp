#pragma once
// A thin layer over the HDF5 C API: owning handles, and every failure turned into a kvtier
// error that names the file and the object. Internal to traces/.
//
// The C API rather than the C++ one: the C++ wrappers throw their own exception types from
// deep inside and print HDF5's error stack, while every call here must become one line that
// names the file and the dataset.

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::traces::h5 {

// Whose fault a failure is: a file being read is input data (DataError, exit 3); a file being
// written failing is a runtime failure (exit 1: disk full, no permission).
enum class Blame { kInput, kOutput };

// Where problems are reported: "FILE, dataset /attention/mean/layer_003".
[[nodiscard]] std::string where(const std::string& file, std::string_view object);

[[noreturn]] void raise(Blame blame, const std::string& what, const std::string& where_text);

// HDF5 prints its error stack to stderr by default; kvtier reports failures itself, one line
// each. The setting is the library's (per thread in a thread-safe build), so every entry point
// calls this before its first HDF5 call.
void silence_library_errors() noexcept;

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() noexcept = default;
  Handle(hid_t id, Closer closer) noexcept : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  ~Handle() { reset(); }

  [[nodiscard]] hid_t get() const noexcept { return id_; }
  [[nodiscard]] bool valid() const noexcept { return id_ >= 0; }
  // Closes now; returns false when HDF5 reports the close failed (data not flushed).
  bool reset() noexcept;

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Checked constructors: `id < 0` raises with `what` and `where_text`.
[[nodiscard]] Handle checked(hid_t id, Handle::Closer closer, Blame blame, const char* what,
                             const std::string& where_text);
void check(herr_t status, Blame blame, const char* what, const std::string& where_text);

// IEEE 754 binary16, little-endian: HDF5 1.10 has no predefined half type, so it is derived
// from the 32-bit float type; h5dump shows its values as numbers.
[[nodiscard]] Handle make_half_type();

// --- Reading ------------------------------------------------------------------------------

// True when every group on `path` and the object itself exist (H5Lexists needs each step).
[[nodiscard]] bool exists(hid_t file, std::string_view path);
[[nodiscard]] std::vector<hsize_t> dimensions(hid_t dataset, const std::string& where_text);
[[nodiscard]] std::string read_string_attribute(hid_t object, const char* name,
                                                const std::string& where_text);
[[nodiscard]] std::uint64_t read_uint_attribute(hid_t object, const char* name,
                                                const std::string& where_text);
[[nodiscard]] bool has_attribute(hid_t object, const char* name);
// False when a compact or contiguous dataset's stored size disagrees with its dataspace and
// element type (a damaged layout message: HDF5 1.10 would read past its buffer), or when the
// layout is neither those nor chunked. Chunked datasets are checked chunk by chunk on reading.
[[nodiscard]] bool storage_consistent(hid_t dataset);
// Bytes the dataset's chunks occupy in the file (after compression).
[[nodiscard]] std::uint64_t storage_bytes(hid_t dataset);

// Reads `count` elements of a 1-D dataset starting at `first` into `out` as `memory_type`.
void read_1d(hid_t dataset, hid_t memory_type, std::uint64_t first, std::uint64_t count, void* out,
             const std::string& where_text);
// Reads the block [start, start + count) of an N-dimensional dataset, row-major, into `out`.
void read_block(hid_t dataset, hid_t memory_type, std::span<const hsize_t> start,
                std::span<const hsize_t> count, void* out, const std::string& where_text);

// --- Writing ------------------------------------------------------------------------------

// Creates (truncating) the HDF5 file at `path` with no timestamps, so that the same content gives
// the same bytes, in the HDF5 1.10 file format: chunk indexes of fixed-size datasets are a flat
// array (or nothing, for a single chunk) instead of a B-tree, smaller and faster to look up, and
// readable by every HDF5 since 1.10 (2016), h5dump and h5py included. Failures raise as
// Blame::kOutput with `what`, the operating system's reason when there is one, and `file_name`
// (the name to report: usually the final path, where `path` is its temporary twin).
[[nodiscard]] Handle create_file(const std::string& path, const char* what,
                                 const std::string& file_name);

void write_string_attribute(hid_t object, const char* name, std::string_view value,
                            const std::string& where_text);
void write_uint_attribute(hid_t object, const char* name, std::uint64_t value,
                          const std::string& where_text);
// Creates every missing group on the way to `path` (the object itself excluded).
void create_parent_groups(hid_t file, std::string_view path, const std::string& file_name);

// Dataset creation properties: chunked, optionally shuffle + deflate, no timestamps (so the same
// content gives the same bytes).
[[nodiscard]] Handle chunked_properties(std::span<const hsize_t> chunk, int deflate_level,
                                        std::size_t element_bytes, const std::string& where_text);

}  // namespace kvtier::traces::h5
