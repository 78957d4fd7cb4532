// make_cuda_tiered_cache in builds without the CUDA targets.
#include "common/errors.hpp"
#include "kernels/cuda_tiered_cache.hpp"

namespace kvtier::kernels {

std::unique_ptr<LiveKvCache> make_cuda_tiered_cache(Engine& engine,
                                                    const TieredCacheOptions& options) {
  static_cast<void>(engine);
  static_cast<void>(options);
  throw ConfigError("the CUDA backend of the live tiered cache is not available in this build");
}

}  // namespace kvtier::kernels
