// MakeCudaTable in a build without CUDA (TF_EXT_CUDA=0, or no nvcc found): a clear error.
#include "kernels/dynamic_embedding/core/gpu/device_memory.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"

namespace tf_ext {
namespace de {

std::unique_ptr<DeviceTable> MakeCudaTable(const DeviceTableOptions& options, std::string* error) {
  *error = "dynamic embedding table '" + options.name +
           "': this build of tf_ext has no CUDA (built with TF_EXT_CUDA=0 or without nvcc); "
           "rebuild with nvcc on the PATH to place tables on a GPU";
  return nullptr;
}

bool CudaTableBuilt() { return false; }

namespace cuda {

bool DeviceAvailable(std::string* description) {
  *description = "this build of tf_ext has no CUDA";
  return false;
}
void* Alloc(size_t) { return nullptr; }
void Free(void*) {}
bool CopyToDevice(void*, const void*, size_t) { return false; }
bool CopyToHost(void*, const void*, size_t) { return false; }
bool Synchronize() { return false; }
double CopyBandwidth(size_t, int) { return 0.0; }

}  // namespace cuda

}  // namespace de
}  // namespace tf_ext
