#pragma once
// An output's temporary name, FILE.tmp.PID beside FILE, removed unless the output was finished
// and renamed into place — also when the process is stopped by SIGINT, SIGTERM or SIGHUP, once
// main() has called install_interrupt_cleanup(). So neither an error nor Ctrl-C leaves a
// half-written file behind, under its own name or a temporary one.

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

namespace kvtier {

namespace detail {

// The temporary names a signal handler may remove. A handler can touch nothing but lock-free
// atomics and fixed storage, so the names live in slots claimed with compare-and-swap: a slot is
// free, being written (claimed, name not yet complete) or holding a name. Process-wide by
// nature, like the signals.
struct InterruptCleanupSlot {
  static constexpr int kFree = 0;
  static constexpr int kWriting = 1;
  static constexpr int kHolding = 2;
  std::atomic<int> state{kFree};
  std::array<char, 4096> path{};
};
static_assert(std::atomic<int>::is_always_lock_free);

// More temporaries at once than this (a sweep's threads each hold one or two) are still
// removed on errors, just not on signals.
inline constexpr std::size_t kInterruptCleanupSlots = 256;
inline std::array<InterruptCleanupSlot, kInterruptCleanupSlots> interrupt_cleanup_slots;

// The slot now holding `path`, or -1 when none is free or the name is too long.
inline int hold_for_interrupt_cleanup(const std::string& path) noexcept {
  auto& slots = interrupt_cleanup_slots;
  if (path.size() >= slots.front().path.size()) {
    return -1;
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    int expected = InterruptCleanupSlot::kFree;
    if (slots[i].state.compare_exchange_strong(expected, InterruptCleanupSlot::kWriting)) {
      std::memcpy(slots[i].path.data(), path.c_str(), path.size() + 1);
      slots[i].state.store(InterruptCleanupSlot::kHolding);
      return static_cast<int>(i);
    }
  }
  return -1;
}

inline void release_for_interrupt_cleanup(int slot) noexcept {
  if (slot >= 0) {
    interrupt_cleanup_slots[static_cast<std::size_t>(slot)].state.store(
        InterruptCleanupSlot::kFree);
  }
}

inline void remove_temporaries_and_die(int signal_number) {
  for (InterruptCleanupSlot& slot : interrupt_cleanup_slots) {
    if (slot.state.load() == InterruptCleanupSlot::kHolding) {
      (void)::unlink(slot.path.data());
    }
  }
  // Die of the signal, as without the handler: the shell sees 128 + N.
  (void)::signal(signal_number, SIG_DFL);
  (void)::raise(signal_number);
}

}  // namespace detail

// Makes SIGINT, SIGTERM and SIGHUP remove the temporaries in use before the process dies of them.
// Signals ignored when the process started (nohup, a shell's background job) stay ignored.
inline void install_interrupt_cleanup() {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) != 0 || current.sa_handler == SIG_IGN) {
      continue;
    }
    struct sigaction cleanup {};
    cleanup.sa_handler = detail::remove_temporaries_and_die;
    sigemptyset(&cleanup.sa_mask);
    (void)::sigaction(signal_number, &cleanup, nullptr);
  }
}

// Where an output named `path` is written: the file a symbolic link names (the link stays, as
// when a shell redirects into it), else `path` itself.
[[nodiscard]] inline std::filesystem::path output_target(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_symlink(path, error)) {
    std::filesystem::path target = std::filesystem::canonical(path, error);
    if (!error) {
      return target;
    }
  }
  return path;
}

// The temporary of the output `final_path`, beside its target() so that the rename stays in one
// file system.
class TemporaryFile {
 public:
  explicit TemporaryFile(const std::filesystem::path& final_path)
      : target_(output_target(final_path)),
        path_(target_.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()))),
        slot_(detail::hold_for_interrupt_cleanup(path_.string())) {}
  TemporaryFile(TemporaryFile&& other) noexcept
      : target_(std::move(other.target_)),
        path_(std::move(other.path_)),
        slot_(std::exchange(other.slot_, -1)),
        released_(std::exchange(other.released_, true)) {}
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  TemporaryFile& operator=(TemporaryFile&&) = delete;
  ~TemporaryFile() {
    if (!released_) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
    detail::release_for_interrupt_cleanup(slot_);
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  // What the finished temporary is renamed to (output_target of the output's name).
  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }
  // The file was renamed into place (or is someone else's now): leave it.
  void release() noexcept {
    released_ = true;
    detail::release_for_interrupt_cleanup(std::exchange(slot_, -1));
  }

 private:
  std::filesystem::path target_;
  std::filesystem::path path_;
  int slot_ = -1;
  bool released_ = false;
};

}  // namespace kvtier
