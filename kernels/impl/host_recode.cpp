#include "kernels/impl/host_recode.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kvtier::kernels {

RecodePoolShape recode_pool_shape() {
  return {static_cast<std::uint32_t>(kRecodeChunk),
          static_cast<std::uint64_t>(WorkerPool::kParallelWork)};
}

void recode_on_pool(WorkerPool& pool, std::size_t moves, std::size_t values,
                    std::size_t scratch_floats,
                    const std::function<void(std::size_t, float*)>& recode) {
  if (moves == 0) {
    return;
  }
  const std::size_t chunks = (moves + kRecodeChunk - 1) / kRecodeChunk;
  if (chunks > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::logic_error("host recodes: more moves than one loop holds");
  }
  const auto work = static_cast<std::int64_t>(
      std::min<std::size_t>(moves * values, std::numeric_limits<std::int64_t>::max()));
  pool.for_each_chunk(static_cast<int>(chunks), work, [&](int chunk) {
    std::vector<float> scratch(scratch_floats);
    const std::size_t first = static_cast<std::size_t>(chunk) * kRecodeChunk;
    const std::size_t last = std::min(moves, first + kRecodeChunk);
    for (std::size_t i = first; i < last; ++i) {
      recode(i, scratch_floats > 0 ? scratch.data() : nullptr);
    }
  });
}

}  // namespace kvtier::kernels
