#pragma once
// Internal: the live cache's T1 <-> T2 recodes on the host, for both backends (docs/LIVE.md,
// "Host recodes"). They run between decode steps, on the step's path, so they are spread over a
// pool. A phase's moves read slots held when it began and write slots that were free then (a
// slot freed by a phase is not reused within it: kernels/tier_book.hpp), so no two moves touch
// the same bytes, and a move's bytes depend on its own slots alone. Chunks are runs of
// kRecodeChunk moves of the list, fixed by the list and not by the thread count: the recoded
// bytes are the same for every count.

#include <cstddef>
#include <functional>

#include "kernels/impl/worker_pool.hpp"
#include "kernels/tiered_cache.hpp"

namespace kvtier::kernels {

// Moves per chunk: a 7B token-layer recodes in microseconds, so a chunk is worth waking a
// thread for, and a re-tiering's few hundred moves still make dozens of chunks.
inline constexpr std::size_t kRecodeChunk = 4;

// Runs recode(i, scratch) for every move i in [0, moves) on `pool`, where `scratch` is
// `scratch_floats` floats of the calling chunk's own (null when 0). `values` is the values one
// move recodes, the pool's measure of the loop's work (a small batch runs on the caller alone).
void recode_on_pool(WorkerPool& pool, std::size_t moves, std::size_t values,
                    std::size_t scratch_floats,
                    const std::function<void(std::size_t, float*)>& recode);

}  // namespace kvtier::kernels
