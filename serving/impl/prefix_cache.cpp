#include "serving/prefix_cache.hpp"

#include <stdexcept>

namespace kvtier::serving {

namespace {
constexpr std::uint64_t kOwnContent = 1ULL << 63;
}  // namespace

BlockKey block_key(const RequestSpec& request, std::uint32_t index, std::uint64_t place,
                   std::uint32_t block_tokens) {
  const std::uint64_t end = (place + 1) * block_tokens;  // one past the block's last token
  if (end <= request.shared_tokens) {
    return BlockKey{request.segments[(end - 1) / request.segment_tokens], place};
  }
  return BlockKey{kOwnContent | index, place};
}

bool PrefixCache::held(const BlockKey& key) const {
  const auto entry = entries_.find(key);
  return entry != entries_.end() && entry->second.holders > 0;
}

void PrefixCache::acquire(const BlockKey& key) {
  Entry& entry = entries_.at(key);
  if (entry.holders++ == 0) {
    free_.erase(entry.released);
  }
}

bool PrefixCache::insert(const BlockKey& key) {
  return entries_.emplace(key, Entry{1, 0}).second;
}

void PrefixCache::release(const BlockKey& key) {
  Entry& entry = entries_.at(key);
  if (entry.holders == 0) {
    throw std::logic_error("prefix cache: a block released more often than taken");
  }
  if (--entry.holders == 0) {
    entry.released = releases_++;
    free_.emplace(entry.released, key);
  }
}

std::uint64_t PrefixCache::evict_down_to(std::uint64_t blocks) {
  std::uint64_t evicted = 0;
  while (free_.size() > blocks) {
    entries_.erase(free_.begin()->second);
    free_.erase(free_.begin());
    ++evicted;
  }
  return evicted;
}

bool HostBlockStore::store(const BlockKey& key) {
  if (holds(key)) {
    touch(key);
    return false;
  }
  if (capacity_ == 0) {
    return false;
  }
  if (entries_.size() == capacity_) {
    entries_.erase(by_use_.begin()->second);
    by_use_.erase(by_use_.begin());
    ++dropped_;
  }
  entries_.emplace(key, uses_);
  by_use_.emplace(uses_++, key);
  return true;
}

void HostBlockStore::touch(const BlockKey& key) {
  std::uint64_t& used = entries_.at(key);
  by_use_.erase(used);
  used = uses_++;
  by_use_.emplace(used, key);
}

}  // namespace kvtier::serving
