#pragma once
// Automatic prefix caching as vLLM's V1 KV cache manager keeps it, as block bookkeeping: full KV
// blocks are cached by content, a request takes the cached blocks its prompt starts with instead
// of prefilling them, and blocks no running request holds stay cached until the memory they take
// is needed, the least recently released evicted first.
//
// A block's content is named by a key. Blocks inside a request's shared part (RequestSpec's
// segments) are named by the id of the segment that holds the block's last token and the block's
// place: equal segment ids name equal content from the prompt's start, so two requests with the
// same key hold the same KV. Every other full block (the rest of its prompt, its generated
// tokens) is the request's own, named by the request and the block's place: only the request
// itself meets it again, when it is recomputed after a preemption.

#include <cstdint>
#include <map>
#include <unordered_map>

#include "serving/workload.hpp"

namespace kvtier::serving {

struct BlockKey {
  // A segment id below 2^63, or 2^63 + the request's index for a block of its own.
  std::uint64_t content = 0;
  std::uint64_t place = 0;  // the block's index in the request's context
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

// The key of block `place` (tokens [place·B, (place + 1)·B)) of request `index`.
[[nodiscard]] BlockKey block_key(const RequestSpec& request, std::uint32_t index,
                                 std::uint64_t place, std::uint32_t block_tokens);

struct BlockKeyHash {
  std::size_t operator()(const BlockKey& key) const noexcept {
    return std::hash<std::uint64_t>{}(key.content * 0x9E3779B97F4A7C15ULL ^ key.place);
  }
};

class PrefixCache {
 public:
  // Whether a block of this content is cached (held by a running request, or free but kept).
  [[nodiscard]] bool cached(const BlockKey& key) const { return entries_.contains(key); }
  // Whether a running request holds it.
  [[nodiscard]] bool held(const BlockKey& key) const;
  // A request takes a cached block: held once more (no longer evictable if it was free).
  void acquire(const BlockKey& key);
  // A request's block just filled: cached, held by it. False (nothing changes) when a block of
  // this content is cached already; the request keeps its copy as its own, uncached (as vLLM
  // keeps the first block of a content it caches).
  bool insert(const BlockKey& key);
  // A request lets go of a block it holds; held by none, it is free and kept, the most recently
  // released.
  void release(const BlockKey& key);
  // Evicts the least recently released free blocks until at most `blocks` remain; returns how
  // many it evicted.
  std::uint64_t evict_down_to(std::uint64_t blocks);

  [[nodiscard]] std::uint64_t held_blocks() const noexcept {
    return entries_.size() - free_.size();
  }
  [[nodiscard]] std::uint64_t free_blocks() const noexcept { return free_.size(); }

 private:
  struct Entry {
    std::uint32_t holders = 0;
    std::uint64_t released = 0;  // its place in free_ while holders == 0
  };
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_;
  std::map<std::uint64_t, BlockKey> free_;  // by release order, oldest first
  std::uint64_t releases_ = 0;
};

// The prefix cache's second tier in host memory (memory.prefix_cache_host_gib, as vLLM's CPU
// offloading connector or LMCache's local CPU store keep it): a copy of every block the cache
// keeps, stored as it fills, the least recently used dropped when it is full.
class HostBlockStore {
 public:
  explicit HostBlockStore(std::uint64_t capacity_blocks) : capacity_(capacity_blocks) {}
  [[nodiscard]] bool holds(const BlockKey& key) const { return entries_.contains(key); }
  // Stores a block: true when it is copied in, false when there is nothing to copy (it holds one
  // of this content already, now marked used, or it has no room for one block). A full store
  // drops its least recently used block first.
  bool store(const BlockKey& key);
  // Marks a block it holds used: a request loaded it.
  void touch(const BlockKey& key);
  [[nodiscard]] std::uint64_t blocks() const noexcept { return entries_.size(); }
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  std::uint64_t capacity_;
  std::unordered_map<BlockKey, std::uint64_t, BlockKeyHash> entries_;  // its last use
  std::map<std::uint64_t, BlockKey> by_use_;                           // oldest first
  std::uint64_t uses_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace kvtier::serving
