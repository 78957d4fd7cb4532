#pragma once
// A move-only `void()` callable that keeps small callables inside itself instead of on the heap.
//
// Why not std::function: libstdc++'s std::function stores at most 16 bytes inline and must be
// copyable, so a lambda capturing `this` plus two ids — the typical event — allocates on every
// schedule. The simulator runs tens of millions of events a second, and an allocation per event
// would cost more than the rest of the event put together (bench/des_hold.cpp counts them).
// Callables up to kInlineBytes with alignment ≤ 8 that move without throwing live inline; larger
// ones fall back to one heap allocation, so correctness never depends on the size.

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace kvtier::sim {

class InlineCallback {
 public:
  static constexpr std::size_t kInlineBytes = 40;

  // True when a callable of type F is stored without a heap allocation.
  template <class F>
  static constexpr bool stores_inline() noexcept {
    using Stored = std::decay_t<F>;
    return sizeof(Stored) <= kInlineBytes && alignof(Stored) <= alignof(std::max_align_t) &&
           alignof(Stored) <= kStorageAlign && std::is_nothrow_move_constructible_v<Stored>;
  }

  InlineCallback() noexcept = default;

  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, InlineCallback> && std::is_invocable_r_v<void, F&>)
      InlineCallback(F&& callable) {  // NOLINT(google-explicit-constructor): lambdas convert freely
    emplace(std::forward<F>(callable));
  }

  InlineCallback(InlineCallback&& other) noexcept { take(other); }
  InlineCallback& operator=(InlineCallback&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  InlineCallback(const InlineCallback&) = delete;
  InlineCallback& operator=(const InlineCallback&) = delete;
  ~InlineCallback() { reset(); }

  // Replaces the held callable (if any) with `callable`, constructed in place.
  template <class F>
  void emplace(F&& callable) {
    using Stored = std::decay_t<F>;
    reset();
    if constexpr (stores_inline<F>()) {
      ::new (static_cast<void*>(storage_)) Stored(std::forward<F>(callable));
      ops_ = &kInlineOps<Stored>;
    } else {
      auto owned = std::make_unique<Stored>(std::forward<F>(callable));
      ::new (static_cast<void*>(storage_)) Stored*(owned.release());
      ops_ = &kHeapOps<Stored>;
    }
  }

  // Calls the held callable; calling an empty InlineCallback is a precondition violation.
  void operator()() { ops_->invoke(storage_); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  void reset() noexcept {
    if (ops_ != nullptr) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

 private:
  static constexpr std::size_t kStorageAlign = 8;

  // A hand-written vtable: one pointer per stored object instead of a virtual base class,
  // and no allocation to hold it.
  struct Ops {
    void (*invoke)(void* storage);
    void (*relocate)(void* from, void* to) noexcept;  // move-construct at `to`, destroy `from`
    void (*destroy)(void* storage) noexcept;
  };

  template <class Stored>
  static constexpr Ops kInlineOps = {
      [](void* storage) { (*std::launder(static_cast<Stored*>(storage)))(); },
      [](void* from, void* to) noexcept {
        Stored* source = std::launder(static_cast<Stored*>(from));
        ::new (to) Stored(std::move(*source));
        source->~Stored();
      },
      [](void* storage) noexcept { std::launder(static_cast<Stored*>(storage))->~Stored(); },
  };

  template <class Stored>
  static constexpr Ops kHeapOps = {
      [](void* storage) { (**std::launder(static_cast<Stored**>(storage)))(); },
      [](void* from, void* to) noexcept {
        ::new (to) Stored*(*std::launder(static_cast<Stored**>(from)));
      },
      [](void* storage) noexcept { delete *std::launder(static_cast<Stored**>(storage)); },
  };

  void take(InlineCallback& other) noexcept {
    if (other.ops_ != nullptr) {
      other.ops_->relocate(other.storage_, storage_);
      ops_ = std::exchange(other.ops_, nullptr);
    }
  }

  alignas(kStorageAlign) std::byte storage_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace kvtier::sim
