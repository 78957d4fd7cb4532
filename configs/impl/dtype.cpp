#include "configs/dtype.hpp"

#include <stdexcept>

namespace kvtier::config {

double dtype_bytes(DType dtype) {
  switch (dtype) {
    case FP32: return 4.0;
    case BF16:
    case FP16: return 2.0;
    case FP8_E4M3:
    case FP8_E5M2:
    case INT8: return 1.0;
    case INT4: return 0.5;
    case MXFP4: return (32 * 0.5 + 1.0) / 32;  // 32 values of 4 bits and their 8-bit scale
    default: throw std::invalid_argument("dtype has no size: " + DType_Name(dtype));
  }
}

bool is_floating_point(DType dtype) {
  return dtype == FP32 || dtype == BF16 || dtype == FP16 || dtype == FP8_E4M3 ||
         dtype == FP8_E5M2 || dtype == MXFP4;
}

std::string_view dtype_name(DType dtype) {
  return DType_Name(dtype);
}

}  // namespace kvtier::config
