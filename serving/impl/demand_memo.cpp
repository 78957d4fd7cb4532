#include "serving/demand_memo.hpp"

namespace kvtier::serving {

std::mutex& hdf5_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::shared_ptr<const MemoDemand> DemandMemo::get(const std::string& key, const Compute& compute,
                                                  bool uses_hdf5) {
  std::promise<std::shared_ptr<const MemoDemand>> promise;
  std::shared_future<std::shared_ptr<const MemoDemand>> future;
  bool owner = false;
  {
    const std::lock_guard lock(mutex_);
    const auto found = entries_.find(key);
    if (found == entries_.end()) {
      future = promise.get_future().share();
      entries_.emplace(key, future);
      owner = true;
    } else {
      future = found->second;
    }
  }
  if (owner) {
    try {
      std::unique_lock<std::mutex> hdf5(hdf5_mutex(), std::defer_lock);
      if (uses_hdf5) {
        hdf5.lock();
      }
      promise.set_value(std::make_shared<const MemoDemand>(compute()));
    } catch (...) {
      {
        const std::lock_guard lock(mutex_);
        entries_.erase(key);
      }
      promise.set_exception(std::current_exception());
    }
  }
  return future.get();
}

std::size_t DemandMemo::size() const {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace kvtier::serving
