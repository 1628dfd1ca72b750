// The atomic operations of the GPU table's kernel bodies, for both places those bodies run: CUDA
// kernels, and the host threads of MakeEmulatedGpuTable's table.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_ATOMICS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_ATOMICS_H_

#include <cstdint>

#include "kernels/dynamic_embedding/core/host_device.h"

namespace tf_ext {
namespace de {
namespace atomic {

// Stores `desired` if *p holds `expected`; returns what *p held.
TF_EXT_HOST_DEVICE inline uint64_t CompareAndSwap(uint64_t* p, uint64_t expected,
                                                  uint64_t desired) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned long long*>(p), expected, desired);
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
#endif
}

// A key slot's value, read while other threads may claim slots.
TF_EXT_HOST_DEVICE inline uint64_t Load(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint64_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

TF_EXT_HOST_DEVICE inline void Add(int64_t* p, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(value));
#else
  __atomic_fetch_add(p, value, __ATOMIC_RELAXED);
#endif
}

// Adds `value` to *p; returns what *p held before.
TF_EXT_HOST_DEVICE inline int64_t FetchAdd(int64_t* p, int64_t value) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(
      atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(value)));
#else
  return __atomic_fetch_add(p, value, __ATOMIC_RELAXED);
#endif
}

// Adds `amount` for each calling thread whose flag is set. On a GPU a warp adds its count once:
// a million threads adding to one counter one by one would take longer than their lookups. Call it
// where every thread of the body passes (not under a branch), so the warp's threads meet there.
TF_EXT_HOST_DEVICE inline void AddWhere(int64_t* p, bool flag, int64_t amount) {
#if defined(__CUDA_ARCH__)
  const unsigned active = __activemask();
  const unsigned flagged = __ballot_sync(active, flag);
  if (flagged != 0 && static_cast<int>(threadIdx.x & 31) == __ffs(active) - 1) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p),
              static_cast<unsigned long long>(amount * __popc(flagged)));
  }
#else
  if (flag) __atomic_fetch_add(p, amount, __ATOMIC_RELAXED);
#endif
}

TF_EXT_HOST_DEVICE inline void Max(int64_t* p, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicMax(reinterpret_cast<long long*>(p), static_cast<long long>(value));
#else
  int64_t seen = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (seen < value &&
         !__atomic_compare_exchange_n(p, &seen, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

TF_EXT_HOST_DEVICE inline uint32_t Load(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint32_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

TF_EXT_HOST_DEVICE inline void Or(uint32_t* p, uint32_t bits) {
#if defined(__CUDA_ARCH__)
  atomicOr(p, bits);
#else
  __atomic_fetch_or(p, bits, __ATOMIC_RELEASE);
#endif
}

TF_EXT_HOST_DEVICE inline void Max(uint32_t* p, uint32_t value) {
#if defined(__CUDA_ARCH__)
  atomicMax(p, value);
#else
  uint32_t seen = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (seen < value &&
         !__atomic_compare_exchange_n(p, &seen, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

}  // namespace atomic
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_ATOMICS_H_
