#pragma once
// The `/meta` record's rules and the HDF5 attributes a trace carries on its root group and on
// `/meta` (docs/TRACE_FORMAT.md), exactly as TraceWriter writes them: for programs that write
// traces without TraceWriter (`kvtier trace meta` hands them to scripts/capture_hf.py).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"

namespace kvtier::traces {

// One scalar attribute and the HDF5 type it is stored as.
struct TraceAttribute {
  enum class Type {
    kString,  // fixed-length ASCII string, null-padded, max(1, size) bytes (no terminator)
    kUInt32,  // unsigned 32-bit little-endian integer
    kUInt64,  // unsigned 64-bit little-endian integer (values past 2^32 - 1 only)
  };
  std::string name;
  Type type = Type::kString;
  std::string text;          // kString
  std::uint64_t number = 0;  // kUInt32, kUInt64

  [[nodiscard]] static TraceAttribute string(std::string name, std::string text);
  // kUInt32 when the value fits 32 bits, kUInt64 otherwise.
  [[nodiscard]] static TraceAttribute uint(std::string name, std::uint64_t value);
};

// "string", "uint32" or "uint64".
[[nodiscard]] std::string_view attribute_type_name(TraceAttribute::Type type);

// Every rule of the schema (required fields, ranges, model consistency) plus what a trace needs
// (shape_from_meta); DataError naming `where_text` and the first problem's field otherwise.
[[nodiscard]] TraceShape checked_shape(const config::TraceMeta& meta,
                                       const std::string& where_text);

// The root group's attributes, in the order the writer writes them: format, version, producer
// and created (an ISO 8601 UTC time).
[[nodiscard]] std::vector<TraceAttribute> root_attributes(std::string_view producer,
                                                          std::string_view created);

// The attributes of the `/meta` dataset, in the order the writer writes them: encoding and
// message_type, then the key fields of `meta` mirrored for h5dump.
[[nodiscard]] std::vector<TraceAttribute> meta_attributes(const config::TraceMeta& meta);

}  // namespace kvtier::traces
