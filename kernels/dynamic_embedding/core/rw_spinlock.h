// A reader-writer spinlock, one per table shard. Readers take it with a single CAS, so the
// lookup path has no global lock and no syscall; writers announce themselves first so a
// steady stream of readers cannot starve them. Spinning yields after a few tries because
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
    for (int spins = 0;; ++spins) {
      uint32_t state = state_.load(std::memory_order_relaxed);
      if (!(state & kWriter) &&
          state_.compare_exchange_weak(state, state + 1, std::memory_order_acquire)) {
        return;
      }
      Backoff(spins);
    }
  }
  void unlock_shared() { state_.fetch_sub(1, std::memory_order_release); }

  void lock() {
    for (int spins = 0;; ++spins) {
      uint32_t state = state_.load(std::memory_order_relaxed);
      if (!(state & kWriter) &&
          state_.compare_exchange_weak(state, state | kWriter, std::memory_order_acquire)) {
        break;
      }
      Backoff(spins);
    }
    // New readers are now held off; wait for the ones inside to leave.
    for (int spins = 0; state_.load(std::memory_order_acquire) != kWriter; ++spins) Backoff(spins);
  }
  void unlock() { state_.store(0, std::memory_order_release); }

 private:
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
