// HARP's own declarations of NCCL's network-plugin interface (ncclNet_v6 ... ncclNet_v12), written
// from the documented layouts, without including or copying NCCL's headers. NCCL finds a plugin's
// table by the symbol name ncclNetPlugin_vN and reads it by offset, so every struct here must
// have exactly NCCL's layout on a 64-bit Linux ABI: tests/kernels/harp/nccl_net_abi_test.cc checks
// sizes and member offsets against numbers derived from NCCL's headers (and the static_asserts at
// the end of this file fail the build first).
//
// Plain C types only: the plugin exports these tables with C linkage.
#ifndef TF_EXT_KERNELS_HARP_CORE_NCCL_NET_ABI_H_
#define TF_EXT_KERNELS_HARP_CORE_NCCL_NET_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Return codes (NCCL's ncclResult_t values).
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

// Log levels and subsystem flags of NCCL's logger callback.
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

enum { NCCL_INIT = 0x1, NCCL_NET = 0x10 };

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);
// v10's init also receives a profiler callback; HARP does not emit profiler events.
typedef ncclResult_t (*ncclProfilerCallback_t)(void** event_handle, int type, void* parent_handle,
                                               int64_t plugin_id, void* extra_data);

// Limits and flags of the interface.
#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
// Virtual-device slots of the v9 to v11 properties, and of v12's.
#define HARP_NCCL_NET_MAX_DEVS_PER_NIC 4
#define HARP_NCCL_NET_MAX_DEVS_PER_NIC_V12 8
// A communicator without a traffic class (ncclNetCommConfig_vN_t), and v12's unknown rail/plane.
#define NCCL_NET_TRAFFIC_CLASS_UNDEF -1
#define NCCL_NET_ID_UNDEF -1

// Device offload kind (v7+); HARP is a host transport.
typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

// Only ever passed by pointer; HARP never offers device offload, so it never fills one in.
typedef struct ncclNetDeviceHandle ncclNetDeviceHandle_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;  // Mbit/s
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
} ncclNetProperties_v6_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v7_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  int ndevs;
  int devs[HARP_NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_v9_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;

// The members the properties of v9 and later begin with.
#define HARP_NCCL_NET_PROPERTIES_V9_HEAD \
  char* name;                            \
  char* pciPath;                         \
  uint64_t guid;                         \
  int ptrSupport;                        \
  int regIsGlobal;                       \
  int forceFlush;                        \
  int speed;                             \
  int port;                              \
  float latency;                         \
  int maxComms;                          \
  int maxRecvs;                          \
  ncclNetDeviceType netDeviceType;       \
  int netDeviceVersion;

// v9 and v10 properties have one layout.
typedef struct {
  HARP_NCCL_NET_PROPERTIES_V9_HEAD
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  int trafficClass;
} ncclNetCommConfig_v10_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef struct {
  int ndevs;
  int devs[HARP_NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

// v11: v10's properties and the requests one multi-request may hold.
typedef struct {
  HARP_NCCL_NET_PROPERTIES_V9_HEAD
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

// v12: twice the virtual-device slots, and the NIC's rail and plane.
typedef struct {
  HARP_NCCL_NET_PROPERTIES_V9_HEAD
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;
#undef HARP_NCCL_NET_PROPERTIES_V9_HEAD

// v11/v12's per-connection hints (setNetAttr); HARP takes none, but the table's type names it.
typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;
typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

// The function tables, member by member in NCCL's order. Versions differ in: v7 adds device
// handles to connect/accept and getDeviceMr/irecvConsumed; v8 makes regMr's size a size_t and adds
// regIsGlobal; v9 makes isend/irecv sizes size_t and adds makeVDevice; v10 adds a profiler
// callback to init, a comm config to connect and per-request profiler handles; v11 makes init
// per communicator (a context, which listen and connect take, and the comm config, moved from
// connect) and adds finalize and setNetAttr; v12 changes only the properties.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* count);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
} ncclNet_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* count);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm,
                         ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
} ncclNet_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* count);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm,
                         ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
} ncclNet_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* count);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm,
                         ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* dev, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int* count);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm,
                         ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void* profiler_handle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** profiler_handles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* dev, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

// v11 and v12: one member list over their own property types.
#define HARP_NCCL_NET_V11_TABLE(V)                                                              \
  typedef struct {                                                                              \
    const char* name;                                                                           \
    ncclResult_t (*init)(void** context, uint64_t comm_id, ncclNetCommConfig_##V##_t* config,   \
                         ncclDebugLogger_t logger, ncclProfilerCallback_t profiler);            \
    ncclResult_t (*devices)(int* count);                                                        \
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_##V##_t* props);                   \
    ncclResult_t (*listen)(void* context, int dev, void* handle, void** listen_comm);           \
    ncclResult_t (*connect)(void* context, int dev, void* handle, void** send_comm,             \
                            ncclNetDeviceHandle_t** send_dev_comm);                             \
    ncclResult_t (*accept)(void* listen_comm, void** recv_comm,                                 \
                           ncclNetDeviceHandle_t** recv_dev_comm);                              \
    ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);       \
    ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, \
                                int fd, void** mhandle);                                        \
    ncclResult_t (*deregMr)(void* comm, void* mhandle);                                         \
    ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,     \
                          void* profiler_handle, void** request);                               \
    ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,        \
                          void** mhandles, void** profiler_handles, void** request);            \
    ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,    \
                           void** request);                                                     \
    ncclResult_t (*test)(void* request, int* done, int* sizes);                                 \
    ncclResult_t (*closeSend)(void* send_comm);                                                 \
    ncclResult_t (*closeRecv)(void* recv_comm);                                                 \
    ncclResult_t (*closeListen)(void* listen_comm);                                             \
    ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);              \
    ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);                       \
    ncclResult_t (*makeVDevice)(int* dev, ncclNetVDeviceProps_##V##_t* props);                  \
    ncclResult_t (*finalize)(void* context);                                                    \
    ncclResult_t (*setNetAttr)(void* context, ncclNetAttr_##V##_t* attributes);                 \
  } ncclNet_##V##_t
HARP_NCCL_NET_V11_TABLE(v11);
HARP_NCCL_NET_V11_TABLE(v12);
#undef HARP_NCCL_NET_V11_TABLE

#ifdef __cplusplus
}  // extern "C"

// The layout facts NCCL relies on, checked at compile time (the test repeats them with offsetof
// for every member, so a failure there names the member).
static_assert(sizeof(void*) == 8, "HARP's NCCL ABI declarations assume a 64-bit target");
static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclNetDeviceType) == 4, "enums are ints");
static_assert(sizeof(ncclNetProperties_v6_t) == 48, "ncclNetProperties_v6_t layout");
static_assert(sizeof(ncclNetProperties_v7_t) == 56, "ncclNetProperties_v7_t layout");
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "ncclNetProperties_v8_t layout");
static_assert(sizeof(ncclNetProperties_v9_t) == 104, "ncclNetProperties_v9_t layout");
static_assert(sizeof(ncclNet_v6_t) == 17 * 8, "ncclNet_v6_t: name + 16 functions");
static_assert(sizeof(ncclNet_v7_t) == 19 * 8, "ncclNet_v7_t: name + 18 functions");
static_assert(sizeof(ncclNet_v8_t) == 19 * 8, "ncclNet_v8_t: name + 18 functions");
static_assert(sizeof(ncclNet_v9_t) == 20 * 8, "ncclNet_v9_t: name + 19 functions");
static_assert(sizeof(ncclNet_v10_t) == 20 * 8, "ncclNet_v10_t: name + 19 functions");
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "ncclNetProperties_v11_t layout");
static_assert(sizeof(ncclNetProperties_v12_t) == 128, "ncclNetProperties_v12_t layout");
static_assert(sizeof(ncclNet_v11_t) == 22 * 8, "ncclNet_v11_t: name + 21 functions");
static_assert(sizeof(ncclNet_v12_t) == 22 * 8, "ncclNet_v12_t: name + 21 functions");
#endif

#endif  // TF_EXT_KERNELS_HARP_CORE_NCCL_NET_ABI_H_
