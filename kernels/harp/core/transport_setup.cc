#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/harp/core/interface_choice.h"
#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/transport_internal.h"
#include "kernels/harp/core/wire_format.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {
namespace {

uint64_t RandomId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  uint64_t value = (uint64_t{device()} << 32) ^ device();
  value ^= static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
  return value ^ counter.fetch_add(1, std::memory_order_relaxed);
}

// Latency and dead-peer detection for every HARP socket: no Nagle delay on small frames, and the
// kernel aborts a connection whose data or keepalive probes stay unacknowledged for timeout_ms, so
// a vanished host turns into a socket error instead of a silent hang. A traffic class (not
// kNoTrafficClass) marks the socket's packets (IP TOS, the DSCP a cloud network's QoS reads).
void ConfigureSocket(int fd, int timeout_ms, int traffic_class) {
  if (traffic_class != kNoTrafficClass) {
    setsockopt(fd, IPPROTO_IP, IP_TOS, &traffic_class, sizeof(traffic_class));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int probe_seconds = std::max(1, timeout_ms / 3000);
  int probes = 2;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_seconds, sizeof(probe_seconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_seconds, sizeof(probe_seconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  unsigned int user_timeout = static_cast<unsigned int>(timeout_ms);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Listening and connection set-up

class ListenSocket {
 public:
  int fd = -1;
  uint64_t nonce = 0;
  int traffic_class = kNoTrafficClass;  // of the connections it accepts
  struct Incoming {
    int fd;
    uint8_t hello[kHelloBytes];
    size_t received;
    Clock::time_point deadline;
  };
  std::vector<Incoming> incoming;
  struct Group {
    uint64_t connection_id;
    uint16_t stream_count;
    std::vector<int> fds;  // control, then the data streams
    int arrived;
    Clock::time_point deadline;  // a connector that never completes its set of sockets
  };
  std::vector<Group> groups;

  ~ListenSocket() {
    CloseFd(&fd);
    for (Incoming& socket : incoming) CloseFd(&socket.fd);
    for (Group& group : groups) {
      for (int& socket : group.fds) CloseFd(&socket);
    }
  }
};

struct Transport::PendingConnect {
  uint64_t nonce = 0;
  Hello hello;
  std::vector<int> fds;  // control, then the data streams
  std::vector<bool> connected;
  std::vector<size_t> hello_sent;
  uint8_t ack[kAckBytes];
  size_t ack_received = 0;
  Clock::time_point deadline;
  std::string peer;
  ~PendingConnect() {
    for (int& fd : fds) CloseFd(&fd);
  }
};

Transport::Transport(const Config& config, LogFunction log)
    : config_(config), log_(std::move(log)) {}

Transport::~Transport() {
  workers_.clear();
  for (PendingConnect* pending : pending_connects_) delete pending;
}

void Transport::Log(LogLevel level, const std::string& message) const {
  if (log_) log_(level, message);
}

Status Transport::Create(const Config& config, LogFunction log, std::unique_ptr<Transport>* out,
                         std::string* error) {
  std::unique_ptr<Transport> transport(new Transport(config, std::move(log)));
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  for (int cpu : config.cpu_affinity) {
    if (cpu >= cpus || cpu >= CPU_SETSIZE) {
      *error = "HARP_CPU_AFFINITY names CPU " + std::to_string(cpu) + " but this machine has " +
               std::to_string(cpus) + " CPUs";
      return Status::kInvalidUsage;
    }
  }
  InterfaceChoice choice;
  if (!ChooseInterface(ListInterfaces(), config.interface, config.nccl_socket_ifname, &choice,
                       error)) {
    return Status::kInvalidUsage;
  }
  in_addr address{};
  address.s_addr = choice.ipv4;
  transport->interface_name_ = choice.name;
  transport->ipv4_address_ = address.s_addr;
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &address, text, sizeof(text));
  transport->address_text_ = text;
  transport->Log(LogLevel::kInfo, "HARP: listening on " + choice.name + " " +
                                      transport->address_text_ + ", chosen by " + choice.reason);
  std::ifstream speed("/sys/class/net/" + transport->interface_name_ + "/speed");
  int mbps = 0;
  if (speed >> mbps && mbps > 0) transport->link_speed_mbps_ = mbps;
  for (int i = 0; i < config.worker_threads; ++i) {
    int cpu = config.cpu_affinity.empty()
                  ? -1
                  : config.cpu_affinity[static_cast<size_t>(i) % config.cpu_affinity.size()];
    transport->workers_.push_back(std::make_unique<Worker>(cpu));
  }
  *out = std::move(transport);
  return Status::kOk;
}
bool Transport::ValidTrafficClass(int traffic_class, std::string* error) {
  if (traffic_class == kNoTrafficClass ||
      (traffic_class >= 0 && traffic_class <= kMaxTrafficClass)) {
    return true;
  }
  *error = "traffic class " + std::to_string(traffic_class) +
           " is invalid: an IP TOS byte (0-255) or -1 (none)";
  return false;
}

Status Transport::Listen(void* handle, ListenSocket** out, int traffic_class) {
  *out = nullptr;
  std::string error;
  if (!ValidTrafficClass(traffic_class, &error)) {
    Log(LogLevel::kWarning, "HARP: listen: " + error);
    return Status::kInvalidArgument;
  }
  auto listener = std::make_unique<ListenSocket>();
  listener->traffic_class = traffic_class;
  listener->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener->fd < 0) {
    Log(LogLevel::kWarning, SystemError("HARP: socket"));
    return Status::kSystemError;
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = ipv4_address_;
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(listener->fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener->fd, 1024) != 0 ||
      getsockname(listener->fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    Log(LogLevel::kWarning, SystemError(("HARP: listen on " + address_text_).c_str()));
    return Status::kSystemError;
  }
  listener->nonce = RandomId();
  EncodeHandle(ListenHandle{ipv4_address_, ntohs(address.sin_port), listener->nonce}, handle);
  *out = listener.release();
  return Status::kOk;
}

Status Transport::Connect(void* handle, SendConnection** out, int traffic_class) {
  *out = nullptr;
  std::string error;
  if (!ValidTrafficClass(traffic_class, &error)) {
    Log(LogLevel::kWarning, "HARP: connect: " + error);
    return Status::kInvalidArgument;
  }
  uint8_t* slot = static_cast<uint8_t*>(handle) + kHandleConnectorSlotOffset;
  PendingConnect* pending = nullptr;
  std::memcpy(&pending, slot, sizeof(pending));
  if (pending != nullptr) {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (pending_connects_.count(pending) == 0) pending = nullptr;  // not ours: a fresh handle
  }
  auto give_up = [&](Status status, const std::string& why) {
    Log(LogLevel::kWarning, why);
    if (pending != nullptr) {
      {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        pending_connects_.erase(pending);
      }
      delete pending;
      std::memset(slot, 0, sizeof(pending));
    }
    return status;
  };
  if (pending == nullptr) {
    ListenHandle listen_handle;
    if (!DecodeHandle(handle, &listen_handle, &error)) {
      Log(LogLevel::kWarning, "HARP: connect: " + error);
      return Status::kInvalidArgument;
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = listen_handle.ipv4_address;
    address.sin_port = htons(listen_handle.port);
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
    pending = new PendingConnect;
    {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      pending_connects_.insert(pending);
    }
    std::memcpy(slot, &pending, sizeof(pending));
    pending->peer = std::string(text) + ":" + std::to_string(listen_handle.port);
    pending->nonce = listen_handle.nonce;
    pending->hello.nonce = listen_handle.nonce;
    pending->hello.connection_id = RandomId();
    pending->hello.stream_count = static_cast<uint16_t>(config_.streams_per_connection);
    pending->deadline = Clock::now() + std::chrono::milliseconds(config_.timeout_ms);
    const int sockets = config_.streams_per_connection + 1;
    for (int i = 0; i < sockets; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return give_up(Status::kSystemError, SystemError("HARP: socket"));
      pending->fds.push_back(fd);
      ConfigureSocket(fd, config_.timeout_ms, traffic_class);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 &&
          errno != EINPROGRESS) {
        return give_up(Status::kSystemError,
                       SystemError(("HARP: connect to " + pending->peer).c_str()));
      }
    }
    pending->connected.assign(sockets, false);
    pending->hello_sent.assign(sockets, 0);
  }
  // Step by step, never waiting: sockets connected, hellos sent, the listener's ack read.
  bool hellos_sent = true;
  for (size_t i = 0; i < pending->fds.size(); ++i) {
    const int fd = pending->fds[i];
    if (!pending->connected[i]) {
      pollfd ready{fd, POLLOUT, 0};
      if (poll(&ready, 1, 0) <= 0) {
        hellos_sent = false;
        continue;
      }
      int socket_error = 0;
      socklen_t length = sizeof(socket_error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &socket_error, &length);
      if (socket_error != 0) {
        return give_up(Status::kSystemError, "HARP: connect to " + pending->peer + ": " +
                                                 strerror(socket_error) +
                                                 " (is the handle stale, or the peer gone?)");
      }
      pending->connected[i] = true;
    }
    if (pending->hello_sent[i] < kHelloBytes) {
      Hello hello = pending->hello;
      hello.stream_index = static_cast<uint16_t>(i);
      uint8_t bytes[kHelloBytes];
      EncodeHello(hello, bytes);
      ssize_t sent = send(fd, bytes + pending->hello_sent[i], kHelloBytes - pending->hello_sent[i],
                          MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && !WouldBlock() && errno != EINTR) {
        return give_up(Status::kSystemError,
                       SystemError(("HARP: connect to " + pending->peer).c_str()));
      }
      if (sent > 0) pending->hello_sent[i] += sent;
      if (pending->hello_sent[i] < kHelloBytes) hellos_sent = false;
    }
  }
  if (hellos_sent) {
    ssize_t got = recv(pending->fds[0], pending->ack + pending->ack_received,
                       kAckBytes - pending->ack_received, MSG_DONTWAIT);
    if (got == 0) {
      return give_up(Status::kRemote, "HARP: " + pending->peer +
                                          " refused the connection (a stale handle: the listener "
                                          "it names is gone or was replaced)");
    }
    if (got < 0 && !WouldBlock() && errno != EINTR) {
      return give_up(Status::kSystemError,
                     SystemError(("HARP: connect to " + pending->peer).c_str()));
    }
    if (got > 0) pending->ack_received += got;
    if (pending->ack_received == kAckBytes) {
      if (!DecodeAck(pending->ack, pending->nonce, &error)) {
        return give_up(Status::kRemote, "HARP: connect to " + pending->peer + ": " + error);
      }
      std::vector<int> streams(pending->fds.begin() + 1, pending->fds.end());
      auto* connection = new SendConnection(pending->fds[0], streams, config_.chunk_bytes,
                                            config_.zerocopy_threshold, log_);
      pending->fds.clear();  // now the connection's
      {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        pending_connects_.erase(pending);
      }
      delete pending;
      std::memset(slot, 0, sizeof(pending));
      Attach(connection);
      *out = connection;
      return Status::kOk;
    }
  }
  if (Clock::now() > pending->deadline) {
    return give_up(Status::kRemote, "HARP: no connection to " + pending->peer + " within " +
                                        std::to_string(config_.timeout_ms) +
                                        " ms (HARP_TIMEOUT_MS)");
  }
  return Status::kOk;
}

Status Transport::Accept(ListenSocket* listener, ReceiveConnection** out) {
  *out = nullptr;
  while (true) {
    int fd = accept4(listener->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (WouldBlock() || errno == EINTR || errno == ECONNABORTED) break;
      Log(LogLevel::kWarning, SystemError("HARP: accept"));
      return Status::kSystemError;
    }
    ConfigureSocket(fd, config_.timeout_ms, listener->traffic_class);
    listener->incoming.push_back(ListenSocket::Incoming{
        fd, {}, 0, Clock::now() + std::chrono::milliseconds(config_.timeout_ms)});
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < listener->incoming.size();) {
    ListenSocket::Incoming& socket = listener->incoming[i];
    ssize_t got = recv(socket.fd, socket.hello + socket.received, kHelloBytes - socket.received,
                       MSG_DONTWAIT);
    if (got > 0) socket.received += got;
    std::string rejected;
    Hello hello;
    if (got == 0 || (got < 0 && !WouldBlock() && errno != EINTR)) {
      rejected = "closed before its hello";
    } else if (socket.received < kHelloBytes) {
      if (now > socket.deadline) rejected = "no hello within HARP_TIMEOUT_MS";
    } else if (!DecodeHello(socket.hello, &hello, &rejected)) {
    } else if (hello.nonce != listener->nonce) {
      rejected = "its handle names another listener (stale handle)";
    }
    if (socket.received < kHelloBytes && rejected.empty()) {
      ++i;
      continue;
    }
    const int fd = socket.fd;
    listener->incoming[i] = listener->incoming.back();
    listener->incoming.pop_back();
    if (rejected.empty()) {
      auto group = std::find_if(
          listener->groups.begin(), listener->groups.end(),
          [&](const ListenSocket::Group& g) { return g.connection_id == hello.connection_id; });
      if (group == listener->groups.end()) {
        listener->groups.push_back(ListenSocket::Group{
            hello.connection_id, hello.stream_count, std::vector<int>(hello.stream_count + 1, -1),
            0, now + std::chrono::milliseconds(config_.timeout_ms)});
        group = listener->groups.end() - 1;
      }
      if (group->stream_count != hello.stream_count || group->fds[hello.stream_index] != -1) {
        rejected = "inconsistent stream numbering";
      } else {
        group->fds[hello.stream_index] = fd;
        ++group->arrived;
        continue;
      }
    }
    Log(LogLevel::kWarning, "HARP: rejected an incoming connection: " + rejected);
    close(fd);
  }
  for (size_t g = 0; g < listener->groups.size(); ++g) {
    ListenSocket::Group& group = listener->groups[g];
    if (group.arrived != group.stream_count + 1) {
      if (now > group.deadline) {
        Log(LogLevel::kWarning,
            "HARP: dropped a connection whose streams did not all arrive "
            "within HARP_TIMEOUT_MS");
        for (int& fd : group.fds) CloseFd(&fd);
        listener->groups.erase(listener->groups.begin() + g);
        --g;
      }
      continue;
    }
    uint8_t ack[kAckBytes];
    EncodeAck(listener->nonce, ack);
    ssize_t sent = send(group.fds[0], ack, kAckBytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    std::vector<int> fds = std::move(group.fds);
    listener->groups.erase(listener->groups.begin() + g);
    if (sent != static_cast<ssize_t>(kAckBytes)) {
      // A fresh socket always has room for 16 bytes: the connector is already gone.
      for (int& fd : fds) CloseFd(&fd);
      Log(LogLevel::kWarning, "HARP: accept: the connector went away during set-up");
      return Status::kOk;
    }
    auto* connection = new ReceiveConnection(fds[0], std::vector<int>(fds.begin() + 1, fds.end()));
    Attach(connection);
    *out = connection;
    return Status::kOk;
  }
  return Status::kOk;
}

void Transport::CloseListen(ListenSocket* listener) { delete listener; }

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
