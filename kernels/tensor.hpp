#pragma once
// Checkpoint tensors as the engine sees them: float32, row-major, either used in place from a
// memory-mapped file or converted once at load. Conversion of 16-bit checkpoints on load costs
// twice their size in memory but keeps every matrix product a plain float32 Eigen product; a
// per-use conversion would halve the memory and make each token several times slower on a CPU.

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::kernels {

class MappedFile;

enum class TensorDtype { kF32, kF16, kBF16 };

[[nodiscard]] std::string_view tensor_dtype_name(TensorDtype dtype);
[[nodiscard]] std::size_t tensor_dtype_bytes(TensorDtype dtype);

// IEEE 754 binary16 and bfloat16 to float32 (exact), and back with round-to-nearest-even.
[[nodiscard]] float half_to_float(std::uint16_t bits);
[[nodiscard]] float bfloat16_to_float(std::uint16_t bits);
[[nodiscard]] std::uint16_t float_to_half(float value);
[[nodiscard]] std::uint16_t float_to_bfloat16(float value);

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;

// A tensor as stored in a checkpoint, before conversion: name, format, shape and its bytes.
struct RawTensor {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
};

// A float32 weight ready for the forward pass: a matrix (rows x cols, row-major, as PyTorch's
// [out_features, in_features]) or a vector (rows == 1). Absent optional weights have no data.
struct WeightTensor {
  std::string name;
  const float* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  [[nodiscard]] bool present() const noexcept { return data != nullptr; }
  [[nodiscard]] ConstMatrixMap matrix() const { return {data, rows, cols}; }
  [[nodiscard]] ConstVectorMap vector() const { return {data, rows * cols}; }
};

// Owns what the weights point into: the mapped files and the buffers of converted tensors.
class WeightStorage {
 public:
  void keep(std::shared_ptr<const MappedFile> file);
  // Takes ownership of converted values and returns where they now live (stable).
  const float* adopt(std::vector<float> values);
  // Bytes held in converted buffers (mapped bytes are page cache, not counted).
  [[nodiscard]] std::size_t converted_bytes() const noexcept { return converted_bytes_; }

 private:
  std::vector<std::shared_ptr<const MappedFile>> files_;
  // A moved std::vector keeps its heap buffer, so pointers into these stay valid.
  std::vector<std::vector<float>> buffers_;
  std::size_t converted_bytes_ = 0;
};

// Checks `raw` against the shape the model's configuration implies and makes it float32: in
// place when it already is float32 and suitably aligned, converted into `storage` otherwise.
// A vector's expected shape has one dimension. Throws DataError naming the tensor and `where`.
[[nodiscard]] WeightTensor to_float_weight(const RawTensor& raw,
                                           std::span<const std::int64_t> expected_shape,
                                           WeightStorage& storage, std::string_view where);

// "[64, 172]" for messages.
[[nodiscard]] std::string shape_text(std::span<const std::int64_t> shape);

}  // namespace kvtier::kernels
