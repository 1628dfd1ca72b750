// The benchmark's stand-in for NCCL's built-in socket transport ("NET/Socket") as it runs by
// default: NOT product code, only what benchmarks/harp_transport.py compares HARP against.
//
// It behaves as NCCL's src/transport/net_socket.cc does with its default settings on a NIC that is
// neither AWS's nor GCP's (NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD auto-detected to 0):
//   - one TCP socket per connection (TCP_NODELAY), no helper threads;
//   - all progress is made inside test(), by NCCL's proxy thread: one non-blocking send()/recv()
//     (MSG_DONTWAIT) of what the socket accepts per call, requests in posting order;
//   - each message is its 4-byte size, followed by up to 128 bytes inline with it
//     (NCCL_SOCKET_INLINE), then the payload; a receive smaller than the message is an error;
//   - a 64 KiB minimum task size (NCCL_SOCKET_MIN_TASKSIZE), which only matters with helper
//     threads: with none, the whole message goes over the one socket;
//   - host pointers only (ptrSupport = NCCL_PTR_HOST), maxRecvs = 1, 32 requests per comm.
// Written from that description, not from NCCL's code. Exports ncclNetPlugin_v8 (name
// "BaselineSocket"), declared by HARP's own ABI header. Interface: NCCL_SOCKET_IFNAME (an exact
// interface name or an IPv4 address), else the first interface that is up and not loopback, else
// loopback.
//
//   g++ -O2 -std=c++17 -shared -fPIC -I<repo> socket_baseline_plugin.cc -o libnccl-net-baseline.so
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/harp/core/nccl_net_abi.h"

namespace {

constexpr uint64_t kMagic = 0x42534c4e45544831ull;  // in the handle and the connect greeting
constexpr int kInlineBytes = 128;                   // NCCL_SOCKET_INLINE's default
constexpr int kMinTaskBytes = 64 * 1024;            // NCCL_SOCKET_MIN_TASKSIZE's default (unused)
constexpr int kMaxRequests = NCCL_NET_MAX_REQUESTS;

ncclDebugLogger_t logger = nullptr;
sockaddr_in local_address;
char interface_name[IF_NAMESIZE + 1] = "lo";
int link_speed_mbps = 10000;

#define WARN(...)                                                                 \
  do {                                                                            \
    if (logger) logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

struct Handle {  // what listen() gives NCCL to pass to the peer
  uint64_t magic;
  sockaddr_in address;
  // Connect's in-progress state lives in NCCL's copy of the handle, as NCCL's own does.
  uint64_t pending_magic;
  struct PendingConnect* pending;
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");

struct PendingConnect {
  int fd;
  int greeting_sent;
};

struct ListenComm {
  int fd;
  int accepted = -1;  // a connection whose greeting has not fully arrived
  int greeting_received = 0;
  uint8_t greeting[8];
};

struct Comm;
struct Request {
  Comm* comm;
  bool send;
  // 0 free, 1 exchanging the size (+ inline data), 2 payload, 3 done, 4 reported done (leaves the
  // posting order once every older request has too)
  int stage = 0;
  uint8_t* data;
  int size;      // posted size; the message's size once known (receive side)
  int capacity;  // receive side: the posted size
  uint8_t header[4 + kInlineBytes];
  int header_bytes = 0, header_done = 0;
  int offset = 0;
};

struct Comm {
  int fd;
  bool send;
  Request requests[kMaxRequests];
  int order[kMaxRequests];  // request indices in posting order (a ring)
  int head = 0, count = 0;
  bool failed = false;
};

int SetNonBlocking(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool FindInterface() {
  const char* wanted = std::getenv("NCCL_SOCKET_IFNAME");
  std::string want = wanted ? wanted : "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (int pass = 0; pass < 2 && !found; ++pass) {  // pass 1: loopback as the last resort
    for (ifaddrs* e = list; e != nullptr && !found; e = e->ifa_next) {
      if (e->ifa_addr == nullptr || e->ifa_addr->sa_family != AF_INET) continue;
      const sockaddr_in* in = reinterpret_cast<const sockaddr_in*>(e->ifa_addr);
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
      bool match;
      if (!want.empty()) {
        match = want == e->ifa_name || want == text;
      } else {
        bool loopback = (e->ifa_flags & IFF_LOOPBACK) != 0;
        match = (e->ifa_flags & IFF_UP) && (pass == 0 ? !loopback : loopback);
      }
      if (!match) continue;
      local_address = *in;
      local_address.sin_port = 0;
      std::snprintf(interface_name, sizeof(interface_name), "%s", e->ifa_name);
      found = true;
    }
    if (!want.empty()) break;
  }
  freeifaddrs(list);
  return found;
}

ncclResult_t Init(ncclDebugLogger_t log) {
  logger = log;
  if (!FindInterface()) {
    WARN("BaselineSocket: no usable IPv4 interface (NCCL_SOCKET_IFNAME=%s)",
         std::getenv("NCCL_SOCKET_IFNAME") ? std::getenv("NCCL_SOCKET_IFNAME") : "");
    return ncclSystemError;
  }
  std::ifstream speed(std::string("/sys/class/net/") + interface_name + "/speed");
  int mbps = 0;
  if (speed >> mbps && mbps > 0) link_speed_mbps = mbps;
  return ncclSuccess;
}

ncclResult_t Devices(int* count) {
  *count = 1;
  return ncclSuccess;
}

ncclResult_t GetProperties(int dev, ncclNetProperties_v8_t* props) {
  if (dev != 0) return ncclInvalidArgument;
  std::memset(props, 0, sizeof(*props));
  props->name = interface_name;
  props->pciPath = nullptr;
  props->guid = 0;
  props->ptrSupport = NCCL_PTR_HOST;
  props->regIsGlobal = 0;
  props->speed = link_speed_mbps;
  props->port = 0;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  return ncclSuccess;
}

ncclResult_t Listen(int dev, void* opaque_handle, void** listen_comm) {
  if (dev != 0) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address = local_address;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      SetNonBlocking(fd) != 0) {
    WARN("BaselineSocket: listen failed: %s", std::strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  Handle* handle = static_cast<Handle*>(opaque_handle);
  std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  handle->magic = kMagic;
  handle->address = address;
  ListenComm* listener = new ListenComm();
  listener->fd = fd;
  *listen_comm = listener;
  return ncclSuccess;
}

Comm* NewComm(int fd, bool send) {
  Comm* comm = new Comm;
  comm->fd = fd;
  comm->send = send;
  for (Request& r : comm->requests) r.comm = comm;
  SetNoDelay(fd);
  return comm;
}

// Never blocks: returns success with a null comm until the TCP handshake and the greeting are done.
ncclResult_t Connect(int dev, void* opaque_handle, void** send_comm, ncclNetDeviceHandle_t**) {
  *send_comm = nullptr;
  Handle* handle = static_cast<Handle*>(opaque_handle);
  if (dev != 0 || handle->magic != kMagic || handle->address.sin_family != AF_INET) {
    WARN("BaselineSocket: connect: invalid handle");
    return ncclInvalidArgument;
  }
  PendingConnect* pending = handle->pending_magic == kMagic ? handle->pending : nullptr;
  if (pending == nullptr) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ncclSystemError;
    if (connect(fd, reinterpret_cast<sockaddr*>(&handle->address), sizeof(handle->address)) != 0 &&
        errno != EINPROGRESS) {
      WARN("BaselineSocket: connect failed: %s", std::strerror(errno));
      close(fd);
      return ncclRemoteError;
    }
    pending = new PendingConnect{fd, 0};
    handle->pending = pending;
    handle->pending_magic = kMagic;
  }
  pollfd p = {pending->fd, POLLOUT, 0};
  if (poll(&p, 1, 0) <= 0) return ncclSuccess;  // still connecting
  int error = 0;
  socklen_t length = sizeof(error);
  getsockopt(pending->fd, SOL_SOCKET, SO_ERROR, &error, &length);
  if (error == 0) {
    uint64_t magic = kMagic;
    ssize_t n = send(pending->fd, reinterpret_cast<uint8_t*>(&magic) + pending->greeting_sent,
                     sizeof(magic) - pending->greeting_sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) pending->greeting_sent += static_cast<int>(n);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) error = errno;
  }
  if (error != 0) {
    WARN("BaselineSocket: connect failed: %s", std::strerror(error));
    close(pending->fd);
    delete pending;
    handle->pending_magic = 0;
    return ncclRemoteError;
  }
  if (pending->greeting_sent < static_cast<int>(sizeof(uint64_t))) return ncclSuccess;
  *send_comm = NewComm(pending->fd, true);
  delete pending;
  handle->pending_magic = 0;
  handle->pending = nullptr;
  return ncclSuccess;
}

ncclResult_t Accept(void* opaque_listen, void** recv_comm, ncclNetDeviceHandle_t**) {
  *recv_comm = nullptr;
  ListenComm* listen_comm = static_cast<ListenComm*>(opaque_listen);
  if (listen_comm->accepted < 0) {
    int fd = accept4(listen_comm->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess;
      WARN("BaselineSocket: accept failed: %s", std::strerror(errno));
      return ncclSystemError;
    }
    listen_comm->accepted = fd;
    listen_comm->greeting_received = 0;
  }
  ssize_t n = recv(listen_comm->accepted, listen_comm->greeting + listen_comm->greeting_received,
                   sizeof(listen_comm->greeting) - listen_comm->greeting_received, MSG_DONTWAIT);
  if (n > 0) listen_comm->greeting_received += static_cast<int>(n);
  bool fail = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  if (!fail && listen_comm->greeting_received == sizeof(listen_comm->greeting)) {
    uint64_t magic;
    std::memcpy(&magic, listen_comm->greeting, sizeof(magic));
    fail = magic != kMagic;
    if (!fail) {
      *recv_comm = NewComm(listen_comm->accepted, false);
      listen_comm->accepted = -1;
      return ncclSuccess;
    }
  }
  if (fail) {  // a peer that went away or is not ours: drop it, keep listening
    close(listen_comm->accepted);
    listen_comm->accepted = -1;
  }
  return ncclSuccess;
}

ncclResult_t RegMr(void*, void*, size_t, int type, void** mhandle) {
  if (type != NCCL_PTR_HOST) return ncclInternalError;
  *mhandle = nullptr;  // nothing to register for host memory and one socket
  return ncclSuccess;
}

ncclResult_t RegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) {
  return ncclInternalError;
}

ncclResult_t DeregMr(void*, void*) { return ncclSuccess; }

// A free request slot appended to the posting order, or null when 32 are outstanding.
Request* Post(Comm* comm, bool send, void* data, int size) {
  if (comm->count == kMaxRequests) return nullptr;
  for (int i = 0; i < kMaxRequests; ++i) {
    Request& r = comm->requests[i];
    if (r.stage != 0) continue;
    r.send = send;
    r.stage = 1;
    r.data = static_cast<uint8_t*>(data);
    r.size = size;
    r.capacity = size;
    r.header_done = 0;
    r.offset = 0;
    if (send) {  // the size, then the payload inline if it is small
      std::memcpy(r.header, &size, 4);
      int inline_bytes = size <= kInlineBytes ? size : 0;
      if (inline_bytes > 0) std::memcpy(r.header + 4, data, inline_bytes);
      r.header_bytes = 4 + inline_bytes;
    } else {
      r.header_bytes = 4;  // grows by the inline bytes once the size is known
    }
    comm->order[(comm->head + comm->count) % kMaxRequests] = i;
    ++comm->count;
    return &r;
  }
  return nullptr;
}

ncclResult_t Isend(void* opaque_comm, void* data, int size, int, void*, void** request) {
  Comm* comm = static_cast<Comm*>(opaque_comm);
  if (comm->failed) return ncclRemoteError;
  if (size < 0) return ncclInvalidArgument;
  *request = Post(comm, true, data, size);
  return ncclSuccess;
}

ncclResult_t Irecv(void* opaque_comm, int n, void** data, int* sizes, int*, void**,
                   void** request) {
  Comm* comm = static_cast<Comm*>(opaque_comm);
  if (comm->failed) return ncclRemoteError;
  if (n != 1) return ncclInternalError;  // maxRecvs = 1
  *request = Post(comm, false, data[0], sizes[0]);
  return ncclSuccess;
}

ncclResult_t Iflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;  // host memory: nothing to flush (NCCL never calls it for host plugins)
  return ncclSuccess;
}

// One non-blocking send()/recv() on the comm's socket; false on an error or a closed peer.
bool ProgressOnce(Comm* comm, bool send, uint8_t* data, int size, int* offset) {
  if (*offset >= size) return true;
  ssize_t n = send ? ::send(comm->fd, data + *offset, size - *offset, MSG_DONTWAIT | MSG_NOSIGNAL)
                   : recv(comm->fd, data + *offset, size - *offset, MSG_DONTWAIT);
  if (n > 0) {
    *offset += static_cast<int>(n);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  WARN("BaselineSocket: %s: %s", send ? "send" : "recv",
       n == 0 ? "connection closed by the peer" : std::strerror(errno));
  return false;
}

// Advances request `r` (the oldest unfinished one of its comm) as far as one call allows.
ncclResult_t Advance(Request* r) {
  Comm* comm = r->comm;
  if (r->stage == 1) {  // the size (and inline data)
    int before = r->header_done;
    if (!ProgressOnce(comm, r->send, r->header, r->header_bytes, &r->header_done)) {
      return ncclRemoteError;
    }
    if (!r->send && before < 4 && r->header_done >= 4) {
      int size;
      std::memcpy(&size, r->header, 4);
      if (size < 0 || size > r->capacity) {
        WARN("BaselineSocket: message truncated: receiving %d bytes into %d", size, r->capacity);
        return ncclInvalidUsage;
      }
      r->size = size;
      r->header_bytes = 4 + (size <= kInlineBytes ? size : 0);
      if (r->header_done < r->header_bytes) {  // the inline bytes, as NCCL: in the same test()
        if (!ProgressOnce(comm, false, r->header, r->header_bytes, &r->header_done)) {
          return ncclRemoteError;
        }
      }
    }
    if (r->header_done < r->header_bytes) return ncclSuccess;
    if (!r->send && r->size <= kInlineBytes) std::memcpy(r->data, r->header + 4, r->size);
    r->offset = r->size <= kInlineBytes ? r->size : 0;
    r->stage = 2;
  }
  if (r->stage == 2) {
    if (!ProgressOnce(comm, r->send, r->data, r->size, &r->offset)) return ncclRemoteError;
    if (r->offset == r->size) r->stage = 3;
  }
  return ncclSuccess;
}

ncclResult_t Test(void* request, int* done, int* size) {
  *done = 0;
  Request* r = static_cast<Request*>(request);
  if (r == nullptr || r->stage == 0 || r->stage == 4) return ncclInternalError;
  Comm* comm = r->comm;
  if (comm->failed) return ncclRemoteError;
  // Requests share one byte stream: the older ones go first (NCCL's proxy tests in order anyway).
  for (int k = 0; k < comm->count && r->stage != 3; ++k) {
    Request* oldest = &comm->requests[comm->order[(comm->head + k) % kMaxRequests]];
    if (oldest->stage >= 3) continue;
    ncclResult_t result = Advance(oldest);
    if (result != ncclSuccess) {
      comm->failed = true;
      return result;
    }
    if (oldest->stage != 3) break;
  }
  if (r->stage != 3) return ncclSuccess;
  *done = 1;
  if (size) *size = r->size;
  r->stage = 4;
  // Free the reported requests at the front of the posting order.
  while (comm->count > 0 && comm->requests[comm->order[comm->head]].stage == 4) {
    comm->requests[comm->order[comm->head]].stage = 0;
    comm->head = (comm->head + 1) % kMaxRequests;
    --comm->count;
  }
  return ncclSuccess;
}

ncclResult_t CloseComm(void* opaque_comm) {
  Comm* comm = static_cast<Comm*>(opaque_comm);
  if (comm == nullptr) return ncclSuccess;
  close(comm->fd);
  delete comm;
  return ncclSuccess;
}

ncclResult_t CloseListen(void* opaque_listen) {
  ListenComm* listen_comm = static_cast<ListenComm*>(opaque_listen);
  if (listen_comm == nullptr) return ncclSuccess;
  if (listen_comm->accepted >= 0) close(listen_comm->accepted);
  close(listen_comm->fd);
  delete listen_comm;
  return ncclSuccess;
}

ncclResult_t GetDeviceMr(void*, void*, void** device_mhandle) {
  *device_mhandle = nullptr;
  return ncclSuccess;
}

ncclResult_t IrecvConsumed(void*, int, void*) { return ncclSuccess; }

static_assert(kMinTaskBytes == 65536, "documented above");

}  // namespace

extern "C" __attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "BaselineSocket", Init,  Devices,     GetProperties, Listen,      Connect,
    Accept,           RegMr, RegMrDmaBuf, DeregMr,       Isend,       Irecv,
    Iflush,           Test,  CloseComm,   CloseComm,     CloseListen, GetDeviceMr,
    IrecvConsumed,
};
