// A bounded single-producer/single-consumer ring: how NCCL's proxy thread hands requests to a
// HARP worker without a lock. One thread may Push, one other thread may Pop; indices only grow and
// wrap by masking, so full and empty are told apart without a spare slot.
#ifndef TF_EXT_KERNELS_HARP_CORE_SPSC_RING_H_
#define TF_EXT_KERNELS_HARP_CORE_SPSC_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

template <typename T, size_t kCapacity>
class SpscRing {
  static_assert(kCapacity > 0 && (kCapacity & (kCapacity - 1)) == 0, "a power of two");

 public:
  // Producer only. False when full.
  bool Push(const T& value) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_cache_ == kCapacity) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (tail - head_cache_ == kCapacity) return false;
    }
    slots_[tail & (kCapacity - 1)] = value;
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer only. False when empty.
  bool Pop(T* value) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_cache_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (head == tail_cache_) return false;
    }
    *value = slots_[head & (kCapacity - 1)];
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  // Either side; a snapshot.
  bool Empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

 private:
  // Producer and consumer indices on separate cache lines, each with a private cached copy of the
  // other's index, so the common case touches no shared line.
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t head_cache_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
  uint64_t tail_cache_ = 0;
  alignas(64) T slots_[kCapacity];
};

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_SPSC_RING_H_
