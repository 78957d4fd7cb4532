#pragma once
// Reading, writing and checking the `/meta` record. Internal to traces/.

#include <hdf5.h>

#include <string>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"

namespace kvtier::traces {

// Every rule of the schema (required fields, ranges, model consistency) plus what a trace needs
// (shape_from_meta); DataError naming `where_text` and the first problem's field otherwise.
[[nodiscard]] TraceShape checked_shape(const config::TraceMeta& meta,
                                       const std::string& where_text);

// Writes `/meta` (the binary protobuf as uint8[]) with its key fields mirrored as attributes.
void write_meta(hid_t file, const config::TraceMeta& meta, const std::string& file_name);

// Reads and parses `/meta`; DataError naming the file and /meta when missing or unparsable.
[[nodiscard]] config::TraceMeta read_meta(hid_t file, const std::string& file_name);

// Reads the root attributes and refuses files of another format or version.
void check_root_attributes(hid_t file, const std::string& file_name);

}  // namespace kvtier::traces
