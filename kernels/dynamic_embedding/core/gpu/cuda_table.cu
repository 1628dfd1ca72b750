// MakeCudaTable: the GPU table's algorithm as CUDA kernels (device_table.h). Compiled by nvcc
// with -fmad=false (host_device.h) and --extended-lambda.
#include <algorithm>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/cuda_exec.cuh"
#include "kernels/dynamic_embedding/core/gpu/device_memory.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_impl.h"

namespace tf_ext {
namespace de {

std::unique_ptr<DeviceTable> MakeCudaTable(const DeviceTableOptions& options, std::string* error) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    *error = "dynamic embedding table '" + options.name +
             "': no CUDA device: " + cudaGetErrorString(cudaGetLastError());
    return nullptr;
  }
  return gpu::MakeTable(
      options, gpu::CudaExec(options.tile_lanes > 0 ? options.tile_lanes : kDefaultTileLanes),
      error);
}

bool CudaTableBuilt() { return true; }

namespace cuda {

bool DeviceAvailable(std::string* description) {
  int device = 0;
  cudaDeviceProp properties;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
    *description = cudaGetErrorString(cudaGetLastError());
    return false;
  }
  *description = std::string(properties.name) + ", " +
                 std::to_string(properties.totalGlobalMem >> 20) + " MiB, sm_" +
                 std::to_string(properties.major) + std::to_string(properties.minor);
  return true;
}

// As the table's own storage: not stream-ordered, a failure cleared and reported as null.
void* Alloc(size_t bytes) { return gpu::CudaExec().AllocLasting(bytes); }

void Free(void* p) { gpu::CudaExec().FreeLasting(p); }

bool CopyToDevice(void* to, const void* from, size_t bytes) {
  return cudaMemcpy(to, from, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
}

bool CopyToHost(void* to, const void* from, size_t bytes) {
  return cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
}

bool Synchronize() { return cudaDeviceSynchronize() == cudaSuccess; }

double CopyBandwidth(size_t bytes, int repeats) {
  void *from = Alloc(bytes), *to = Alloc(bytes);
  std::vector<float> seconds;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int r = 0; from != nullptr && to != nullptr && r < repeats + 1; ++r) {
    cudaEventRecord(start);
    cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (r > 0) seconds.push_back(ms / 1e3f);  // the first warms up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  Free(from);
  Free(to);
  if (seconds.empty()) return 0.0;
  std::sort(seconds.begin(), seconds.end());
  // A copy reads and writes each byte: count both, as the table's reads and writes are counted.
  return 2.0 * static_cast<double>(bytes) / seconds[seconds.size() / 2];
}

}  // namespace cuda

}  // namespace de
}  // namespace tf_ext
