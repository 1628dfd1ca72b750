// MakeEmulatedGpuTable: the GPU table's algorithm on host threads (device_table.h).
#include "kernels/dynamic_embedding/core/gpu/device_table_impl.h"
#include "kernels/dynamic_embedding/core/gpu/host_exec.h"

namespace tf_ext {
namespace de {

std::unique_ptr<DeviceTable> MakeEmulatedGpuTable(const DeviceTableOptions& options,
                                                  std::string* error, int threads) {
  return gpu::MakeTable(options, gpu::HostExec(threads), error);
}

}  // namespace de
}  // namespace tf_ext
