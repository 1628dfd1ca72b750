// The executor that runs the GPU table's kernel bodies as CUDA kernels on the caller's stream
// (device_table_impl.h): stream-ordered allocation, grid-stride launches, CUB's radix sort and
// scan.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/cub.cuh>
#include <string>

namespace tf_ext {
namespace de {
namespace gpu {

template <typename Body>
__global__ void RunBody(int64_t n, Body body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    body(i);
  }
}

class CudaExec {
 public:
  void Bind(cudaStream_t stream) { stream_ = stream; }

  // Stream-ordered, from the device's memory pool: a batch's scratch costs no device sync.
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream_) != cudaSuccess) {
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
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20);
    RunBody<<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(n, body);
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
};

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_CUDA_EXEC_CUH_
