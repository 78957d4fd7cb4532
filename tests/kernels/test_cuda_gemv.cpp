// The warp-per-row GEMM (kernels/impl/cuda_gemv.cu) against a double-precision product on the
// host, over the shapes its loops treat differently: inputs shorter than one pass of a warp, one
// and several unrolled rounds with and without a tail, output counts that leave a block's last
// warps idle, every row count it takes, with and without accumulation, in every dtype; and its
// fused gate/up and SwiGLU form against the GEMM and the SwiGLU kernel, bit for bit. Needs a
// GPU (label `gpu`), as tests/kernels/test_cuda_engine.cpp.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/impl/cuda_kernels.cuh"
#include "tests/kernels/support/gpu.hpp"
#include "tests/kernels/support/released_writer.hpp"

namespace {

namespace kc = kvtier::kernels::cuda;
using kvtier::kernels::testing::gpu_present;

void check(cudaError_t status, const char* what) {
  INFO(what << ": " << cudaGetErrorString(status));
  REQUIRE(status == cudaSuccess);
}

// Device memory freed on scope exit.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) { check(cudaMalloc(&data_, bytes), "cudaMalloc"); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&&) = delete;
  Buffer& operator=(Buffer&&) = delete;
  ~Buffer() { static_cast<void>(cudaFree(data_)); }
  [[nodiscard]] void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

std::size_t element_bytes(kc::Dtype dtype) {
  return dtype == kc::Dtype::kF32 ? 4 : 2;
}

// Seeded values in [-1, 1], rounded to `dtype` (as stored) and returned as float32.
std::vector<float> values(std::size_t count, std::uint64_t seed, kc::Dtype dtype,
                          std::vector<unsigned char>& stored) {
  std::vector<float> exact(count);
  for (std::size_t i = 0; i < count; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    exact[i] = static_cast<float>(static_cast<double>(seed >> 40U) / 8388608.0 - 1.0);
  }
  stored.resize(count * element_bytes(dtype));
  kc::host_from_float(dtype, exact.data(), stored.data(), static_cast<std::int64_t>(count));
  kc::host_to_float(dtype, stored.data(), exact.data(), static_cast<std::int64_t>(count));
  return exact;
}

std::string name(kc::Dtype dtype) {
  return dtype == kc::Dtype::kF32 ? "f32" : dtype == kc::Dtype::kF16 ? "f16" : "bf16";
}

}  // namespace

TEST_CASE("the warp-rows GEMM computes X W^T over every shape its loops treat apart",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  // 16-byte loads of 8 (f16, bf16) or 4 (f32) elements, 32 lanes, 4 loads a round: in = 8 fits
  // in part of one pass; 1,024 is exactly one round of 16-bit elements; 1,032 and 2,056 add a
  // tail; 4,104 is several rounds and a tail. Output counts of 1, 13 and 37 leave warps of the
  // last block without a feature.
  // In float32 a load is 4 elements: 12 and 172 (stories260K's MLP width) take it alone.
  const std::vector<std::pair<int, int>> shapes = {{1, 8},     {13, 264},  {37, 1024}, {8, 1032},
                                                   {21, 2056}, {64, 4104}, {3, 12},    {5, 172}};
  for (const kc::Dtype dtype : {kc::Dtype::kF32, kc::Dtype::kF16, kc::Dtype::kBF16}) {
    for (const auto& [out_features, in_features] : shapes) {
      if (dtype != kc::Dtype::kF32 && in_features % 8 != 0) {
        continue;  // not a whole number of 16-byte loads: cuBLAS's (the refusals below)
      }
      std::vector<unsigned char> weight_bytes;
      const std::vector<float> weight =
          values(static_cast<std::size_t>(out_features) * in_features, 7, dtype, weight_bytes);
      Buffer weight_device(weight_bytes.size());
      check(cudaMemcpy(weight_device.get(), weight_bytes.data(), weight_bytes.size(),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy (weight)");
      for (int rows = 1; rows <= kc::kWarpRowsMaxRows; ++rows) {
        for (const bool accumulate : {false, true}) {
          CAPTURE(name(dtype), out_features, in_features, rows, accumulate);
          std::vector<unsigned char> input_bytes;
          const std::vector<float> input =
              values(static_cast<std::size_t>(rows) * in_features, 100 + rows, dtype, input_bytes);
          std::vector<unsigned char> unused;
          const std::vector<float> before = values(static_cast<std::size_t>(rows) * out_features,
                                                   300 + rows, kc::Dtype::kF32, unused);
          Buffer input_device(input_bytes.size());
          // A guard of sentinels after the output: a warp past the last feature would write it.
          constexpr std::size_t kGuard = 64;
          std::vector<float> guarded = before;
          guarded.resize(before.size() + kGuard, 12345.0F);
          Buffer out_device(guarded.size() * 4);
          check(cudaMemcpy(input_device.get(), input_bytes.data(), input_bytes.size(),
                           cudaMemcpyHostToDevice),
                "cudaMemcpy (input)");
          check(cudaMemcpy(out_device.get(), guarded.data(), guarded.size() * 4,
                           cudaMemcpyHostToDevice),
                "cudaMemcpy (out)");
          REQUIRE(kc::warp_rows_gemm_applies(dtype, in_features, rows, weight_device.get(),
                                             input_device.get()));
          auto* out = static_cast<float*>(out_device.get());
          check(kc::launch_warp_rows_gemm(weight_device.get(), dtype, out_features, in_features,
                                          input_device.get(), rows, out, accumulate, nullptr),
                "launch_warp_rows_gemm");
          check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
          std::vector<float> got(guarded.size());
          check(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost),
                "cudaMemcpy (result)");
          CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(before.size()), got.end(),
                            [](float value) { return value == 12345.0F; }));
          double worst = 0.0;
          for (int r = 0; r < rows; ++r) {
            for (int o = 0; o < out_features; ++o) {
              double sum = 0.0;
              double magnitude = 0.0;
              for (int i = 0; i < in_features; ++i) {
                const double term = static_cast<double>(input[r * in_features + i]) *
                                    weight[static_cast<std::size_t>(o) * in_features + i];
                sum += term;
                magnitude += std::fabs(term);
              }
              const std::size_t at = static_cast<std::size_t>(r) * out_features + o;
              const double expected = (accumulate ? before[at] : 0.0) + sum;
              // float32 accumulation in another order: a few ulps of the terms' magnitude (a
              // NaN counts as the worst error there is).
              const double error = std::fabs(got[at] - expected) / (magnitude + 1.0);
              worst = std::isnan(error) ? INFINITY : std::max(worst, error);
            }
          }
          CHECK(worst < 1e-5);
        }
      }
    }
  }
}

TEST_CASE("the warp-rows GEMM refuses operands it does not take", "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  Buffer weight(4096);
  Buffer input(4096);
  Buffer out(4096);
  auto* bytes = static_cast<unsigned char*>(weight.get());
  CHECK(kc::warp_rows_gemm_applies(kc::Dtype::kBF16, 64, 8, weight.get(), input.get()));
  CHECK(kc::warp_rows_gemm_applies(kc::Dtype::kF32, 12, 1, weight.get(), input.get()));
  CHECK_FALSE(kc::warp_rows_gemm_applies(kc::Dtype::kBF16, 64, 0, weight.get(), input.get()));
  CHECK_FALSE(kc::warp_rows_gemm_applies(kc::Dtype::kBF16, 64, kc::kWarpRowsMaxRows + 1,
                                         weight.get(), input.get()));
  CHECK_FALSE(kc::warp_rows_gemm_applies(kc::Dtype::kBF16, 12, 1, weight.get(), input.get()));
  CHECK_FALSE(kc::warp_rows_gemm_applies(kc::Dtype::kF16, 64, 1, bytes + 2, input.get()));
  CHECK(kc::launch_warp_rows_gemm(bytes + 2, kc::Dtype::kF16, 4, 64, input.get(), 1,
                                  static_cast<float*>(out.get()), false,
                                  nullptr) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // refused before any launch
}

// The gate/up projection with SwiGLU applied as it writes (CudaFusion::kOn) against the GEMM
// into float32 followed by the SwiGLU kernel: the same bits, over the shapes of the GEMM test,
// every row count and dtype, launched plainly and (compute capability 9.0) early behind a writer
// that lets it start before it writes its input.
TEST_CASE("the fused gate/up and SwiGLU kernel writes the GEMM and SwiGLU kernels' bits",
          "[kernels][cuda][gpu]") {
  if (!gpu_present()) {
    return;
  }
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
        "cudaDeviceGetAttribute");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  // (intermediate, in_features): 13 and 37 leave warps of the last block without a feature.
  const std::vector<std::pair<int, int>> shapes = {{1, 8},     {13, 264}, {37, 1032},
                                                   {64, 4104}, {3, 12},   {5, 172}};
  for (const kc::Dtype dtype : {kc::Dtype::kF32, kc::Dtype::kF16, kc::Dtype::kBF16}) {
    for (const auto& [intermediate, in_features] : shapes) {
      if (dtype != kc::Dtype::kF32 && in_features % 8 != 0) {
        continue;
      }
      const std::size_t element = element_bytes(dtype);
      std::vector<unsigned char> weight_bytes;
      static_cast<void>(values(static_cast<std::size_t>(2 * intermediate) * in_features, 17, dtype,
                               weight_bytes));
      Buffer weight(weight_bytes.size());
      check(cudaMemcpy(weight.get(), weight_bytes.data(), weight_bytes.size(),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy (weight)");
      for (int rows = 1; rows <= kc::kWarpRowsMaxRows; ++rows) {
        // The input is written by a kernel right before each GEMM, as in the engine, so that an
        // early launch overlaps its writer: float32 values exact in `dtype`, converted on the
        // device.
        std::vector<unsigned char> input_bytes;
        const std::vector<float> input_values =
            values(static_cast<std::size_t>(rows) * in_features, 200 + rows, dtype, input_bytes);
        Buffer input_floats(input_values.size() * 4);
        check(cudaMemcpy(input_floats.get(), input_values.data(), input_values.size() * 4,
                         cudaMemcpyHostToDevice),
              "cudaMemcpy (input)");
        Buffer input(input_bytes.size());
        const auto write_input = [&] {
          check(kc::launch_convert(static_cast<const float*>(input_floats.get()), input.get(),
                                   dtype, static_cast<std::int64_t>(input_values.size()), stream),
                "launch_convert");
        };
        write_input();
        // The converted input, for a writer that releases its dependents before it writes.
        Buffer converted(input_bytes.size());
        check(cudaMemcpyAsync(converted.get(), input.get(), input_bytes.size(),
                              cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync (converted input)");
        const std::size_t out_bytes = static_cast<std::size_t>(rows) * intermediate * element;
        Buffer gate_up(static_cast<std::size_t>(rows) * 2 * intermediate * 4);
        Buffer expected_device(out_bytes);
        check(kc::launch_warp_rows_gemm(weight.get(), dtype, 2 * intermediate, in_features,
                                        input.get(), rows, static_cast<float*>(gate_up.get()),
                                        false, stream),
              "launch_warp_rows_gemm");
        check(kc::launch_swiglu(static_cast<const float*>(gate_up.get()), rows, intermediate,
                                expected_device.get(), dtype, stream),
              "launch_swiglu");
        std::vector<unsigned char> expected(out_bytes);
        check(cudaMemcpyAsync(expected.data(), expected_device.get(), out_bytes,
                              cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (expected)");
        for (const bool early : {false, true}) {
          if (early && major < 9) {
            continue;
          }
          CAPTURE(name(dtype), intermediate, in_features, rows, early);
          // A guard of sentinel bytes after the output: a warp past the last feature would write
          // it.
          constexpr std::size_t kGuard = 64;
          std::vector<unsigned char> got(out_bytes + kGuard, 0xA5);
          Buffer out(got.size());
          check(cudaMemcpyAsync(out.get(), got.data(), got.size(), cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync (out)");
          // NaN bytes first: a kernel reading the input before its writer finished would see them.
          // The writer lets the GEMM start at once and writes 50 us later, so an early GEMM that
          // read its input before its wait would read NaN (the conversion kernel releases
          // nothing, so a kernel behind it starts only once it has finished).
          check(cudaMemsetAsync(input.get(), 0xFF, input_bytes.size(), stream), "cudaMemsetAsync");
          check(kvtier::kernels::testing::launch_released_copy(converted.get(), input.get(),
                                                               input_bytes.size(), 50, stream),
                "launch_released_copy");
          check(kc::launch_warp_rows_swiglu(weight.get(), dtype, intermediate, in_features,
                                            input.get(), rows, out.get(), {stream, early}),
                "launch_warp_rows_swiglu");
          check(cudaMemcpyAsync(got.data(), out.get(), got.size(), cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync (result)");
          check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          CHECK(std::equal(expected.begin(), expected.end(), got.begin()));
          CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(out_bytes), got.end(),
                            [](unsigned char byte) { return byte == 0xA5; }));
        }
      }
    }
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}
