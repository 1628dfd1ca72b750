// Drives the built HARP plugin exactly as NCCL's proxy thread does, through the dlopen'ed
// ncclNetPlugin_vN table: init -> devices/getProperties -> listen -> handle to the peer over a
// pipe -> connect/accept loop -> regMr -> isend/irecv (retrying NULL requests, up to 32
// outstanding, grouped receives) -> test polling -> close. tests/harp/test_plugin.py compiles and
// runs it.
//
//   plugin_harness PLUGIN VERSION config                   init, print properties and the log
//   plugin_harness PLUGIN VERSION transfer CONNS MAX_BYTES  two processes, every byte checked
//   plugin_harness PLUGIN VERSION kill-sender               the sender dies mid-message
//   plugin_harness PLUGIN VERSION kill-receiver             the receiver dies mid-message
//   plugin_harness PLUGIN VERSION handles                   garbage and stale handles
//   plugin_harness PLUGIN VERSION reload                    v11+: finalize, dlclose, load again
//
// v10 and later take HARNESS_TRAFFIC_CLASS from the environment as the communicator's traffic
// class (v10: connect's config; v11+: init's), and `transfer` then counts the sockets marked with
// it. Prints "HARNESS OK ..." and exits 0 when every check passed.
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/harp/core/nccl_net_abi.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fprintf(stdout, "HARNESS FAILED [%d]: ", static_cast<int>(getpid()));
  std::vfprintf(stdout, format, args);
  std::fprintf(stdout, "\n");
  std::fflush(stdout);
  va_end(args);
  _exit(1);
}

void Logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* format, ...) {
  char message[4096];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  std::printf("LOG %s %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", message);
  std::fflush(stdout);
}

// The communicator's traffic class: HARNESS_TRAFFIC_CLASS, or none.
int TrafficClass() {
  const char* value = std::getenv("HARNESS_TRAFFIC_CLASS");
  return value != nullptr ? std::atoi(value) : NCCL_NET_TRAFFIC_CLASS_UNDEF;
}

// v11+: this process's communicator context (init creates it; listen and connect take it).
void* comm_context = nullptr;

// The calls the harness makes, bound to one version's table (sizes widened to size_t).
struct Net {
  int version = 0;
  std::function<ncclResult_t()> init;
  std::function<ncclResult_t()> finalize;  // v11+
  std::function<ncclResult_t(int*)> devices;
  std::function<ncclResult_t(std::string*, int*, int*)> properties;  // name, ptrSupport, maxRecvs
  std::function<ncclResult_t(void*, void**)> listen;
  std::function<ncclResult_t(void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, void**)> reg;
  std::function<ncclResult_t(void*, void*)> dereg;
  std::function<ncclResult_t(void*, void*, size_t, int, void*, void**)> isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, int*, void**, void**)> irecv;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> close_send, close_recv, close_listen;
};

template <typename Props>
ncclResult_t CallProperties(ncclResult_t (*get)(int, Props*), std::string* name, int* ptr_support,
                            int* max_recvs) {
  Props props;
  std::memset(&props, 0, sizeof(props));
  ncclResult_t result = get(0, &props);
  if (result == ncclSuccess) {
    *name = props.name ? props.name : "(null)";
    *ptr_support = props.ptrSupport;
    *max_recvs = props.maxRecvs;
  }
  return result;
}

template <typename Table>
void BindCommon(const Table* t, Net* net) {
  net->devices = t->devices;
  if constexpr (std::is_invocable_v<decltype(t->listen), int, void*, void**>) {  // before v11
    net->listen = [t](void* handle, void** comm) { return t->listen(0, handle, comm); };
  }
  net->dereg = t->deregMr;
  net->test = t->test;
  net->close_send = t->closeSend;
  net->close_recv = t->closeRecv;
  net->close_listen = t->closeListen;
  net->properties = [t](std::string* name, int* ptr_support, int* max_recvs) {
    return CallProperties(t->getProperties, name, ptr_support, max_recvs);
  };
}

template <typename IntOrSize>
std::vector<IntOrSize> Narrow(int n, const size_t* sizes) {
  return std::vector<IntOrSize>(sizes, sizes + n);
}

Net Bind(void* library, int version) {
  Net net;
  net.version = version;
  std::string symbol = "ncclNetPlugin_v" + std::to_string(version);
  void* table = dlsym(library, symbol.c_str());
  if (table == nullptr) Die("%s not exported", symbol.c_str());
  if (version >= 10) {
    // v10 to v12 share their data-path calls; v11 moved the comm config from connect to a
    // per-communicator init, whose context listen and connect take.
    auto bind = [&](auto* t) {
      using Table = std::remove_cv_t<std::remove_pointer_t<decltype(t)>>;
      if (std::strcmp(t->name, "HARP") != 0) Die("name %s", t->name);
      BindCommon(t, &net);
      if constexpr (std::is_same_v<Table, ncclNet_v10_t>) {
        net.init = [t] { return t->init(Logger, nullptr); };
        net.connect = [t](void* handle, void** comm) {
          ncclNetCommConfig_v10_t config{TrafficClass()};
          ncclNetDeviceHandle_t* device = nullptr;
          return t->connect(0, &config, handle, comm, &device);
        };
      } else {
        net.init = [t] {
          ncclNetCommConfig_v11_t config{TrafficClass()};
          return t->init(&comm_context, 0x5eed, &config, Logger, nullptr);
        };
        net.finalize = [t] { return t->finalize(comm_context); };
        net.listen = [t](void* handle, void** comm) {
          return t->listen(comm_context, 0, handle, comm);
        };
        net.connect = [t](void* handle, void** comm) {
          ncclNetDeviceHandle_t* device = nullptr;
          return t->connect(comm_context, 0, handle, comm, &device);
        };
      }
      net.accept = [t](void* listen, void** comm) {
        ncclNetDeviceHandle_t* device = nullptr;
        return t->accept(listen, comm, &device);
      };
      net.reg = [t](void* comm, void* data, size_t size, void** mh) {
        return t->regMr(comm, data, size, NCCL_PTR_HOST, mh);
      };
      net.isend = [t](void* comm, void* data, size_t size, int tag, void* mh, void** request) {
        return t->isend(comm, data, size, tag, mh, nullptr, request);
      };
      net.irecv = [t](void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
                      void** request) {
        void* profiler[8] = {};
        return t->irecv(comm, n, data, sizes, tags, mh, profiler, request);
      };
    };
    if (version == 10) {
      bind(static_cast<const ncclNet_v10_t*>(table));
    } else if (version == 11) {
      bind(static_cast<const ncclNet_v11_t*>(table));
    } else if (version == 12) {
      bind(static_cast<const ncclNet_v12_t*>(table));
    } else {
      Die("unknown version %d", version);
    }
  } else if (version >= 7 && version <= 9) {
    // v7 to v9 connect and accept with a device handle; v9 widened the sizes to size_t, and v7
    // and v8 differ only in the properties.
    auto bind = [&](auto* t) {
      using Table = std::remove_cv_t<std::remove_pointer_t<decltype(t)>>;
      using Size = std::conditional_t<std::is_same_v<Table, ncclNet_v9_t>, size_t, int>;
      BindCommon(t, &net);
      net.init = [t] { return t->init(Logger); };
      net.connect = [t](void* handle, void** comm) {
        ncclNetDeviceHandle_t* device = nullptr;
        return t->connect(0, handle, comm, &device);
      };
      net.accept = [t](void* listen, void** comm) {
        ncclNetDeviceHandle_t* device = nullptr;
        return t->accept(listen, comm, &device);
      };
      net.reg = [t](void* comm, void* data, size_t size, void** mh) {
        return t->regMr(comm, data, static_cast<Size>(size), NCCL_PTR_HOST, mh);
      };
      net.isend = [t](void* comm, void* data, size_t size, int tag, void* mh, void** request) {
        return t->isend(comm, data, static_cast<Size>(size), tag, mh, request);
      };
      if constexpr (std::is_same_v<Size, size_t>) {
        net.irecv = t->irecv;
      } else {
        net.irecv = [t](void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
                        void** request) {
          std::vector<int> narrow = Narrow<int>(n, sizes);
          return t->irecv(comm, n, data, narrow.data(), tags, mh, request);
        };
      }
    };
    if (version == 7) {
      bind(static_cast<const ncclNet_v7_t*>(table));
    } else if (version == 8) {
      bind(static_cast<const ncclNet_v8_t*>(table));
    } else {
      bind(static_cast<const ncclNet_v9_t*>(table));
    }
  } else if (version == 6) {
    auto* t = static_cast<const ncclNet_v6_t*>(table);
    BindCommon(t, &net);
    net.init = [t] { return t->init(Logger); };
    net.connect = [t](void* handle, void** comm) { return t->connect(0, handle, comm); };
    net.accept = t->accept;
    net.reg = [t](void* comm, void* data, size_t size, void** mh) {
      return t->regMr(comm, data, static_cast<int>(size), NCCL_PTR_HOST, mh);
    };
    net.isend = [t](void* comm, void* data, size_t size, int tag, void* mh, void** request) {
      return t->isend(comm, data, static_cast<int>(size), tag, mh, request);
    };
    net.irecv = [t](void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
                    void** request) {
      std::vector<int> narrow = Narrow<int>(n, sizes);
      return t->irecv(comm, n, data, narrow.data(), tags, mh, request);
    };
  } else {
    Die("unknown version %d", version);
  }
  return net;
}

void Check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) Die("%s returned %d", what, static_cast<int>(result));
}

void InitAndDescribe(Net* net) {
  Check(net->init(), "init");
  int count = 0;
  Check(net->devices(&count), "devices");
  if (count < 1) Die("devices: %d", count);
  std::string name;
  int ptr_support = 0, max_recvs = 0;
  Check(net->properties(&name, &ptr_support, &max_recvs), "getProperties");
  if (ptr_support != NCCL_PTR_HOST) Die("ptrSupport %d", ptr_support);
  if (max_recvs < 2) Die("maxRecvs %d", max_recvs);
  std::printf("PROPERTIES name=%s ptrSupport=%d maxRecvs=%d\n", name.c_str(), ptr_support,
              max_recvs);
}

// The bytes of message `index` of connection `connection`: every byte depends on all three.
uint8_t PatternByte(uint64_t seed, size_t offset) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + (offset >> 3);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> (8 * (offset & 7)));
}

void Fill(std::vector<uint8_t>* bytes, uint64_t seed) {
  for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = PatternByte(seed, i);
}

uint64_t Seed(int connection, int message) { return uint64_t(connection) * 1000003 + message; }

// The messages of one connection: pairs (tag 1, tag 2) received by one grouped receive of 2.
std::vector<size_t> MessageSizes(int connection, size_t max_bytes) {
  std::vector<size_t> sizes = {0, 1, 7, 4096, 65537, 1 << 20};
  if (connection == 0) {
    for (size_t big = size_t{4} << 20; big <= max_bytes; big *= 4) sizes.push_back(big);
    if (sizes.back() != max_bytes && max_bytes > (size_t{1} << 20)) sizes.push_back(max_bytes);
  }
  // Many small ones: more than 32 requests in flight are wanted.
  for (int i = 0; i < 120; ++i) sizes.push_back((i * 7919) % 20000);
  if (sizes.size() % 2) sizes.push_back(3);
  return sizes;
}

void WriteAll(int fd, const void* data, size_t size) {
  if (write(fd, data, size) != static_cast<ssize_t>(size)) Die("pipe write");
}
void ReadAll(int fd, void* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, static_cast<char*>(data) + got, size - got);
    if (n <= 0) Die("pipe read");
    got += n;
  }
}

struct Connection {
  void* comm = nullptr;
  int id = 0;
  std::vector<size_t> sizes;
  size_t next = 0;  // next message (sender) or pair (receiver) to post
  struct Pending {
    void* request;
    int first;  // message index
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<void*> mhandles;
  };
  std::deque<Pending> pending;
  size_t completed = 0;
};

// Sender side: isend every message in order, up to 32 in flight, retrying NULL requests.
bool SenderStep(Net* net, Connection* c) {
  bool moved = false;
  while (c->next < c->sizes.size() && c->pending.size() < NCCL_NET_MAX_REQUESTS) {
    Connection::Pending p;
    p.first = static_cast<int>(c->next);
    p.buffers.emplace_back(c->sizes[c->next]);
    Fill(&p.buffers[0], Seed(c->id, p.first));
    void* mh = nullptr;
    Check(net->reg(c->comm, p.buffers[0].data(), p.buffers[0].size(), &mh), "regMr");
    p.mhandles.push_back(mh);
    const int tag = 1 + (p.first % 2);
    Check(net->isend(c->comm, p.buffers[0].data(), p.buffers[0].size(), tag, mh, &p.request),
          "isend");
    if (p.request == nullptr) {  // try again later, as NCCL does
      net->dereg(c->comm, mh);
      break;
    }
    c->pending.push_back(std::move(p));
    ++c->next;
    moved = true;
  }
  for (auto it = c->pending.begin(); it != c->pending.end();) {
    int done = 0, size = -1;
    Check(net->test(it->request, &done, &size), "test (send)");
    if (!done) {
      ++it;
      continue;
    }
    if (static_cast<size_t>(size) != it->buffers[0].size()) Die("send size %d", size);
    net->dereg(c->comm, it->mhandles[0]);
    it = c->pending.erase(it);
    ++c->completed;
    moved = true;
  }
  return moved;
}

// Receiver side: grouped receives of 2 (tags 1 and 2), each buffer larger than its message.
bool ReceiverStep(Net* net, Connection* c) {
  bool moved = false;
  while (c->next * 2 < c->sizes.size() && c->pending.size() < NCCL_NET_MAX_REQUESTS) {
    Connection::Pending p;
    p.first = static_cast<int>(c->next * 2);
    void* data[2];
    size_t capacity[2];
    int tags[2] = {1, 2};
    for (int b = 0; b < 2; ++b) {
      p.buffers.emplace_back(c->sizes[p.first + b] + 64, 0xcc);
      data[b] = p.buffers[b].data();
      capacity[b] = p.buffers[b].size();
      void* mh = nullptr;
      Check(net->reg(c->comm, data[b], capacity[b], &mh), "regMr");
      p.mhandles.push_back(mh);
    }
    Check(net->irecv(c->comm, 2, data, capacity, tags, p.mhandles.data(), &p.request), "irecv");
    if (p.request == nullptr) {
      for (void* mh : p.mhandles) net->dereg(c->comm, mh);
      break;
    }
    c->pending.push_back(std::move(p));
    ++c->next;
    moved = true;
  }
  for (auto it = c->pending.begin(); it != c->pending.end();) {
    int done = 0, sizes[2] = {-1, -1};
    Check(net->test(it->request, &done, sizes), "test (receive)");
    if (!done) {
      ++it;
      continue;
    }
    for (int b = 0; b < 2; ++b) {
      const size_t expected = c->sizes[it->first + b];
      if (static_cast<size_t>(sizes[b]) != expected) {
        Die("connection %d message %d: size %d, expected %zu", c->id, it->first + b, sizes[b],
            expected);
      }
      const uint64_t seed = Seed(c->id, it->first + b);
      for (size_t i = 0; i < expected; ++i) {
        if (it->buffers[b][i] != PatternByte(seed, i)) {
          Die("connection %d message %d: byte %zu differs", c->id, it->first + b, i);
        }
      }
      for (size_t i = expected; i < it->buffers[b].size(); ++i) {
        if (it->buffers[b][i] != 0xcc) Die("written past the message");
      }
      net->dereg(c->comm, it->mhandles[b]);
    }
    it = c->pending.erase(it);
    c->completed += 2;
    moved = true;
  }
  return moved;
}

// The connected IPv4 TCP sockets of this process whose TOS byte is `traffic_class`.
int SocketsMarked(int traffic_class) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) Die("opendir /proc/self/fd");
  int marked = 0;
  while (dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (entry->d_name[0] == '.' || fd == dirfd(fds)) continue;
    int tos = -1, type = 0;
    socklen_t length = sizeof(type);
    sockaddr_in peer{};
    socklen_t peer_length = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;
    length = sizeof(tos);
    if (getsockopt(fd, IPPROTO_IP, IP_TOS, &tos, &length) == 0 && tos == traffic_class) ++marked;
  }
  closedir(fds);
  return marked;
}

// With a traffic class set: how many of this side's sockets carry it.
void ReportTrafficClass(const char* side) {
  const int traffic_class = TrafficClass();
  if (traffic_class == NCCL_NET_TRAFFIC_CLASS_UNDEF) return;
  std::printf("TRAFFIC CLASS %d: %s, %d sockets marked\n", traffic_class, side,
              SocketsMarked(traffic_class));
  std::fflush(stdout);
}

// v11+: the communicator ends (after its connections), as NCCL's does.
void Finalize(Net* net) {
  if (net->finalize) Check(net->finalize(), "finalize");
}

// Receiver = this process (listens), sender = a forked child (connects).
int Transfer(Net* net, int connections, size_t max_bytes) {
  int handles[2];
  if (pipe(handles) != 0) Die("pipe");
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    close(handles[1]);
    InitAndDescribe(net);
    std::vector<Connection> sends(connections);
    std::vector<std::vector<uint8_t>> received(connections, std::vector<uint8_t>(128));
    for (int i = 0; i < connections; ++i) ReadAll(handles[0], received[i].data(), 128);
    // The connect loop: NULL comm means "call again".
    auto deadline = Clock::now() + std::chrono::seconds(20);
    for (int i = 0; i < connections; ++i) {
      sends[i].id = i;
      sends[i].sizes = MessageSizes(i, max_bytes);
      while (sends[i].comm == nullptr) {
        Check(net->connect(received[i].data(), &sends[i].comm), "connect");
        if (Clock::now() > deadline) Die("connect did not finish");
      }
    }
    ReportTrafficClass("sender");
    for (bool busy = true; busy;) {
      busy = false;
      for (Connection& c : sends) {
        SenderStep(net, &c);
        busy |= c.completed < c.sizes.size();
      }
    }
    for (Connection& c : sends) Check(net->close_send(c.comm), "closeSend");
    Finalize(net);
    std::printf("SENDER OK\n");
    std::fflush(stdout);
    _exit(0);
  }
  close(handles[0]);
  InitAndDescribe(net);
  std::vector<Connection> receives(connections);
  std::vector<void*> listeners(connections);
  for (int i = 0; i < connections; ++i) {
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    Check(net->listen(handle, &listeners[i]), "listen");
    WriteAll(handles[1], handle, sizeof(handle));
  }
  auto deadline = Clock::now() + std::chrono::seconds(20);
  for (int i = 0; i < connections; ++i) {
    receives[i].id = i;
    receives[i].sizes = MessageSizes(i, max_bytes);
    while (receives[i].comm == nullptr) {
      Check(net->accept(listeners[i], &receives[i].comm), "accept");
      if (Clock::now() > deadline) Die("accept did not finish");
    }
    Check(net->close_listen(listeners[i]), "closeListen");
  }
  ReportTrafficClass("receiver");
  size_t bytes = 0, messages = 0;
  for (bool busy = true; busy;) {
    busy = false;
    for (Connection& c : receives) {
      ReceiverStep(net, &c);
      busy |= c.completed < c.sizes.size();
    }
  }
  for (Connection& c : receives) {
    for (size_t size : c.sizes) bytes += size;
    messages += c.sizes.size();
    Check(net->close_recv(c.comm), "closeRecv");
  }
  Finalize(net);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("sender failed (status %d)", status);
  std::printf("HARNESS OK transfer v%d: %d connections, %zu messages, %zu bytes checked\n",
              net->version, connections, messages, bytes);
  return 0;
}

// One connection, the sender (child) posting one 64 MiB message; one side dies mid-message.
int Kill(Net* net, bool kill_sender) {
  int handles[2];
  if (pipe(handles) != 0) Die("pipe");
  const size_t size = size_t{64} << 20;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {  // the sender
    close(handles[1]);
    InitAndDescribe(net);
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    ReadAll(handles[0], handle, sizeof(handle));
    void* comm = nullptr;
    while (comm == nullptr) Check(net->connect(handle, &comm), "connect");
    std::vector<uint8_t> data(size, 0x42);
    void* request = nullptr;
    while (request == nullptr) {
      Check(net->isend(comm, data.data(), size, 1, nullptr, &request), "isend");
    }
    auto start = Clock::now();
    while (true) {
      int done = 0;
      ncclResult_t result = net->test(request, &done, nullptr);
      if (kill_sender && Clock::now() - start > std::chrono::milliseconds(200)) {
        raise(SIGKILL);  // mid-message: the receiver has not even posted its receive
      }
      if (result != ncclSuccess) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        std::printf("HARNESS OK sender saw error %d after %lld ms\n", static_cast<int>(result),
                    static_cast<long long>(ms.count()));
        std::fflush(stdout);
        _exit(0);
      }
      if (done) Die("the send completed although the receiver never received");
      if (Clock::now() - start > std::chrono::seconds(20)) Die("sender: no error within 20 s");
    }
  }
  close(handles[0]);
  InitAndDescribe(net);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listener = nullptr;
  Check(net->listen(handle, &listener), "listen");
  WriteAll(handles[1], handle, sizeof(handle));
  void* comm = nullptr;
  while (comm == nullptr) Check(net->accept(listener, &comm), "accept");
  if (!kill_sender) {
    usleep(200 * 1000);  // let the sender fill the socket buffers, then die mid-message
    raise(SIGKILL);
  }
  int status = 0;
  waitpid(child, &status, 0);  // the sender killed itself mid-message
  std::vector<uint8_t> data(size);
  void* buffers[] = {data.data()};
  size_t capacity[] = {size};
  int tags[] = {1};
  void* mhandles[] = {nullptr};
  void* request = nullptr;
  while (request == nullptr) {
    Check(net->irecv(comm, 1, buffers, capacity, tags, mhandles, &request), "irecv");
  }
  auto start = Clock::now();
  while (true) {
    int done = 0;
    ncclResult_t result = net->test(request, &done, nullptr);
    if (result != ncclSuccess) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      std::printf("HARNESS OK receiver saw error %d after %lld ms\n", static_cast<int>(result),
                  static_cast<long long>(ms.count()));
      return 0;
    }
    if (done) Die("the receive completed although the sender died");
    if (Clock::now() - start > std::chrono::seconds(20)) Die("receiver: no error within 20 s");
  }
}

int Handles(Net* net) {
  InitAndDescribe(net);
  uint8_t garbage[NCCL_NET_HANDLE_MAXSIZE];
  for (size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = static_cast<uint8_t>(rand());
  void* comm = nullptr;
  ncclResult_t result = net->connect(garbage, &comm);
  if (result == ncclSuccess || comm != nullptr) Die("a garbage handle was accepted");
  std::printf("garbage handle: error %d\n", static_cast<int>(result));
  // A stale handle: its listener is closed.
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listener = nullptr;
  Check(net->listen(handle, &listener), "listen");
  Check(net->close_listen(listener), "closeListen");
  auto deadline = Clock::now() + std::chrono::seconds(10);
  result = ncclSuccess;
  while (result == ncclSuccess && comm == nullptr && Clock::now() < deadline) {
    result = net->connect(handle, &comm);
  }
  if (result == ncclSuccess) Die("a stale handle did not fail");
  std::printf("HARNESS OK handles: garbage and stale handles rejected (stale: error %d)\n",
              static_cast<int>(result));
  return 0;
}

// The connect/accept loop of both ends within this process: they alternate, neither blocks.
void ConnectWithinProcess(Net* net, void* handle, void* listener, void** send, void** recv) {
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (*send == nullptr || *recv == nullptr) {
    if (*send == nullptr) Check(net->connect(handle, send), "connect");
    if (*recv == nullptr) Check(net->accept(listener, recv), "accept");
    if (Clock::now() > deadline) Die("connect/accept did not finish");
  }
}

// One connection within this process (connect and accept alternate, neither blocks) carrying one
// message, then everything closed and the communicator finalized.
void RoundTrip(Net* net, uint64_t seed) {
  InitAndDescribe(net);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void *listener = nullptr, *send = nullptr, *recv = nullptr;
  Check(net->listen(handle, &listener), "listen");
  ConnectWithinProcess(net, handle, listener, &send, &recv);
  Check(net->close_listen(listener), "closeListen");
  auto deadline = Clock::now() + std::chrono::seconds(20);
  std::vector<uint8_t> sent(1 << 20), received(sent.size() + 64, 0xcc);
  Fill(&sent, seed);
  void *send_request = nullptr, *recv_request = nullptr;
  void* data[] = {received.data()};
  size_t capacity[] = {received.size()};
  int tags[] = {7};
  void* mhandles[] = {nullptr};
  while (send_request == nullptr) {
    Check(net->isend(send, sent.data(), sent.size(), 7, nullptr, &send_request), "isend");
  }
  while (recv_request == nullptr) {
    Check(net->irecv(recv, 1, data, capacity, tags, mhandles, &recv_request), "irecv");
  }
  int send_done = 0, recv_done = 0, size = -1;
  while (!send_done || !recv_done) {
    if (!send_done) Check(net->test(send_request, &send_done, nullptr), "test (send)");
    if (!recv_done) Check(net->test(recv_request, &recv_done, &size), "test (receive)");
    if (Clock::now() > deadline) Die("the message did not arrive");
  }
  if (size != static_cast<int>(sent.size()) ||
      !std::equal(sent.begin(), sent.end(), received.begin())) {
    Die("the message arrived wrong (size %d)", size);
  }
  Check(net->close_send(send), "closeSend");
  Check(net->close_recv(recv), "closeRecv");
  Check(net->finalize(), "finalize");
}

// Two communicators at once (NCCL 2.28+ inits the plugin per communicator): a connection between
// a listener of one and a connector of the other, and one finalized while the other goes on.
void TwoCommunicators(Net* net) {
  Check(net->init(), "init (communicator A)");
  void* first = comm_context;
  Check(net->init(), "init (communicator B)");
  void* second = comm_context;
  if (first == second) Die("two communicators got one context");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void *listener = nullptr, *send = nullptr, *recv = nullptr;
  comm_context = first;
  Check(net->listen(handle, &listener), "listen (A)");
  comm_context = second;  // connects as B
  ConnectWithinProcess(net, handle, listener, &send, &recv);
  Check(net->close_send(send), "closeSend");
  Check(net->close_recv(recv), "closeRecv");
  Check(net->close_listen(listener), "closeListen");
  comm_context = first;
  Check(net->finalize(), "finalize (A)");
  comm_context = second;  // B is unaffected by A's end
  Check(net->listen(handle, &listener), "listen (B, after A's finalize)");
  Check(net->close_listen(listener), "closeListen");
  Check(net->finalize(), "finalize (B)");
}

// What NCCL 2.28 and later do: the last communicator's finalize, then dlclose of the plugin, and
// for the next communicator dlopen and init again. The plugin's worker threads outlive the
// dlclose; they must still have their code (a crash here otherwise, once their poll returns).
int Reload(const char* path, int version) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) Die("dlopen: %s", dlerror());
  Net net = Bind(library, version);
  if (!net.finalize) Die("v%d has no finalize", version);
  RoundTrip(&net, 1);
  // A context used after finalize, or finalized twice, is an error (logged), never a crash.
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listener = nullptr;
  if (net.listen(handle, &listener) == ncclSuccess || listener != nullptr) {
    Die("listen with a finalized context succeeded");
  }
  if (net.finalize() == ncclSuccess) Die("a second finalize succeeded");
  TwoCommunicators(&net);
  if (dlclose(library) != 0) Die("dlclose: %s", dlerror());
  usleep(300 * 1000);  // longer than the workers' poll period: they wake up in the library
  library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) Die("dlopen again: %s", dlerror());
  net = Bind(library, version);
  RoundTrip(&net, 2);
  std::printf(
      "HARNESS OK reload v%d: two communicators, finalize, dlclose and a second load and init\n",
      version);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) Die("usage: plugin_harness PLUGIN VERSION MODE [ARGS]");
  alarm(120);  // a hang is a failure, never a stuck test
  if (std::string(argv[3]) == "reload") return Reload(argv[1], std::atoi(argv[2]));
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) Die("dlopen: %s", dlerror());
  Net net = Bind(library, std::atoi(argv[2]));
  const std::string mode = argv[3];
  if (mode == "config") {
    ncclResult_t result = net.init();
    std::printf("INIT %d\n", static_cast<int>(result));
    if (result == ncclSuccess) InitAndDescribe(&net);
    return 0;
  }
  if (mode == "transfer" && argc == 6) {
    return Transfer(&net, std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10));
  }
  if (mode == "kill-sender") return Kill(&net, true);
  if (mode == "kill-receiver") return Kill(&net, false);
  if (mode == "handles") return Handles(&net);
  Die("unknown mode %s", mode.c_str());
}
