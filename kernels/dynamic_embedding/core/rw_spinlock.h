// A reader-writer spinlock, one per table shard. Readers take it with a single CAS, so the
// lookup path has no global lock and no syscall. The hand-over is phase-fair: a writer announces
// itself first, so a steady stream of readers cannot starve it, and the readers that queued
// behind a writer get in before any writer takes the lock again, so a writer re-locking in a
// loop (eviction's batches) cannot starve them either. Spinning yields after a few tries because
// TensorFlow's pools usually have more threads than cores.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_RW_SPINLOCK_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_RW_SPINLOCK_H_

#include <atomic>
#include <cstdint>
#include <thread>

namespace tf_ext {
namespace de {

class RWSpinLock {
 public:
  void lock_shared() {
    uint32_t state = state_.load(std::memory_order_relaxed);
    while (!(state & kWriter)) {  // the fast path: no writer
      if (state_.compare_exchange_weak(state, state + kReader, std::memory_order_acquire)) return;
    }
    // A writer holds the lock or waits for it: queue, so that no writer takes it after this one
    // before this reader is in.
    state_.fetch_add(kQueued, std::memory_order_relaxed);
    for (int spins = 0;; ++spins) {
      state = state_.load(std::memory_order_relaxed);
      if (!(state & kWriter) && state_.compare_exchange_weak(state, state - kQueued + kReader,
                                                             std::memory_order_acquire)) {
        return;
      }
      Backoff(spins);
    }
  }
  void unlock_shared() { state_.fetch_sub(kReader, std::memory_order_release); }

  void lock() {
    for (int spins = 0;; ++spins) {
      uint32_t state = state_.load(std::memory_order_relaxed);
      if (!(state & (kWriter | kQueuedMask)) &&
          state_.compare_exchange_weak(state, state | kWriter, std::memory_order_acquire)) {
        break;
      }
      Backoff(spins);
    }
    // New readers now queue; wait for the ones inside to leave.
    for (int spins = 0; state_.load(std::memory_order_acquire) & kReaderMask; ++spins) {
      Backoff(spins);
    }
  }
  // Clears only the writer bit: the count of queued readers stays.
  void unlock() { state_.fetch_and(~kWriter, std::memory_order_release); }
  // Readers waiting behind a writer now (for tests of the hand-over).
  uint32_t queued_readers() const {
    return (state_.load(std::memory_order_acquire) & kQueuedMask) / kQueued;
  }

 private:
  // state_: readers inside (bits 0-15), readers queued behind a writer (bits 16-30), writer (31).
  static constexpr uint32_t kReader = 1, kReaderMask = 0xffff;
  static constexpr uint32_t kQueued = 1u << 16, kQueuedMask = 0x7fffu << 16;
  static constexpr uint32_t kWriter = 1u << 31;
  static void Backoff(int spins) {
    if (spins > 16) std::this_thread::yield();
  }
  std::atomic<uint32_t> state_{0};
};

class SharedGuard {
 public:
  explicit SharedGuard(RWSpinLock& lock) : lock_(lock) { lock_.lock_shared(); }
  ~SharedGuard() { lock_.unlock_shared(); }
  SharedGuard(const SharedGuard&) = delete;
  SharedGuard& operator=(const SharedGuard&) = delete;

 private:
  RWSpinLock& lock_;
};

class ExclusiveGuard {
 public:
  explicit ExclusiveGuard(RWSpinLock& lock) : lock_(lock) { lock_.lock(); }
  ~ExclusiveGuard() { lock_.unlock(); }
  ExclusiveGuard(const ExclusiveGuard&) = delete;
  ExclusiveGuard& operator=(const ExclusiveGuard&) = delete;

 private:
  RWSpinLock& lock_;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_RW_SPINLOCK_H_
