#include "sim/event_queue.hpp"

#include <algorithm>
#include <stdexcept>

namespace kvtier::sim {

bool EventQueue::is_pending(EventHandle handle) const noexcept {
  return handle.slot_ < chunks_.size() * kChunkSize &&
         slot_at(handle.slot_).generation == handle.generation_;
}

bool EventQueue::cancel(EventHandle handle) {
  if (!is_pending(handle)) {
    return false;
  }
  Slot& slot = slot_at(handle.slot_);
  ++slot.generation;  // the heap key goes stale; the handle stops being pending
  --live_;
  foreground_ -= slot.background ? 0 : 1;
  slot.action.reset();
  release_slot(handle.slot_);
  ++cancelled_in_heap_;
  // Rebuilding costs O(heap size); doing it only when stale keys are the majority keeps the
  // amortised cost per cancel constant.
  if (cancelled_in_heap_ > 1024 && cancelled_in_heap_ > heap_.size() / 2) {
    compact_heap();
  }
  return true;
}

void EventQueue::run_next() {
  drop_cancelled_top();
  const Key top = heap_.front();
  pop_key();
  Slot& slot = slot_at(top.slot);
  ++slot.generation;
  --live_;
  foreground_ -= slot.background ? 0 : 1;
  // The slot is released after the callable returns (or throws), never while it runs, so the
  // callable's own storage cannot be handed to an event it schedules.
  struct ReleaseAfterRun {
    EventQueue& queue;
    std::uint32_t index;
    ~ReleaseAfterRun() {
      queue.slot_at(index).action.reset();
      queue.release_slot(index);
    }
  } release{*this, top.slot};
  slot.action();
}

// Binary heap with a moving hole (one copy per level rather than a swap): the earliest key sits
// at index 0 and no parent runs after its children.
void EventQueue::push_key(const Key& key) {
  heap_.push_back(key);
  std::size_t hole = heap_.size() - 1;
  while (hole > 0) {
    const std::size_t parent = (hole - 1) / 2;
    if (!runs_after(heap_[parent], key)) {
      break;
    }
    heap_[hole] = heap_[parent];
    hole = parent;
  }
  heap_[hole] = key;
}

void EventQueue::pop_key() noexcept {
  const Key last = heap_.back();
  heap_.pop_back();
  const std::size_t size = heap_.size();
  if (size == 0) {
    return;
  }
  std::size_t hole = 0;
  for (;;) {
    std::size_t child = 2 * hole + 1;
    if (child >= size) {
      break;
    }
    if (child + 1 < size && runs_after(heap_[child], heap_[child + 1])) {
      ++child;
    }
    if (!runs_after(last, heap_[child])) {
      break;
    }
    heap_[hole] = heap_[child];
    hole = child;
  }
  heap_[hole] = last;
}

void EventQueue::drop_cancelled_top() noexcept {
  while (!heap_.empty() && slot_at(heap_.front().slot).generation != heap_.front().generation) {
    pop_key();
    --cancelled_in_heap_;
  }
}

void EventQueue::add_chunk() {
  const auto first = static_cast<std::uint32_t>(chunks_.size() * kChunkSize);
  if (first > kNoFreeSlot - kChunkSize) {
    throw std::length_error("sim::EventQueue: more than 4 billion pending events");
  }
  chunks_.push_back(std::make_unique<Slot[]>(kChunkSize));
  // Thread the new slots onto the free list in ascending order.
  for (std::uint32_t i = kChunkSize; i-- > 0;) {
    release_slot(first + i);
  }
}

void EventQueue::compact_heap() {
  std::erase_if(heap_,
                [this](const Key& key) { return slot_at(key.slot).generation != key.generation; });
  std::make_heap(heap_.begin(), heap_.end(), runs_after);
  cancelled_in_heap_ = 0;
}

void EventQueue::throw_sequence_exhausted() {
  throw std::overflow_error("sim::EventQueue: more than 2^48 events scheduled in one run");
}

}  // namespace kvtier::sim
