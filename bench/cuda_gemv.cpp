// The CUDA engine's decode GEMMs alone, on Llama-2-7B's matrices (needs a GPU to run;
// scripts/gpu-validate.sh runs it). The decode benchmark (bench/cuda_decode.cpp) times whole
// steps; this one says how much of a step the weight-streaming GEMMs take, and whether they are
// bound by the HBM, by the kernel cuBLAS picks or by launching.
//
//   kvtier_bench_cuda_gemv [REPEATS] [DEVICE]     (defaults 5, 0)
//
// The engine's GEMMs of one decode step in BF16 (fused as the engine fuses them): per layer
// qkv [12288 x 4096], o [4096 x 4096], gate_up [22016 x 4096], down [4096 x 11008], then the
// LM head [32000 x 4096]; 32 layers of distinct matrices on the device (13.2 GB, as a real 7B;
// contents are a constant, as speed does not depend on values). Methods:
// - cublas: cuda::cublas_linear, the engine's cublasGemmEx call (BF16 operands, FP32 output);
// - cublas_bf16_out: the same call with a BF16 output, to see whether the FP32 output leads
//   cuBLAS to a slower kernel;
// - warp_rows: the engine's warp-per-row GEMM (CudaGemm::kWarpRows);
// - warp_rows_early: the same kernel launched early (CudaEarlyLaunch::kProgrammatic, compute
//   capability 9.0): each call scheduled while the one before finishes, its weight rows asked
//   of L2 before it waits;
// - warp_rows_rounds2, _rounds8, _warps4, _warps16: the same kernel with 2 or 8 16-byte loads
//   in flight per lane (the engine's: 4) or 4 or 16 warps a block (the engine's: 8), at 1 row.
// Measured, for rows (tokens per call) 1, 2, 4 and 8, each the median of REPEATS timings with CUDA
// events after one untimed run:
// - shapes: per matrix shape, 32 calls, each on another layer's matrix (an L2 cache holds
//   none of them between its calls), launched one by one and replayed from a CUDA graph: the
//   time per call and the bytes of weights per second;
// - step: one decode step's 129 GEMMs in order, launched and from a graph: milliseconds, and
//   the fraction of the HBM peak (memory clock x bus width) the weights' bytes reach.
// A launched figure well above its graph figure means the host's launches are the bound.
//
// One JSON line on stdout: bench "cuda_gemv", device, hbm_peak_bytes_per_s, l2_bytes,
// repeats, weight_bytes (one step's), shapes [{name, out, in, rows, method, mode ("launched" |
// "graph"), us_per_call, gb_per_s}], step [{rows, method, mode, ms, gb_per_s,
// fraction_of_peak}], errors (a method that failed, with its reason; the others still run).
// Exit codes: 0 done, 1 a CUDA call failed outside a method, 2 usage.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/median.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "kernels/impl/cuda_graph.hpp"
#include "kernels/impl/cuda_handles.hpp"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/cuda_linear.hpp"

namespace {

namespace kc = kvtier::kernels::cuda;

constexpr int kLayers = 32;
constexpr int kHidden = 4096;
constexpr int kIntermediate = 11008;
constexpr int kVocab = 32000;
constexpr int kElementBytes = 2;                                       // BF16
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20U;  // as the engine's

struct Shape {
  const char* name;
  int out;
  int in;
};
// A layer's GEMMs in the engine's order, then the head.
constexpr Shape kLayerShapes[] = {{"qkv", 3 * kHidden, kHidden},
                                  {"o", kHidden, kHidden},
                                  {"gate_up", 2 * kIntermediate, kHidden},
                                  {"down", kHidden, kIntermediate}};
constexpr Shape kHead = {"lm_head", kVocab, kHidden};

enum class Method {
  kCublas,
  kCublasBf16Out,
  kWarpRows,
  kWarpRowsEarly,
  // The warp-per-row kernel with other loads in flight per lane / warps a block (1 row only).
  kWarpRowsRounds2,
  kWarpRowsRounds8,
  kWarpRowsWarps4,
  kWarpRowsWarps16,
};
constexpr Method kMethods[] = {Method::kCublas,          Method::kCublasBf16Out,
                               Method::kWarpRows,        Method::kWarpRowsEarly,
                               Method::kWarpRowsRounds2, Method::kWarpRowsRounds8,
                               Method::kWarpRowsWarps4,  Method::kWarpRowsWarps16};

// The variant's (loads in flight per lane, warps a block); {0, 0} for the other methods.
std::pair<int, int> variant_of(Method method) {
  switch (method) {
    case Method::kWarpRowsRounds2: return {2, 8};
    case Method::kWarpRowsRounds8: return {8, 8};
    case Method::kWarpRowsWarps4: return {4, 4};
    case Method::kWarpRowsWarps16: return {4, 16};
    default: return {0, 0};
  }
}

const char* method_name(Method method) {
  switch (method) {
    case Method::kCublas: return "cublas";
    case Method::kCublasBf16Out: return "cublas_bf16_out";
    case Method::kWarpRows: return "warp_rows";
    case Method::kWarpRowsEarly: return "warp_rows_early";
    case Method::kWarpRowsRounds2: return "warp_rows_rounds2";
    case Method::kWarpRowsRounds8: return "warp_rows_rounds8";
    case Method::kWarpRowsWarps4: return "warp_rows_warps4";
    case Method::kWarpRowsWarps16: return "warp_rows_warps16";
  }
  return "?";
}

using kvtier::bench::median;

std::uint64_t matrix_bytes(const Shape& shape) {
  return static_cast<std::uint64_t>(shape.out) * static_cast<std::uint64_t>(shape.in) *
         kElementBytes;
}

class GemvBench {
 public:
  GemvBench(int device, int repeats)
      : check_(device),
        repeats_(repeats),
        stream_(check_, device),
        cublas_(check_, stream_.get()),
        workspace_(kCublasWorkspaceBytes, check_),
        input_(std::size_t{8} * kIntermediate * kElementBytes, check_),
        output_(std::size_t{8} * kVocab * sizeof(float), check_),
        output_bf16_(std::size_t{8} * kVocab * kElementBytes, check_),
        head_(matrix_bytes(kHead), check_) {
    // Graph capture must not allocate: cuBLAS gets its workspace up front, as in the engine.
    check_(cublasSetWorkspace(cublas_.get(), workspace_.get(), workspace_.bytes()),
           "cublasSetWorkspace");
    for (int layer = 0; layer < kLayers; ++layer) {
      for (const Shape& shape : kLayerShapes) {
        weights_.emplace_back(matrix_bytes(shape), check_);
      }
    }
    // 0x3C3C is BF16 0.0115: finite values, so no kernel takes a special path.
    for (const kc::DeviceMemory& weight : weights_) {
      check_(cudaMemset(weight.get(), 0x3C, weight.bytes()), "cudaMemset (weights)");
    }
    check_(cudaMemset(head_.get(), 0x3C, head_.bytes()), "cudaMemset (head)");
    check_(cudaMemset(input_.get(), 0x3C, input_.bytes()), "cudaMemset (input)");
    check_(cudaEventCreate(&start_), "cudaEventCreate");
    check_(cudaEventCreate(&stop_), "cudaEventCreate");
    check_(cudaDeviceSynchronize(), "cudaDeviceSynchronize (set-up)");
  }
  GemvBench(const GemvBench&) = delete;
  GemvBench& operator=(const GemvBench&) = delete;
  GemvBench(GemvBench&&) = delete;
  GemvBench& operator=(GemvBench&&) = delete;
  ~GemvBench() {
    static_cast<void>(cudaStreamSynchronize(stream_.get()));
    static_cast<void>(cudaEventDestroy(start_));
    static_cast<void>(cudaEventDestroy(stop_));
  }

  [[nodiscard]] std::uint64_t step_weight_bytes() const {
    std::uint64_t bytes = matrix_bytes(kHead);
    for (const Shape& shape : kLayerShapes) {
      bytes += kLayers * matrix_bytes(shape);
    }
    return bytes;
  }

  // One GEMM of `shape` on `weight`, `rows` input rows, with `method`.
  void gemm(Method method, const Shape& shape, const void* weight, int rows) {
    switch (method) {
      case Method::kCublas:
        check_(kc::cublas_linear(cublas_.get(), kc::Dtype::kBF16, weight, shape.out, shape.in,
                                 input_.get(), rows, static_cast<float*>(output_.get()), false),
               "cublasGemmEx");
        return;
      case Method::kCublasBf16Out: {
        const float alpha = 1.0F;
        const float beta = 0.0F;
        check_(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, shape.out, rows, shape.in,
                            &alpha, weight, CUDA_R_16BF, shape.in, input_.get(), CUDA_R_16BF,
                            shape.in, &beta, output_bf16_.get(), CUDA_R_16BF, shape.out,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (BF16 output)");
        return;
      }
      case Method::kWarpRows:
      case Method::kWarpRowsEarly:
        check_(kc::launch_warp_rows_gemm(weight, kc::Dtype::kBF16, shape.out, shape.in,
                                         input_.get(), rows, static_cast<float*>(output_.get()),
                                         false, {stream_.get(), method == Method::kWarpRowsEarly}),
               "warp-rows gemm kernel");
        return;
      case Method::kWarpRowsRounds2:
      case Method::kWarpRowsRounds8:
      case Method::kWarpRowsWarps4:
      case Method::kWarpRowsWarps16: {
        const auto [rounds, warps] = variant_of(method);
        check_(kc::launch_warp_rows_gemm_variant(rounds, warps, weight, shape.out, shape.in,
                                                 input_.get(), static_cast<float*>(output_.get()),
                                                 stream_.get()),
               "warp-rows gemm kernel (variant)");
        return;
      }
    }
  }

  // The 32 calls of shape `index` of kLayerShapes (or of the head, index -1).
  void shape_calls(Method method, int index, int rows) {
    for (int layer = 0; layer < kLayers; ++layer) {
      if (index < 0) {
        gemm(method, kHead, head_.get(), rows);
      } else {
        const Shape& shape = kLayerShapes[index];
        gemm(method, shape, weight(layer, index), rows);
      }
    }
  }

  void step_calls(Method method, int rows) {
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int index = 0; index < 4; ++index) {
        gemm(method, kLayerShapes[index], weight(layer, index), rows);
      }
    }
    gemm(method, kHead, head_.get(), rows);
  }

  // Median seconds of what `enqueue` puts on the stream, launched or replayed from a graph.
  double time(bool graph, const std::function<void()>& enqueue) {
    kc::StreamGraph captured;
    if (graph) {
      captured.capture(stream_.get(), check_, {}, enqueue);
    }
    const auto run = [&] {
      if (graph) {
        captured.launch(stream_.get(), check_);
      } else {
        enqueue();
      }
    };
    run();  // untimed
    std::vector<double> seconds;
    for (int r = 0; r < repeats_; ++r) {
      check_(cudaEventRecord(start_, stream_.get()), "cudaEventRecord");
      run();
      check_(cudaEventRecord(stop_, stream_.get()), "cudaEventRecord");
      check_(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0.0F;
      check_(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      seconds.push_back(static_cast<double>(ms) * 1e-3);
    }
    return median(seconds);
  }

  // After a method's failure: the stream drained and the error cleared for the next one.
  void recover() {
    static_cast<void>(cudaStreamSynchronize(stream_.get()));
    static_cast<void>(cudaGetLastError());
  }

 private:
  [[nodiscard]] void* weight(int layer, int index) const {
    return weights_[(static_cast<std::size_t>(layer) * 4) + static_cast<std::size_t>(index)].get();
  }

  kc::Checker check_;
  int repeats_;
  kc::Stream stream_;
  kc::Cublas cublas_;
  kc::DeviceMemory workspace_;
  kc::DeviceMemory input_;
  kc::DeviceMemory output_;
  kc::DeviceMemory output_bf16_;
  kc::DeviceMemory head_;
  std::vector<kc::DeviceMemory> weights_;  // layer-major, kLayerShapes' order
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

bool parse_int(const char* text, int low, int& value) {
  char* end = nullptr;
  const long parsed = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || parsed < low || parsed > 1000) {
    return false;
  }
  value = static_cast<int>(parsed);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  int device = 0;
  if (argc > 3 || (argc > 1 && !parse_int(argv[1], 1, repeats)) ||
      (argc > 2 && !parse_int(argv[2], 0, device))) {
    std::cerr << "usage: kvtier_bench_cuda_gemv [REPEATS] [DEVICE]  (REPEATS 1-1000)\n";
    return 2;
  }
  try {
    const kc::Checker check(device);
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    int memory_clock_khz = 0;
    check(cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device),
          "cudaDeviceGetAttribute");
    int l2_bytes = 0;
    check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
          "cudaDeviceGetAttribute");
    const double peak = 2.0 * memory_clock_khz * 1e3 * properties.memoryBusWidth / 8.0;

    GemvBench bench(device, repeats);
    const double step_bytes = static_cast<double>(bench.step_weight_bytes());
    std::ostringstream shapes;
    std::ostringstream step;
    std::vector<std::string> errors;
    for (const Method method : kMethods) {
      try {
        for (const int rows : {1, 2, 4, 8}) {
          if (rows > 1 && variant_of(method).first != 0) {
            continue;  // the variants are built for one row
          }
          for (const bool graph : {false, true}) {
            const char* mode = graph ? "graph" : "launched";
            for (int index = -1; index < 4; ++index) {
              const Shape& shape = index < 0 ? kHead : kLayerShapes[index];
              const double seconds =
                  bench.time(graph, [&] { bench.shape_calls(method, index, rows); }) / kLayers;
              shapes << (shapes.tellp() > 0 ? "," : "") << "{\"name\":\"" << shape.name
                     << "\",\"out\":" << shape.out << ",\"in\":" << shape.in << ",\"rows\":" << rows
                     << ",\"method\":\"" << method_name(method) << "\",\"mode\":\"" << mode
                     << "\",\"us_per_call\":" << kvtier::json_number_or_null(seconds * 1e6)
                     << ",\"gb_per_s\":"
                     << kvtier::json_number_or_null(static_cast<double>(matrix_bytes(shape)) /
                                                    seconds / 1e9)
                     << "}";
            }
            const double seconds = bench.time(graph, [&] { bench.step_calls(method, rows); });
            step << (step.tellp() > 0 ? "," : "") << "{\"rows\":" << rows << ",\"method\":\""
                 << method_name(method) << "\",\"mode\":\"" << mode
                 << "\",\"ms\":" << kvtier::json_number_or_null(seconds * 1e3)
                 << ",\"gb_per_s\":" << kvtier::json_number_or_null(step_bytes / seconds / 1e9)
                 << ",\"fraction_of_peak\":"
                 << kvtier::json_number_or_null(step_bytes / seconds / peak) << "}";
          }
        }
      } catch (const kvtier::Error& failure) {
        errors.push_back(std::string(method_name(method)) + ": " + failure.what());
        std::cerr << "kvtier_bench_cuda_gemv: " << method_name(method) << ": " << failure.what()
                  << "\n";
        bench.recover();
      }
    }
    std::cout << "{\"bench\":\"cuda_gemv\",\"device\":" << kvtier::json_escape(properties.name)
              << ",\"hbm_peak_bytes_per_s\":" << kvtier::json_number_or_null(peak)
              << ",\"l2_bytes\":" << l2_bytes << ",\"repeats\":" << repeats
              << ",\"weight_bytes\":" << kvtier::json_number_or_null(step_bytes) << ",\"shapes\":["
              << shapes.str() << "],\"step\":[" << step.str() << "],\"errors\":[";
    for (std::size_t i = 0; i < errors.size(); ++i) {
      std::cout << (i == 0 ? "" : ",") << kvtier::json_escape(errors[i]);
    }
    std::cout << "]}\n";
    return 0;
  } catch (const std::exception& failure) {
    std::cerr << "kvtier_bench_cuda_gemv: " << failure.what() << "\n";
    return 1;
  }
}
