#pragma once
// Facts about number formats that every module needs (bytes per element, float or integer).

#include <string_view>

#include "configs/schema/dtype.pb.h"

namespace kvtier::config {

// Bytes per element; INT4 is half a byte, MXFP4 17/32 with its scales. Throws
// std::invalid_argument for DTYPE_UNSPECIFIED.
[[nodiscard]] double dtype_bytes(DType dtype);
[[nodiscard]] bool is_floating_point(DType dtype);
// The schema's enum name ("BF16").
[[nodiscard]] std::string_view dtype_name(DType dtype);

}  // namespace kvtier::config
