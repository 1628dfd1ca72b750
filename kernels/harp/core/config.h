// HARP's settings, read from HARP_* environment variables by the plugin itself (NCCL loads it into
// processes that may have no Python). tf_ext/settings.py declares the same names and defaults for
// the documentation; tests/harp/test_plugin.py checks that the two agree.
#ifndef TF_EXT_KERNELS_HARP_CORE_CONFIG_H_
#define TF_EXT_KERNELS_HARP_CORE_CONFIG_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

struct Config {
  int streams_per_connection = 4;   // HARP_NSTREAMS: data sockets per connection
  int worker_threads = 2;           // HARP_NTHREADS: threads driving the sockets
  std::vector<int> cpu_affinity;    // HARP_CPU_AFFINITY: worker i runs on cpu_affinity[i % size]
  size_t chunk_bytes = 512 * 1024;  // HARP_CHUNK_BYTES: the unit spread over the streams
  size_t zerocopy_threshold = 0;    // HARP_ZEROCOPY_THRESHOLD: MSG_ZEROCOPY chunks from; 0 = off
  std::string interface;            // HARP_IFNAME: interface name or IPv4 address; "" = auto
  std::string nccl_socket_ifname;   // NCCL's NCCL_SOCKET_IFNAME, followed when HARP_IFNAME is ""
  int timeout_ms = 30000;           // HARP_TIMEOUT_MS: dead-peer and connection-setup bound
  int caller_connections = 1;       // HARP_CALLER_CONNECTIONS: busy ones NCCL's thread drives
};

// Limits the parser enforces (and the frame validator relies on for chunk sizes).
constexpr int kMaxStreams = 64;
constexpr int kMaxWorkerThreads = 64;
constexpr int kMaxCallerConnections = 64;
constexpr size_t kMinChunkBytes = 4096;
constexpr size_t kMaxChunkBytes = size_t{64} << 20;

// One setting: its environment name and its default exactly as the environment would hold it.
struct SettingDefault {
  const char* name;
  const char* default_value;
};
// Every HARP_* setting, in tf_ext/settings.py's order.
const std::vector<SettingDefault>& SettingDefaults();

// Reads every setting, and NCCL_SOCKET_IFNAME, through `lookup` (nullptr or unset = the default,
// "" for NCCL_SOCKET_IFNAME). Returns false with
// `error` naming the variable, its value and what is allowed when a value is invalid.
bool ParseConfig(const std::function<const char*(const char*)>& lookup, Config* config,
                 std::string* error);
// The same from the process environment.
bool ConfigFromEnvironment(Config* config, std::string* error);

// "HARP_NSTREAMS=4 HARP_NTHREADS=2 ...": every setting's effective value, in the same spelling
// as the defaults (the plugin logs it at init).
std::string DescribeConfig(const Config& config);

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_CONFIG_H_
