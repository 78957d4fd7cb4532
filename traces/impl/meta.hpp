#pragma once
// Reading, writing and checking the `/meta` record. Internal to traces/; the rules and the
// attribute lists are public in traces/meta.hpp.

#include <hdf5.h>

#include <string>
#include <string_view>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"
#include "traces/meta.hpp"

namespace kvtier::traces {

// Writes the root group's attributes (root_attributes) on `root`.
void write_root_attributes(hid_t root, std::string_view producer, std::string_view created,
                           const std::string& where_text);

// Writes `/meta` (the binary protobuf as uint8[]) with its key fields mirrored as attributes.
void write_meta(hid_t file, const config::TraceMeta& meta, const std::string& file_name);

// Reads and parses `/meta`; DataError naming the file and /meta when missing or unparsable.
[[nodiscard]] config::TraceMeta read_meta(hid_t file, const std::string& file_name);

// Reads the root attributes and refuses files of another format or version.
void check_root_attributes(hid_t file, const std::string& file_name);

}  // namespace kvtier::traces
