// make_cuda_engine in builds without the CUDA targets (KVTIER_CUDA=OFF, or no nvcc found).
#include <string>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"

namespace kvtier::kernels {

std::string_view cuda_compute_dtype_name(CudaComputeDtype dtype) {
  switch (dtype) {
    case CudaComputeDtype::kBF16: return "bf16";
    case CudaComputeDtype::kFP16: return "fp16";
    case CudaComputeDtype::kFP32: return "fp32";
  }
  return "unknown";
}

CudaEngineOptions cuda_engine_options(const Engine& engine) {
  throw ConfigError("the " + std::string(engine.backend()) + " engine is not a CUDA engine");
}

std::uint64_t cuda_engine_weight_bytes(const Engine& engine) {
  throw ConfigError("the " + std::string(engine.backend()) + " engine is not a CUDA engine");
}

CudaGraphCounts cuda_engine_graph_counts(const Engine& engine) {
  throw ConfigError("the " + std::string(engine.backend()) + " engine is not a CUDA engine");
}

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const ModelWeights> weights,
                                         CudaEngineOptions options) {
  weights.reset();  // nothing to run them on
  static_cast<void>(options);
  throw ConfigError("the CUDA engine is not available in this build");
}

}  // namespace kvtier::kernels
