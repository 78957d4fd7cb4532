#pragma once
// The pending-event set behind sim::Simulator: a binary heap of small keys over a pool of slots
// that hold the callables.
//
// Order: (time, priority, insertion sequence), a strict total order, so events that tie on time
// and priority run in the order they were scheduled and every run is reproducible.
//
// Why keys and slots are separate: the heap moves its entries on every push and pop, so entries
// are 24-byte keys; the callable stays put in a slot until it has run. Slots live in fixed-size
// chunks that never move, so a running callable may schedule events (growing the pool) without
// being relocated under its own feet.
//
// Cancellation is lazy: cancelling destroys the callable, frees the slot and bumps the slot's
// generation; the heap key stays behind and is skipped when it surfaces (its generation no
// longer matches). When skipped keys outnumber live ones the heap is rebuilt without them, so a
// model that cancels and reschedules often (a bandwidth-shared link) cannot bloat the heap.

#include <cstdint>
#include <memory>
#include <vector>

#include "sim/inline_callback.hpp"
#include "sim/tick.hpp"

namespace kvtier::sim {

// Orders events that share a time: lower values run first.
using Priority = std::int16_t;
inline constexpr Priority kDefaultPriority = 0;
// Runs after every other event at the same time (statistics sampling sees the settled state).
inline constexpr Priority kLastPriority = INT16_MAX;

// Refers to one scheduled event; stays safe to use after the event ran or was cancelled. (A slot's
// generation is 32 bits, so a handle kept while its slot is reused 2^32 times could alias a
// later event; no model keeps handles that long.)
class EventHandle {
 public:
  EventHandle() noexcept = default;  // refers to no event

 private:
  friend class EventQueue;
  static constexpr std::uint32_t kNoSlot = UINT32_MAX;
  EventHandle(std::uint32_t slot, std::uint32_t generation) noexcept
      : slot_(slot), generation_(generation) {}
  std::uint32_t slot_ = kNoSlot;
  std::uint32_t generation_ = 0;
};

class EventQueue {
 public:
  EventQueue() = default;
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Adds an event; `background` events do not count in foreground_size().
  template <class F>
  EventHandle push(Tick when, Priority priority, bool background, F&& action) {
    const std::uint64_t order = order_of(priority);
    const std::uint32_t index = acquire_slot();
    Slot& slot = slot_at(index);
    try {
      slot.action.emplace(std::forward<F>(action));
      push_key(Key{when.picoseconds(), order, index, slot.generation});
    } catch (...) {  // a throwing copy of the callable, or no memory: leave the queue as it was
      slot.action.reset();
      release_slot(index);
      throw;
    }
    slot.background = background;
    ++live_;
    foreground_ += background ? 0 : 1;
    return EventHandle(index, slot.generation);
  }

  // Removes a pending event so it never runs. False (and no effect) when the handle's event has
  // already run, is running, was cancelled, or the handle refers to no event.
  bool cancel(EventHandle handle);
  [[nodiscard]] bool is_pending(EventHandle handle) const noexcept;

  [[nodiscard]] bool empty() const noexcept { return live_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return live_; }
  [[nodiscard]] std::size_t foreground_size() const noexcept { return foreground_; }

  // Time of the earliest pending event; the queue must not be empty.
  [[nodiscard]] Tick next_time() {
    drop_cancelled_top();
    return Tick::ps(heap_.front().time);
  }

  // Removes the earliest pending event and runs it; the queue must not be empty. The event's
  // handle stops being pending before the callable starts, so the callable cancelling itself is
  // a harmless no-op.
  void run_next();

 private:
  struct Key {
    std::int64_t time;
    std::uint64_t order;  // priority in the top 16 bits, insertion sequence below
    std::uint32_t slot;
    std::uint32_t generation;
  };
  struct Slot {
    InlineCallback action;
    std::uint32_t generation = 0;
    std::uint32_t next_free = 0;
    bool background = false;
  };
  static constexpr std::uint32_t kChunkShift = 10;
  static constexpr std::uint32_t kChunkSize = 1u << kChunkShift;
  static constexpr std::uint64_t kSequenceLimit = std::uint64_t{1} << 48;

  // True when `a` runs after `b`: the heap keeps the earliest key on top.
  static bool runs_after(const Key& a, const Key& b) noexcept {
    return a.time != b.time ? a.time > b.time : a.order > b.order;
  }

  std::uint64_t order_of(Priority priority) {
    if (next_sequence_ == kSequenceLimit) {
      throw_sequence_exhausted();
    }
    // Flipping the sign bit maps int16 onto uint16 preserving order.
    const auto biased = static_cast<std::uint64_t>(static_cast<std::uint16_t>(priority) ^ 0x8000u);
    return (biased << 48) | next_sequence_++;
  }

  Slot& slot_at(std::uint32_t index) noexcept {
    return chunks_[index >> kChunkShift][index & (kChunkSize - 1)];
  }
  const Slot& slot_at(std::uint32_t index) const noexcept {
    return chunks_[index >> kChunkShift][index & (kChunkSize - 1)];
  }

  std::uint32_t acquire_slot() {
    if (free_head_ == kNoFreeSlot) {
      add_chunk();
    }
    const std::uint32_t index = free_head_;
    free_head_ = slot_at(index).next_free;
    return index;
  }
  void release_slot(std::uint32_t index) noexcept {
    slot_at(index).next_free = free_head_;
    free_head_ = index;
  }

  void push_key(const Key& key);
  void pop_key() noexcept;
  void drop_cancelled_top() noexcept;
  void add_chunk();
  void compact_heap();
  [[noreturn]] static void throw_sequence_exhausted();

  static constexpr std::uint32_t kNoFreeSlot = UINT32_MAX;

  std::vector<Key> heap_;
  std::vector<std::unique_ptr<Slot[]>> chunks_;
  std::uint32_t free_head_ = kNoFreeSlot;
  std::uint64_t next_sequence_ = 0;
  std::size_t live_ = 0;        // pending events
  std::size_t foreground_ = 0;  // pending events that keep Simulator::run() going
  std::size_t cancelled_in_heap_ = 0;
};

}  // namespace kvtier::sim
