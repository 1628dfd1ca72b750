// The executor that runs the GPU table's kernel bodies on host threads (MakeEmulatedGpuTable):
// memory is host memory, a launch is a loop split over `threads` threads, the stream is ignored. It
// lets the CPU build test the GPU table's algorithm; concurrent bodies (threads > 1) exercise its
// atomics.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_HOST_EXEC_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_HOST_EXEC_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_slots.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"

namespace tf_ext {
namespace de {
namespace gpu {

class HostExec {
 public:
  explicit HostExec(int threads) : threads_(std::max(1, threads)) {}
  static constexpr bool kHostMemory = true;

  void Bind(cudaStream_t) {}
  void* Alloc(size_t bytes) { return std::malloc(bytes); }
  void Free(void* p) { std::free(p); }
  void* AllocLasting(size_t bytes) { return std::malloc(bytes); }
  void FreeLasting(void* p) { std::free(p); }
  void* AllocPinned(size_t bytes) { return std::malloc(bytes); }
  void FreePinned(void* p) { std::free(p); }
  void ToHost(void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); }
  void ToDevice(void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); }
  void Sync() {}
  std::string LastError() { return ""; }

  template <typename Body>
  void For(int64_t n, Body body) {
    if (n <= 0) return;
    const int64_t parts = std::min<int64_t>(threads_, n);
    if (parts == 1) {
      for (int64_t i = 0; i < n; ++i) body(i);
      return;
    }
    std::vector<std::thread> workers;
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
      workers.emplace_back([=] {
        for (int64_t i = begin; i < end; ++i) body(i);
      });
    }
    for (auto& worker : workers) worker.join();
  }

  // body(i, tile) for each key i; a host thread is a tile of one.
  using Tile = SoloTile;
  template <typename Body>
  void ForTiles(int64_t n, Body body) {
    For(n, [=](int64_t i) { body(i, Tile()); });
  }
  template <typename Body>
  void ForTilesInFlight(int64_t n, Body body) {
    ForTiles(n, body);
  }

  template <typename T>
  void Fill(T* p, T value, int64_t n) {
    std::fill(p, p + n, value);
  }

  // Sorts (keys, values) by key, stably: equal keys keep their order.
  template <typename Value>
  bool SortPairs(const uint64_t* keys, uint64_t* sorted_keys, const Value* values,
                 Value* sorted_values, int64_t n) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    for (int64_t i = 0; i < n; ++i) {
      sorted_keys[i] = keys[order[i]];
      sorted_values[i] = values[order[i]];
    }
    return true;
  }

  bool ExclusiveSum(const int64_t* in, int64_t* out, int64_t n) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t value = in[i];
      out[i] = total;
      total += value;
    }
    return true;
  }

 private:
  int threads_;
};

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_HOST_EXEC_H_
