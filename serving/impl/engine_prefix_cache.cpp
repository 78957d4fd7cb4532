// The serving engine's prefix cache (memory.prefix_caching) and its host tier: which cached
// blocks a prefill takes, the blocks it caches as they fill, eviction, and the host tier's copies.

#include <algorithm>
#include <cmath>

#include "serving/engine.hpp"

namespace kvtier::serving {
namespace {

// The chunks of `blocks_per_chunk` blocks (chunk c: blocks c·n .. c·n + n − 1) that blocks
// counted in increasing order touch: each one copy of the prefix cache's host tier.
class ChunkCounter {
 public:
  explicit ChunkCounter(std::uint64_t blocks_per_chunk) : blocks_per_chunk_(blocks_per_chunk) {}
  void count(std::uint64_t block) {
    if (blocks_per_chunk_ == 0) {
      return;
    }
    const std::uint64_t chunk = block / blocks_per_chunk_;
    if (touched_ == 0 || chunk != last_) {
      ++touched_;
      last_ = chunk;
    }
  }
  [[nodiscard]] std::uint64_t touched() const noexcept { return touched_; }

 private:
  std::uint64_t blocks_per_chunk_;
  std::uint64_t last_ = 0;
  std::uint64_t touched_ = 0;
};

}  // namespace

ServingEngine::PrefixHits ServingEngine::prefix_hits(std::uint32_t id) const {
  const Request& request = requests_[id];
  PrefixHits hits;
  // A decode engine's request arriving with its prompt's KV at a prefill engine pulls only the
  // blocks not cached here (as vLLM's and Dynamo's connectors do): every full block of its
  // prompt may be a hit. A prefill looks up all but its last token's block.
  if (!prefix_cache_ || (!request.remote && (request.prefilled > 0 || !prefilling(request)))) {
    return hits;
  }
  const std::uint64_t limit = request.remote ? request.spec.prompt_tokens / plan_.block_tokens
                                             : (request.prefill_target - 1) / plan_.block_tokens;
  while (hits.blocks < limit) {
    const BlockKey key = block_key(request.spec, id, hits.blocks, plan_.block_tokens);
    if (prefix_cache_->cached(key)) {
      hits.free += prefix_cache_->held(key) ? 0 : 1;
    } else if (prefix_host_ && prefix_host_->holds(key)) {
      ++hits.loaded;
    } else {
      break;
    }
    ++hits.blocks;
  }
  return hits;
}

void ServingEngine::take_prefix_hits(std::uint32_t id, const PrefixHits& hits) {
  Request& request = requests_[id];
  // As prefix_hits: a prefill from its start, or a prompt whose KV a prefill engine holds. The
  // latter prefills nothing again: its prompt's blocks not found here are pulled.
  if (!prefix_cache_ || (!request.remote && (request.prefilled > 0 || !prefilling(request)))) {
    return;
  }
  // A decode engine's lookups are not its prefills' (its host-tier loads are copies all the
  // same): the cluster counts what they spared the link (kv_transfer_cached_gb).
  if (!request.remote) {
    totals_.prefix_queried_tokens += request.prefill_target;
    totals_.prefix_hit_tokens += hits.blocks * plan_.block_tokens;
  }
  ChunkCounter chunks(prefix_chunk_blocks_);
  for (std::uint64_t place = 0; place < hits.blocks; ++place) {
    const BlockKey key = block_key(request.spec, id, place, plan_.block_tokens);
    if (prefix_cache_->cached(key)) {
      prefix_cache_->acquire(key);
    } else {
      // From the host tier: copied into a block of its own, cached in HBM again.
      prefix_cache_->insert(key);
      prefix_host_->touch(key);
      ++prefix_loads_now_;
      chunks.count(place);
    }
  }
  prefix_load_chunks_now_ += chunks.touched();
  if (!request.remote) {
    totals_.prefix_host_hit_tokens += hits.loaded * plan_.block_tokens;
  }
  request.cache_held = hits.blocks;
  if (!request.remote) {
    request.prefilled = hits.blocks * plan_.block_tokens;
  }
}

void ServingEngine::cache_filled_blocks(std::uint32_t id) {
  Request& request = requests_[id];
  const std::uint64_t full = cached_tokens(request) / plan_.block_tokens;
  ChunkCounter chunks(prefix_chunk_blocks_);
  while (request.caching && request.cache_held < full) {
    const BlockKey key = block_key(request.spec, id, request.cache_held, plan_.block_tokens);
    if (prefix_cache_->insert(key)) {
      if (prefix_host_ && prefix_host_->store(key)) {
        ++prefix_stores_now_;
        chunks.count(request.cache_held);
      }
      ++request.cache_held;
    } else {
      request.caching = false;
    }
  }
  prefix_store_chunks_now_ += chunks.touched();
}

void ServingEngine::release_cached_blocks(std::uint32_t id) {
  Request& request = requests_[id];
  // Its last blocks first, so that they are the first evicted (as vLLM frees a request's blocks).
  while (request.cache_held > 0) {
    --request.cache_held;
    prefix_cache_->release(block_key(request.spec, id, request.cache_held, plan_.block_tokens));
  }
  request.caching = true;
}

void ServingEngine::evict_prefix_cache() {
  const auto in_use =
      static_cast<std::uint64_t>(std::llround(planned_footprint().hbm / plan_.block_bytes()));
  totals_.prefix_evicted_blocks +=
      prefix_cache_->evict_down_to(capacity_blocks_ - std::min(capacity_blocks_, in_use));
}

sim::Tick ServingEngine::time_prefix_copies(sim::Tick duration) {
  const double block_bytes = plan_.block_bytes();
  const double loaded = static_cast<double>(prefix_loads_now_) * block_bytes;
  const double stored = static_cast<double>(prefix_stores_now_) * block_bytes;
  // Per block: one copy of each of this GPU's layers' keys and one of its values, as a swap's. In
  // chunks: one copy per chunk, after a kernel gathers a store's blocks and before one scatters a
  // load's, each reading and writing their bytes in HBM.
  const bool chunked = prefix_chunk_blocks_ > 0;
  const std::uint64_t copies_per_block = 2ULL * kv_layers_per_gpu_;
  const std::uint64_t load_copies =
      chunked ? prefix_load_chunks_now_ : prefix_loads_now_ * copies_per_block;
  const std::uint64_t store_copies =
      chunked ? prefix_store_chunks_now_ : prefix_stores_now_ * copies_per_block;
  const double hbm_bytes_per_s = cost_model_.gpu().memory_bytes_per_second();
  const auto in_hbm = [chunked, hbm_bytes_per_s](double bytes) {
    return chunked && bytes > 0.0
               ? sim::from_seconds(2.0 * bytes / hbm_bytes_per_s, sim::Rounding::kUp)
               : sim::Tick::zero();
  };
  const sim::Tick gather = in_hbm(stored);
  const sim::Tick scatter = in_hbm(loaded);
  const sim::Tick loads = swap_time(loaded, load_copies, prefix_copy_rates_.h2d_bytes_per_s,
                                    prefix_copy_rates_.h2d_setup);
  const sim::Tick stores = swap_time(stored, store_copies, prefix_copy_rates_.d2h_bytes_per_s,
                                     prefix_copy_rates_.d2h_setup);
  totals_.prefix_load_bytes += loaded;
  totals_.prefix_store_bytes += stored;
  totals_.prefix_load_busy += loads;
  totals_.prefix_store_busy += stores;
  totals_.prefix_copies += load_copies + store_copies;
  totals_.prefix_gather_busy += gather + scatter;
  totals_.h2d_bytes += loaded;
  totals_.d2h_bytes += stored;
  totals_.h2d_busy += loads;
  totals_.d2h_busy += stores;
  prefix_loads_now_ = prefix_stores_now_ = 0;
  prefix_load_chunks_now_ = prefix_store_chunks_now_ = 0;
  if (duration == sim::Tick::zero()) {
    return duration;  // the engine is idle: the stores finish in the background
  }
  // On the GPU: the gather, the scatter once the loads are in, the forward pass. The stores
  // follow the gather on the other copy engine, beside it all.
  const sim::Tick forward_end = std::max(gather, loads) + scatter + duration;
  const sim::Tick total = std::max(forward_end, gather + stores);
  totals_.copy_wait += total - duration;
  return total;
}

}  // namespace kvtier::serving
