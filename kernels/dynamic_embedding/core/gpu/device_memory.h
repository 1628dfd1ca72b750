// Plain CUDA memory and device facts for the GPU table's tests and benchmarks, so that they need
// no CUDA header. Built with the CUDA table (cuda_table.cu); without CUDA they report no device.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_MEMORY_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_MEMORY_H_

#include <cstddef>
#include <string>

namespace tf_ext {
namespace de {
namespace cuda {

// Whether a CUDA device can be used; *description: its name and memory, or why not.
bool DeviceAvailable(std::string* description);
void* Alloc(size_t bytes);  // null on failure
void Free(void* p);
bool CopyToDevice(void* to, const void* from, size_t bytes);  // synchronous
bool CopyToHost(void* to, const void* from, size_t bytes);    // synchronous
bool Synchronize();
// Device-to-device copy bandwidth in bytes/s (a copy of `bytes` bytes, median of `repeats`): the
// anchor of the table benchmark. 0 without a device.
double CopyBandwidth(size_t bytes, int repeats);

}  // namespace cuda
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_MEMORY_H_
