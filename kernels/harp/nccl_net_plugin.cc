// The exported C interface of tf_ext/harp/libnccl-net-harp.so (NCCL finds network plugins by the
// file name libnccl-net-<name>.so, then the symbols ncclNetPlugin_vN). The library is built with
// hidden visibility, so only what is marked here is exported: harp_build_info() and the tables
// ncclNetPlugin_v6 ... ncclNetPlugin_v12, thin adapters over one tf_ext::harp::Transport.
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>

#include "kernels/harp/core/build_info.h"
#include "kernels/harp/core/config.h"
#include "kernels/harp/core/nccl_net_abi.h"
#include "kernels/harp/core/transport.h"

#define HARP_EXPORT extern "C" __attribute__((visibility("default")))

HARP_EXPORT const char* harp_build_info() { return tf_ext::harp::BuildInfo(); }

namespace {

using tf_ext::harp::Config;
using tf_ext::harp::ListenSocket;
using tf_ext::harp::LogLevel;
using tf_ext::harp::ReceiveConnection;
using tf_ext::harp::Request;
using tf_ext::harp::SendConnection;
using tf_ext::harp::Status;
using tf_ext::harp::Transport;

// One transport per process, created by the first init and never destroyed: NCCL may call into
// the plugin until the process exits, and worker threads must not be joined from a static
// destructor. NCCL 2.28 and later dlclose the plugin when the last communicator is destroyed (and
// dlopen it again for the next); the library is linked with -z nodelete, so that its code stays
// mapped under the running workers and the next init finds the same transport.
std::mutex init_mutex;
Transport* transport = nullptr;
ncclDebugLogger_t logger = nullptr;

// v11 and later: init is called per communicator and returns a context that listen, connect and
// finalize take. HARP's context is the communicator's traffic class; the transport is shared.
struct CommContext {
  int traffic_class;
};
// The live contexts (under init_mutex): a context NCCL did not get from init, or finalized, is an
// error, not a use after free.
std::unordered_set<CommContext*> contexts;

void Log(LogLevel level, const std::string& message) {
  ncclDebugLogger_t log = logger;
  if (log == nullptr) return;
  log(level == LogLevel::kWarning ? NCCL_LOG_WARN : NCCL_LOG_INFO, NCCL_INIT | NCCL_NET, __FILE__,
      __LINE__, "%s", message.c_str());
}

ncclResult_t ToNccl(Status status) {
  switch (status) {
    case Status::kOk:
      return ncclSuccess;
    case Status::kInvalidArgument:
      return ncclInvalidArgument;
    case Status::kInvalidUsage:
      return ncclInvalidUsage;
    case Status::kSystemError:
      return ncclSystemError;
    case Status::kRemote:
      return ncclRemoteError;
    case Status::kInternalError:
      break;
  }
  return ncclInternalError;
}

// NCCL calls everything below only after a successful init.
#define HARP_REQUIRE_INIT()                                             \
  do {                                                                  \
    if (transport == nullptr) {                                         \
      Log(LogLevel::kWarning, "HARP: called before a successful init"); \
      return ncclInternalError;                                         \
    }                                                                   \
  } while (0)

ncclResult_t Init(ncclDebugLogger_t log_function) {
  std::lock_guard<std::mutex> lock(init_mutex);
  if (log_function != nullptr) logger = log_function;
  if (transport != nullptr) return ncclSuccess;
  Config config;
  std::string error;
  if (!tf_ext::harp::ConfigFromEnvironment(&config, &error)) {
    Log(LogLevel::kWarning, "HARP: " + error);
    return ncclInvalidUsage;
  }
  std::unique_ptr<Transport> created;
  Status status = Transport::Create(config, Log, &created, &error);
  if (status != Status::kOk) {
    Log(LogLevel::kWarning, "HARP: " + error);
    return ToNccl(status);
  }
  transport = created.release();
  Log(LogLevel::kInfo, std::string(tf_ext::harp::BuildInfo()) + " on " +
                           transport->interface_name() + " " + transport->address() + ": " +
                           tf_ext::harp::DescribeConfig(config));
  if (config.zerocopy_threshold != 0) {
    Log(LogLevel::kInfo, "HARP: chunks of " + std::to_string(config.zerocopy_threshold) +
                             " bytes or more are sent with MSG_ZEROCOPY");
  }
  return ncclSuccess;
}

ncclResult_t InitV10(ncclDebugLogger_t log_function, ncclProfilerCallback_t) {
  return Init(log_function);
}

// A comm config's traffic class (v11's config type is v10's); none without a config.
int TrafficClassIn(const ncclNetCommConfig_v10_t* config) {
  return config != nullptr ? config->trafficClass : tf_ext::harp::kNoTrafficClass;
}

ncclResult_t InitV11(void** context, uint64_t, ncclNetCommConfig_v11_t* config,
                     ncclDebugLogger_t log_function, ncclProfilerCallback_t) {
  if (context == nullptr) return ncclInvalidArgument;
  *context = nullptr;
  ncclResult_t result = Init(log_function);
  if (result != ncclSuccess) return result;
  const int traffic_class = TrafficClassIn(config);
  std::string error;
  if (!Transport::ValidTrafficClass(traffic_class, &error)) {
    Log(LogLevel::kWarning, "HARP: init: the communicator's " + error);
    return ncclInvalidArgument;
  }
  auto* created = new CommContext{traffic_class};
  std::lock_guard<std::mutex> lock(init_mutex);
  contexts.insert(created);
  *context = created;
  return ncclSuccess;
}

// The traffic class of a live context (false, logged, for anything else).
bool TrafficClassOf(void* context, const char* call, int* traffic_class) {
  std::lock_guard<std::mutex> lock(init_mutex);
  auto found = contexts.find(static_cast<CommContext*>(context));
  if (found == contexts.end()) {
    Log(LogLevel::kWarning, std::string("HARP: ") + call +
                                ": not a context from init (never initialised, or finalized)");
    return false;
  }
  *traffic_class = (*found)->traffic_class;
  return true;
}

ncclResult_t Finalize(void* context) {
  std::lock_guard<std::mutex> lock(init_mutex);
  if (contexts.erase(static_cast<CommContext*>(context)) == 0) {
    Log(LogLevel::kWarning, "HARP: finalize: not a context from init (finalized twice?)");
    return ncclInvalidArgument;
  }
  delete static_cast<CommContext*>(context);
  return ncclSuccess;
}

ncclResult_t Devices(int* count) {
  HARP_REQUIRE_INIT();
  *count = 1;
  return ncclSuccess;
}

// Which version's properties a struct is (v9 and v10 share theirs; 0: none).
template <typename Properties>
constexpr int kPropertiesVersion = std::is_same_v<Properties, ncclNetProperties_v6_t>    ? 6
                                   : std::is_same_v<Properties, ncclNetProperties_v7_t>  ? 7
                                   : std::is_same_v<Properties, ncclNetProperties_v8_t>  ? 8
                                   : std::is_same_v<Properties, ncclNetProperties_v9_t>  ? 9
                                   : std::is_same_v<Properties, ncclNetProperties_v11_t> ? 11
                                   : std::is_same_v<Properties, ncclNetProperties_v12_t> ? 12
                                                                                         : 0;

// getProperties of every version: the fields that version has.
template <typename Properties>
ncclResult_t PropertiesOf(int dev, Properties* props) {
  constexpr int version = kPropertiesVersion<Properties>;
  static_assert(version != 0, "not an ncclNetProperties_vN_t");
  HARP_REQUIRE_INIT();
  if (dev != 0) return ncclInvalidArgument;
  *props = Properties{};
  props->name = const_cast<char*>(transport->interface_name().c_str());
  props->pciPath = nullptr;  // a TCP interface, no PCI placement to offer NCCL's topology
  props->guid = 0;
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = transport->link_speed_mbps();
  props->port = 0;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = tf_ext::harp::kMaxReceivesPerRequest;
  if constexpr (version >= 7) {
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = 0;
  }
  if constexpr (version >= 8) props->regIsGlobal = 0;
  if constexpr (version >= 9) {
    props->forceFlush = 0;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = 0;
    // Test reports sizes as int.
    props->maxP2pBytes = 0x7fffffff;
    props->maxCollBytes = 0x7fffffff;
  }
  if constexpr (version >= 11) props->maxMultiRequestSize = 1;
  if constexpr (version >= 12) {
    props->railId = NCCL_NET_ID_UNDEF;
    props->planeId = NCCL_NET_ID_UNDEF;
  }
  return ncclSuccess;
}

ncclResult_t ListenWith(int dev, void* handle, void** listen_comm, int traffic_class) {
  HARP_REQUIRE_INIT();
  if (dev != 0) return ncclInvalidArgument;
  ListenSocket* listener = nullptr;
  Status status = transport->Listen(handle, &listener, traffic_class);
  *listen_comm = listener;
  return ToNccl(status);
}

ncclResult_t ListenV11(void* context, int dev, void* handle, void** listen_comm) {
  *listen_comm = nullptr;
  int traffic_class;
  if (!TrafficClassOf(context, "listen", &traffic_class)) return ncclInvalidArgument;
  return ListenWith(dev, handle, listen_comm, traffic_class);
}

ncclResult_t Listen(int dev, void* handle, void** listen_comm) {
  return ListenWith(dev, handle, listen_comm, tf_ext::harp::kNoTrafficClass);
}

ncclResult_t ConnectWith(int dev, void* handle, void** send_comm, int traffic_class) {
  HARP_REQUIRE_INIT();
  if (dev != 0) return ncclInvalidArgument;
  SendConnection* connection = nullptr;
  Status status = transport->Connect(handle, &connection, traffic_class);
  *send_comm = connection;
  return ToNccl(status);
}

ncclResult_t Connect(int dev, void* handle, void** send_comm) {
  return ConnectWith(dev, handle, send_comm, tf_ext::harp::kNoTrafficClass);
}

ncclResult_t ConnectV7(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t**) {
  return Connect(dev, handle, send_comm);
}

ncclResult_t ConnectV10(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** send_comm,
                        ncclNetDeviceHandle_t**) {
  return ConnectWith(dev, handle, send_comm, TrafficClassIn(config));
}

ncclResult_t ConnectV11(void* context, int dev, void* handle, void** send_comm,
                        ncclNetDeviceHandle_t**) {
  *send_comm = nullptr;
  int traffic_class;
  if (!TrafficClassOf(context, "connect", &traffic_class)) return ncclInvalidArgument;
  return ConnectWith(dev, handle, send_comm, traffic_class);
}

ncclResult_t Accept(void* listen_comm, void** recv_comm) {
  HARP_REQUIRE_INIT();
  ReceiveConnection* connection = nullptr;
  Status status = transport->Accept(static_cast<ListenSocket*>(listen_comm), &connection);
  *recv_comm = connection;
  return ToNccl(status);
}

ncclResult_t AcceptV7(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t**) {
  return Accept(listen_comm, recv_comm);
}

// Host memory needs no registration with a TCP socket (MSG_ZEROCOPY pins pages per send); the
// handle records the region.
struct MemoryRegion {
  void* data;
  size_t size;
};

ncclResult_t RegisterMemory(void* comm, void* data, size_t size, int type, void** mhandle) {
  HARP_REQUIRE_INIT();
  if (type != NCCL_PTR_HOST) {
    Log(LogLevel::kWarning,
        "HARP: only host memory can be registered (ptrSupport is "
        "NCCL_PTR_HOST), got type " +
            std::to_string(type));
    return ncclInternalError;
  }
  (void)comm;
  *mhandle = new MemoryRegion{data, size};
  return ncclSuccess;
}

ncclResult_t RegisterMemoryIntSize(void* comm, void* data, int size, int type, void** mhandle) {
  if (size < 0) return ncclInvalidArgument;
  return RegisterMemory(comm, data, static_cast<size_t>(size), type, mhandle);
}

ncclResult_t RegisterDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) {
  Log(LogLevel::kWarning, "HARP: DMA-BUF registration is not supported (host memory only)");
  return ncclInternalError;
}

ncclResult_t DeregisterMemory(void*, void* mhandle) {
  delete static_cast<MemoryRegion*>(mhandle);
  return ncclSuccess;
}

ncclResult_t Send(void* send_comm, void* data, size_t size, int tag, void** request) {
  HARP_REQUIRE_INIT();
  Request* posted = nullptr;
  Status status =
      transport->Send(static_cast<SendConnection*>(send_comm), data, size, tag, &posted);
  *request = posted;
  return ToNccl(status);
}

ncclResult_t SendIntSize(void* send_comm, void* data, int size, int tag, void*, void** request) {
  if (size < 0) return ncclInvalidArgument;
  return Send(send_comm, data, static_cast<size_t>(size), tag, request);
}

ncclResult_t SendV9(void* send_comm, void* data, size_t size, int tag, void*, void** request) {
  return Send(send_comm, data, size, tag, request);
}

ncclResult_t SendV10(void* send_comm, void* data, size_t size, int tag, void*, void*,
                     void** request) {
  return Send(send_comm, data, size, tag, request);
}

template <typename Size>
ncclResult_t Receive(void* recv_comm, int n, void** data, const Size* sizes, int* tags,
                     void** request) {
  HARP_REQUIRE_INIT();
  if (n < 1 || n > tf_ext::harp::kMaxReceivesPerRequest) return ncclInvalidArgument;
  uint64_t capacities[tf_ext::harp::kMaxReceivesPerRequest];
  for (int b = 0; b < n; ++b) {
    if (sizes[b] < 0) return ncclInvalidArgument;
    capacities[b] = static_cast<uint64_t>(sizes[b]);
  }
  Request* posted = nullptr;
  Status status = transport->Receive(static_cast<ReceiveConnection*>(recv_comm), n, data,
                                     capacities, tags, &posted);
  *request = posted;
  return ToNccl(status);
}

ncclResult_t ReceiveIntSizes(void* recv_comm, int n, void** data, int* sizes, int* tags, void**,
                             void** request) {
  return Receive(recv_comm, n, data, sizes, tags, request);
}

ncclResult_t ReceiveV9(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void**,
                       void** request) {
  return Receive(recv_comm, n, data, sizes, tags, request);
}

ncclResult_t ReceiveV10(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void**,
                        void**, void** request) {
  return Receive(recv_comm, n, data, sizes, tags, request);
}

// With ptrSupport = NCCL_PTR_HOST NCCL never flushes; nothing to wait for if it does.
ncclResult_t Flush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;
  return ncclSuccess;
}

ncclResult_t Test(void* request, int* done, int* sizes) {
  HARP_REQUIRE_INIT();
  auto* posted = static_cast<Request*>(request);
  uint64_t received[tf_ext::harp::kMaxReceivesPerRequest];
  const int count = posted->count;
  bool finished = false;
  Status status = transport->Test(posted, &finished, received);
  *done = finished ? 1 : 0;
  if (finished && sizes != nullptr) {
    for (int b = 0; b < count; ++b) sizes[b] = static_cast<int>(received[b]);
  }
  return ToNccl(status);
}

ncclResult_t CloseConnection(void* comm) {
  HARP_REQUIRE_INIT();
  transport->Close(
      static_cast<tf_ext::harp::Connection*>(static_cast<tf_ext::harp::Connection*>(comm)));
  return ncclSuccess;
}

ncclResult_t CloseSend(void* send_comm) {
  return CloseConnection(
      static_cast<tf_ext::harp::Connection*>(static_cast<SendConnection*>(send_comm)));
}

ncclResult_t CloseReceive(void* recv_comm) {
  return CloseConnection(
      static_cast<tf_ext::harp::Connection*>(static_cast<ReceiveConnection*>(recv_comm)));
}

ncclResult_t CloseListen(void* listen_comm) {
  HARP_REQUIRE_INIT();
  transport->CloseListen(static_cast<ListenSocket*>(listen_comm));
  return ncclSuccess;
}

ncclResult_t DeviceMemoryHandle(void*, void*, void**) { return ncclInternalError; }

ncclResult_t ReceiveConsumed(void*, int, void*) { return ncclSuccess; }

template <typename VirtualDeviceProperties>
ncclResult_t MakeVirtualDevice(int*, VirtualDeviceProperties*) {
  Log(LogLevel::kWarning, "HARP: virtual devices (NIC fusion) are not supported");
  return ncclInvalidUsage;
}

// v11 and v12 differ only in their property types. setNetAttr is null: NCCL's hints (peers and
// flows per connection) are optional, and HARP sizes its streams by HARP_NSTREAMS.
template <typename Table, typename Properties, typename VirtualDeviceProperties>
constexpr Table TableSinceV11() {
  return Table{
      "HARP",          InitV11,
      Devices,         PropertiesOf<Properties>,
      ListenV11,       ConnectV11,
      AcceptV7,        RegisterMemory,
      RegisterDmaBuf,  DeregisterMemory,
      SendV10,         ReceiveV10,
      Flush,           Test,
      CloseSend,       CloseReceive,
      CloseListen,     DeviceMemoryHandle,
      ReceiveConsumed, MakeVirtualDevice<VirtualDeviceProperties>,
      Finalize,        nullptr,
  };
}

}  // namespace

HARP_EXPORT const ncclNet_v12_t ncclNetPlugin_v12 =
    TableSinceV11<ncclNet_v12_t, ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t>();

HARP_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 =
    TableSinceV11<ncclNet_v11_t, ncclNetProperties_v11_t, ncclNetVDeviceProps_v11_t>();

HARP_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    "HARP",          InitV10,
    Devices,         PropertiesOf<ncclNetProperties_v10_t>,
    Listen,          ConnectV10,
    AcceptV7,        RegisterMemory,
    RegisterDmaBuf,  DeregisterMemory,
    SendV10,         ReceiveV10,
    Flush,           Test,
    CloseSend,       CloseReceive,
    CloseListen,     DeviceMemoryHandle,
    ReceiveConsumed, MakeVirtualDevice<ncclNetVDeviceProps_v9_t>,
};

HARP_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    "HARP",          Init,
    Devices,         PropertiesOf<ncclNetProperties_v9_t>,
    Listen,          ConnectV7,
    AcceptV7,        RegisterMemory,
    RegisterDmaBuf,  DeregisterMemory,
    SendV9,          ReceiveV9,
    Flush,           Test,
    CloseSend,       CloseReceive,
    CloseListen,     DeviceMemoryHandle,
    ReceiveConsumed, MakeVirtualDevice<ncclNetVDeviceProps_v9_t>,
};

HARP_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    "HARP",          Init,
    Devices,         PropertiesOf<ncclNetProperties_v8_t>,
    Listen,          ConnectV7,
    AcceptV7,        RegisterMemory,
    RegisterDmaBuf,  DeregisterMemory,
    SendIntSize,     ReceiveIntSizes,
    Flush,           Test,
    CloseSend,       CloseReceive,
    CloseListen,     DeviceMemoryHandle,
    ReceiveConsumed,
};

HARP_EXPORT const ncclNet_v7_t ncclNetPlugin_v7 = {
    "HARP",          Init,
    Devices,         PropertiesOf<ncclNetProperties_v7_t>,
    Listen,          ConnectV7,
    AcceptV7,        RegisterMemoryIntSize,
    RegisterDmaBuf,  DeregisterMemory,
    SendIntSize,     ReceiveIntSizes,
    Flush,           Test,
    CloseSend,       CloseReceive,
    CloseListen,     DeviceMemoryHandle,
    ReceiveConsumed,
};

HARP_EXPORT const ncclNet_v6_t ncclNetPlugin_v6 = {
    "HARP",         Init,
    Devices,        PropertiesOf<ncclNetProperties_v6_t>,
    Listen,         Connect,
    Accept,         RegisterMemoryIntSize,
    RegisterDmaBuf, DeregisterMemory,
    SendIntSize,    ReceiveIntSizes,
    Flush,          Test,
    CloseSend,      CloseReceive,
    CloseListen,
};
