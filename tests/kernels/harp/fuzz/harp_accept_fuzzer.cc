// libFuzzer harness of HARP's accept side (Transport::Accept, transport_setup.cc): the hellos that
// connectors send a listener, and how the listener groups their sockets into connections, are
// what an untrusted peer controls before any frame. A script of loopback TCP connections to a
// real listener writes hellos (right or stale nonce, few or random connection ids, stream numbers
// in and out of range, cut short or raw bytes), closes sockets and calls Accept, with a set-up
// deadline (HARP_TIMEOUT_MS) short enough for incomplete sets to expire mid-script. Whatever
// arrives: no crash or sanitizer report, and once the accepted connections, the listener and the
// script's sockets are closed, no file descriptor is left open (none lost in a half-built group).
//
// FuzzInput: a script of operations; each a code byte, then its operands.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/wire_format.h"
#include "tests/fuzz/fuzz_input.h"

namespace harp = tf_ext::harp;

namespace {

constexpr int kTimeoutMs = 3;  // set-up deadline: a script's pauses outlast it
constexpr int kMaxSockets = 12;

harp::Transport* SharedTransport() {
  static harp::Transport* transport = [] {
    harp::Config config;
    config.interface = "127.0.0.1";
    config.streams_per_connection = 2;
    config.worker_threads = 1;
    config.timeout_ms = kTimeoutMs;
    std::unique_ptr<harp::Transport> made;
    std::string error;
    CHECK(harp::Transport::Create(config, nullptr, &made, &error) == harp::Status::kOk);
    return made.release();  // lives as long as the process, as the plugin's does
  }();
  return transport;
}

int OpenDescriptors() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  CHECK(dir != nullptr);
  while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count;
}

int ConnectTo(const harp::ListenHandle& handle) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(handle.port);
  address.sin_addr.s_addr = handle.ipv4_address;
  // libFuzzer's -timeout alarm (SIGALRM, installed without SA_RESTART) can interrupt a connect:
  // the connection then completes in the background; wait for it and take its outcome.
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    int error = errno;
    if (error == EINTR) {
      pollfd writable{fd, POLLOUT, 0};
      while (poll(&writable, 1, -1) < 0 && errno == EINTR) {
      }
      socklen_t length = sizeof(error);
      CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0);
    }
    if (error != 0) fprintf(stderr, "connect to the listener failed: %s\n", strerror(error));
    CHECK(error == 0);
  }
  return fd;
}

void RunScript(FuzzInput* in) {
  harp::Transport* transport = SharedTransport();
  uint8_t handle_bytes[128] = {};
  harp::ListenSocket* listener = nullptr;
  CHECK(transport->Listen(handle_bytes, &listener) == harp::Status::kOk);
  harp::ListenHandle handle;
  std::string error;
  CHECK(harp::DecodeHandle(handle_bytes, &handle, &error));

  std::vector<int> sockets;  // the connectors' side; -1 once closed
  std::vector<harp::ReceiveConnection*> accepted;
  for (int op = 0; !in->empty() && op < 64; ++op) {
    const uint8_t code = in->Byte() % 6;
    switch (code) {
      case 0:  // a new connector socket
        if (sockets.size() < kMaxSockets) sockets.push_back(ConnectTo(handle));
        break;
      case 1: {  // a hello, usually well formed, maybe cut short
        if (sockets.empty()) break;
        const int fd = sockets[in->Byte() % sockets.size()];
        if (fd < 0) break;
        const uint8_t shape = in->Byte();
        harp::Hello hello;
        hello.nonce = shape & 1 ? in->Unsigned(8) : handle.nonce;
        hello.connection_id = shape & 2 ? in->Unsigned(8) : in->Byte() % 3;
        hello.stream_count = shape & 4 ? in->Unsigned(2) : 1 + in->Byte() % 3;
        hello.stream_index = shape & 8 ? in->Unsigned(2) : in->Byte() % 4;
        uint8_t bytes[harp::kHelloBytes];
        harp::EncodeHello(hello, bytes);
        const size_t length = shape & 16 ? in->Byte() % harp::kHelloBytes : sizeof(bytes);
        send(fd, bytes, length, MSG_NOSIGNAL | MSG_DONTWAIT);
        break;
      }
      case 2: {  // raw bytes
        if (sockets.empty()) break;
        const int fd = sockets[in->Byte() % sockets.size()];
        const std::vector<uint8_t> bytes = in->Bytes(in->Byte() % 48);
        if (fd >= 0) send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        break;
      }
      case 3: {  // a connector closes a socket
        if (sockets.empty()) break;
        int& fd = sockets[in->Byte() % sockets.size()];
        if (fd >= 0) close(fd);
        fd = -1;
        break;
      }
      case 4:  // the set-up deadline passes
        std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 1));
        break;
      default: {
        harp::ReceiveConnection* connection = nullptr;
        const harp::Status status = transport->Accept(listener, &connection);
        CHECK(status == harp::Status::kOk || connection == nullptr);
        if (connection != nullptr) accepted.push_back(connection);
      }
    }
  }
  for (harp::ReceiveConnection* connection : accepted) transport->Close(connection);
  transport->CloseListen(listener);
  for (int fd : sockets) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SharedTransport();
  const int before = OpenDescriptors();
  FuzzInput in(data, size);
  RunScript(&in);
  CHECK(OpenDescriptors() == before);  // every socket of the listener and its connections closed
  return 0;
}
