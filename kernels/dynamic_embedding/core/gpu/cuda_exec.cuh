// The executor that runs the GPU table's kernel bodies as CUDA kernels on the caller's stream
// (device_table_impl.h): stream-ordered allocation, grid-stride launches, CUB's radix sort and
// scan.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/cub.cuh>
#include <mutex>
#include <string>

#include "kernels/dynamic_embedding/core/gpu/device_table.h"

namespace tf_ext {
namespace de {
namespace gpu {

// The current device's pool for batch scratch. The default pool returns freed memory to the
// device at every synchronization, so the next batch would map its scratch again; this one keeps
// up to 1 GiB mapped. Null if it cannot be made (scratch then comes from the default pool).
inline cudaMemPool_t ScratchPool() {
  constexpr int kMaxDevices = 64;
  static cudaMemPool_t pools[kMaxDevices] = {};
  static std::mutex mutex;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) {
    cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (pools[device] == nullptr) {
    cudaMemPoolProps properties = {};
    properties.allocType = cudaMemAllocationTypePinned;
    properties.location.type = cudaMemLocationTypeDevice;
    properties.location.id = device;
    if (cudaMemPoolCreate(&pools[device], &properties) != cudaSuccess) {
      cudaGetLastError();
      pools[device] = nullptr;
      return nullptr;
    }
    uint64_t kept = uint64_t{1} << 30;
    cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReleaseThreshold, &kept);
  }
  return pools[device];
}

template <typename Body>
__global__ void RunBody(int64_t n, Body body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    body(i);
  }
}

// `size` consecutive threads of a warp that work on one key (device_slots.h's tiles).
struct CudaTile {
  unsigned lanes;  // the tile's threads within the warp
  int first_lane;  // of the tile, within the warp
  int my_lane;     // within the tile
  int width;
  __host__ __device__ int lane() const { return my_lane; }
  __host__ __device__ int size() const { return width; }
  __host__ __device__ uint32_t Ballot(bool flag) const {
#if defined(__CUDA_ARCH__)
    return __ballot_sync(lanes, flag) >> first_lane;
#else
    return flag;  // never runs on the host; declared for __host__ __device__ bodies
#endif
  }
  template <typename T>
  __host__ __device__ T Broadcast(T value, int from_lane) const {
#if defined(__CUDA_ARCH__)
    return __shfl_sync(lanes, value, from_lane, width);
#else
    return value;
#endif
  }
};

template <typename Body>
__device__ inline void RunTilesOfThisThread(int64_t n, int width, Body& body) {
  const int tiles_per_block = blockDim.x / width;
  CudaTile tile;
  tile.width = width;
  tile.my_lane = threadIdx.x % width;
  tile.first_lane = (threadIdx.x & 31) - tile.my_lane;
  tile.lanes = (width == 32 ? ~0u : (1u << width) - 1) << tile.first_lane;
  // Every lane of a tile takes the same keys, so the tile's lanes stay together.
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * tiles_per_block + threadIdx.x / width; i < n;
       i += static_cast<int64_t>(gridDim.x) * tiles_per_block) {
    body(i, tile);
  }
}

constexpr int kThreadsPerBlock = 256;

template <typename Body>
__global__ void RunTiles(int64_t n, int width, Body body) {
  RunTilesOfThisThread(n, width, body);
}

// The same, with registers capped at 64 a thread so that 4 blocks (1,024 threads) fit on an SM.
// A find and a row gather spend their time waiting on dependent memory reads (summary, keys,
// row): uncapped, the find kernel took 80 registers, 3 blocks an SM, and ran 1.2x slower on an
// H200; the gather (70 registers) 1.02-1.05x slower (2026-11-27). Capping every tile kernel
// slowed find-or-insert's claim kernel, which fits 8 blocks uncapped.
template <typename Body>
__global__ void __launch_bounds__(kThreadsPerBlock, 4)
    RunTilesInFlight(int64_t n, int width, Body body) {
  RunTilesOfThisThread(n, width, body);
}

class CudaExec {
 public:
  // tile_lanes: threads per key in ForTiles, a power of two up to 32.
  explicit CudaExec(int tile_lanes = kDefaultTileLanes) : tile_lanes_(tile_lanes) {}
  static constexpr bool kHostMemory = false;

  void Bind(cudaStream_t stream) { stream_ = stream; }

  // Stream-ordered, from the device's memory pool: a batch's scratch costs no device sync.
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    const cudaMemPool_t pool = ScratchPool();
    const cudaError_t status = pool != nullptr ? cudaMallocFromPoolAsync(&p, bytes, pool, stream_)
                                               : cudaMallocAsync(&p, bytes, stream_);
    if (status != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is reported by the caller, not kept
      return nullptr;
    }
    return p;
  }
  void Free(void* p) {
    if (p != nullptr) cudaFreeAsync(p, stream_);
  }
  // The table's own storage, used on whatever stream later calls bring: not stream-ordered.
  void* AllocLasting(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void FreeLasting(void* p) {
    if (p != nullptr) {
      cudaStreamSynchronize(stream_);  // work queued on the storage finishes first
      cudaFree(p);
    }
  }
  void* AllocPinned(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void FreePinned(void* p) {
    if (p != nullptr) cudaFreeHost(p);
  }
  void ToHost(void* to, const void* from, size_t bytes) {
    cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream_);
  }
  void ToDevice(void* to, const void* from, size_t bytes) {
    cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream_);
  }
  void Sync() { cudaStreamSynchronize(stream_); }
  std::string LastError() {
    const cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? "" : cudaGetErrorString(error);
  }

  template <typename Body>
  void For(int64_t n, Body body) {
    if (n <= 0) return;
    const int64_t blocks =
        std::min<int64_t>((n + kThreadsPerBlock - 1) / kThreadsPerBlock, int64_t{1} << 20);
    RunBody<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream_>>>(n, body);
  }

  // body(i, tile) for each key i, on a tile of tile_lanes threads: a probe reads that many slots at
  // once, and a row moves that many 16-byte vectors at a time.
  using Tile = CudaTile;
  template <typename Body>
  void ForTiles(int64_t n, Body body) {
    if (n > 0) RunTiles<<<TileBlocks(n), kThreadsPerBlock, 0, stream_>>>(n, tile_lanes_, body);
  }
  // ForTiles for bodies bound by memory latency: more keys in flight (RunTilesInFlight).
  template <typename Body>
  void ForTilesInFlight(int64_t n, Body body) {
    if (n > 0) {
      RunTilesInFlight<<<TileBlocks(n), kThreadsPerBlock, 0, stream_>>>(n, tile_lanes_, body);
    }
  }
  unsigned TileBlocks(int64_t n) const {
    const int tiles_per_block = kThreadsPerBlock / tile_lanes_;
    return static_cast<unsigned>(
        std::min<int64_t>((n + tiles_per_block - 1) / tiles_per_block, int64_t{1} << 20));
  }

  template <typename T>
  void Fill(T* p, T value, int64_t n) {
    For(n, [=] __device__(int64_t i) { p[i] = value; });
  }

  template <typename Value>
  bool SortPairs(const uint64_t* keys, uint64_t* sorted_keys, const Value* values,
                 Value* sorted_values, int64_t n) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys, values, sorted_values, n, 0,
                                    64, stream_);
    void* temp = Alloc(bytes);
    if (temp == nullptr) return false;
    cub::DeviceRadixSort::SortPairs(temp, bytes, keys, sorted_keys, values, sorted_values, n, 0, 64,
                                    stream_);
    Free(temp);
    return true;
  }

  bool ExclusiveSum(const int64_t* in, int64_t* out, int64_t n) {
    size_t bytes = 0;
    cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n, stream_);
    void* temp = Alloc(bytes);
    if (temp == nullptr) return false;
    cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n, stream_);
    Free(temp);
    return true;
  }

 private:
  cudaStream_t stream_ = nullptr;
  int tile_lanes_;
};

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_
