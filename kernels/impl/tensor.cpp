#include "kernels/tensor.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "common/errors.hpp"
#include "kernels/mapped_file.hpp"

namespace kvtier::kernels {

std::string_view tensor_dtype_name(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32: return "F32";
    case TensorDtype::kF16: return "F16";
    case TensorDtype::kBF16: return "BF16";
  }
  return "?";
}

std::size_t tensor_dtype_bytes(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 ? 4 : 2;
}

float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000U) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1FU;
  const std::uint32_t mantissa = bits & 0x3FFU;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exactly representable in float32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  std::uint32_t result = 0;
  if (exponent == 0x1F) {
    result = sign | 0x7F800000U | (mantissa << 13);  // infinity or NaN
  } else {
    result = sign | ((exponent + 112U) << 23) | (mantissa << 13);  // rebias 15 -> 127
  }
  return std::bit_cast<float>(result);
}

float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x40U);  // keep it a quiet NaN
  }
  const std::uint32_t rounding = 0x7FFFU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) {
    return static_cast<std::uint16_t>(sign | 0x7E00U);
  }
  if (magnitude >= 65520.0F) {  // rounds to infinity
    return static_cast<std::uint16_t>(sign | 0x7C00U);
  }
  if (magnitude < 6.103515625e-05F) {  // subnormal half: a multiple of 2^-24
    const float scaled = std::nearbyint(magnitude * 16777216.0F);  // ties to even
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(scaled));
  }
  const std::uint32_t magnitude_bits = bits & 0x7FFFFFFFU;
  const std::uint32_t rounding = 0xFFFU + ((magnitude_bits >> 13) & 1U);
  const std::uint32_t rounded = (magnitude_bits + rounding) >> 13;
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(rounded - (112U << 10)));
}

void WeightStorage::keep(std::shared_ptr<const MappedFile> file) {
  files_.push_back(std::move(file));
}

const float* WeightStorage::adopt(std::vector<float> values) {
  converted_bytes_ += values.size() * sizeof(float);
  buffers_.push_back(std::move(values));
  return buffers_.back().data();
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
}

WeightTensor to_float_weight(const RawTensor& raw, std::span<const std::int64_t> expected_shape,
                             WeightStorage& storage, std::string_view where) {
  const std::span<const std::int64_t> shape(raw.shape);
  if (!std::equal(shape.begin(), shape.end(), expected_shape.begin(), expected_shape.end())) {
    throw DataError("tensor '" + raw.name + "' has shape " + shape_text(shape) +
                        "; the model's configuration implies " + shape_text(expected_shape),
                    std::string(where));
  }
  const std::int64_t count =
      std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  const auto expected_bytes = static_cast<std::size_t>(count) * tensor_dtype_bytes(raw.dtype);
  if (raw.bytes.size() != expected_bytes) {
    throw DataError("tensor '" + raw.name + "' holds " + std::to_string(raw.bytes.size()) +
                        " bytes; " + std::string(tensor_dtype_name(raw.dtype)) + " " +
                        shape_text(shape) + " needs " + std::to_string(expected_bytes),
                    std::string(where));
  }
  WeightTensor weight;
  weight.name = raw.name;
  weight.rows = shape.size() == 2 ? shape[0] : 1;
  weight.cols = shape.size() == 2 ? shape[1] : (shape.empty() ? 1 : shape[0]);
  const auto address = reinterpret_cast<std::uintptr_t>(raw.bytes.data());
  if (raw.dtype == TensorDtype::kF32 && address % alignof(float) == 0) {
    weight.data = reinterpret_cast<const float*>(raw.bytes.data());
    return weight;
  }
  std::vector<float> values(static_cast<std::size_t>(count));
  if (raw.dtype == TensorDtype::kF32) {
    std::memcpy(values.data(), raw.bytes.data(), expected_bytes);
  } else {
    const bool is_half = raw.dtype == TensorDtype::kF16;
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, raw.bytes.data() + 2 * i, 2);  // little-endian files, little-endian host
      values[i] = is_half ? half_to_float(bits) : bfloat16_to_float(bits);
    }
  }
  weight.data = storage.adopt(std::move(values));
  return weight;
}

}  // namespace kvtier::kernels
