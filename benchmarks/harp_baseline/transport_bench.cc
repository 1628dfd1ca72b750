// The two processes of benchmarks/harp_transport.py: dlopens an NCCL network plugin and drives its
// ncclNetPlugin_v8 table as NCCL's proxy thread does (init, listen, handle to the peer,
// non-blocking connect/accept loop, regMr, isend/irecv retried on a NULL request, test polling in
// posting order, yielding when a pass moved nothing, as NCCL's proxy does, close). Benchmark code,
// not product code.
//
//   transport_bench PLUGIN ROLE DIR SIZES TARGET_BYTES MIN_ITERS LATENCY_ITERS VERIFY_MESSAGES
//                   CHANNELS
//   ROLE: "send" (sends the data) or "recv" (receives and checks it). Each side listens and
//     connects, so that each has a connection to the other (the link: the receiver's "ready",
//     the size announcements and the latency ping-pongs).
//   DIR: rendezvous folder; each side writes its handle to DIR/ROLE.handle and reads the other's.
//   SIZES: message sizes in bytes, comma-separated.
//   TARGET_BYTES: bytes per size in the timed pass (at least MIN_ITERS messages).
//   CHANNELS: data connections from the sender to the receiver, as NCCL's channels: each message
//     is cut into CHANNELS equal parts, one per connection, all progressed by this one thread.
//
// Pipelining as NCCL's: each channel's part of P bytes goes as chunks of
// min(P, clamp(P/8, 512 KiB, 4 MiB)) bytes, with up to 8 chunks outstanding per channel (isend on
// one side, irecv on the other) from a registered staging buffer of 8 slots per channel. First a
// verification pass (VERIFY_MESSAGES messages per size, every byte and every reported size checked,
// receives posted larger than the chunk), then the timed pass per size: the receiver posts its
// window, sends "ready" and starts its clock; the sender starts on "ready". Then LATENCY_ITERS
// 8-byte ping-pongs (each reply checked).
//
// Prints one JSON object per line (the script merges the two processes' lines):
//   {"kind":"verify","size":S,"messages":M,"bytes":B}                   (receiver)
//   {"kind":"timed","role":R,"size":S,"messages":M,"bytes":B,"seconds":T,"cpu_s":C,
//    "driver_cpu_s":D,"sleeps":W}  (C: every thread of the process; D: this driving thread alone,
//                           the part NCCL's proxy thread would spend; C - D: the plugin's own
//                           threads; W: the process's voluntary context switches, i.e. how often
//                           its threads slept and were woken)
//   {"kind":"latency","iters":N,"rtt_us":[...sorted...]}               (sender)
//   {"kind":"done","role":R,"verified_bytes":V}
// and "FAILED: ..." with exit status 1 on any error (a watchdog alarm bounds the whole run).
#include <dlfcn.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/harp/core/nccl_net_abi.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWindow = 8;  // outstanding chunks, as NCCL_STEPS
constexpr size_t kMinChunk = 512 << 10;
constexpr size_t kMaxChunk = 4 << 20;
constexpr size_t kVerifySlack = 4096;  // receives posted larger than the chunk in the check pass

const ncclNet_v8_t* net = nullptr;
bool sender = false;

[[noreturn]] void Die(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fprintf(stdout, "FAILED (%s): ", sender ? "send" : "recv");
  std::vfprintf(stdout, format, args);
  std::fprintf(stdout, "\n");
  std::fflush(stdout);
  va_end(args);
  _exit(1);
}

void Logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* format, ...) {
  if (level != NCCL_LOG_WARN) return;
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "plugin warning: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

void Check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) Die("%s returned %d", what, static_cast<int>(result));
}

// Every thread of the process, the plugin's workers included: CPU time, and how often a thread
// went to sleep (voluntary context switches).
struct ProcessUsage {
  double cpu_s = 0;
  long sleeps = 0;
};

ProcessUsage Usage() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return {usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
              (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6,
          usage.ru_nvcsw};
}

double DriverCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

size_t ChunkBytes(size_t message) {
  return std::min(message, std::min(kMaxChunk, std::max(kMinChunk, message / kWindow)));
}

// The expected bytes of chunk `chunk` of the check pass: 8-byte words of a mixed counter.
uint64_t PatternWord(uint64_t seed, uint64_t word) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + word;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return x;
}

void Fill(uint8_t* data, size_t size, uint64_t seed) {
  size_t words = size / 8;
  uint64_t* w = reinterpret_cast<uint64_t*>(data);
  for (size_t i = 0; i < words; ++i) w[i] = PatternWord(seed, i);
  uint64_t last = PatternWord(seed, words);
  std::memcpy(data + words * 8, &last, size - words * 8);
}

bool Matches(const uint8_t* data, size_t size, uint64_t seed) {
  size_t words = size / 8;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(data);
  for (size_t i = 0; i < words; ++i) {
    if (w[i] != PatternWord(seed, i)) return false;
  }
  uint64_t last = PatternWord(seed, words);
  return std::memcmp(data + words * 8, &last, size - words * 8) == 0;
}

struct Link {
  void* send_comm = nullptr;  // to the peer
  void* recv_comm = nullptr;  // from the peer
  // A small registered buffer for control messages and ping-pongs.
  uint64_t small_out = 0, small_in = 0;
  void* small_out_mh = nullptr;
  void* small_in_mh = nullptr;
};

void WriteHandle(const std::string& dir, const char* role, const uint8_t* handle) {
  std::string path = dir + "/" + role + ".handle", tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr ||
      std::fwrite(handle, 1, NCCL_NET_HANDLE_MAXSIZE, f) != NCCL_NET_HANDLE_MAXSIZE ||
      std::fclose(f) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    Die("cannot write %s", path.c_str());
  }
}

void ReadHandle(const std::string& dir, const char* role, uint8_t* handle) {
  std::string path = dir + "/" + role + ".handle";
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (true) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f != nullptr) {
      size_t n = std::fread(handle, 1, NCCL_NET_HANDLE_MAXSIZE, f);
      std::fclose(f);
      if (n == NCCL_NET_HANDLE_MAXSIZE) return;
    }
    if (Clock::now() > deadline) Die("no peer handle at %s", path.c_str());
    usleep(2000);
  }
}

// Blocks (polling) until the request is done; returns the size test() reported.
int Wait(void* request, const char* what) {
  while (true) {
    int done = 0, size = -1;
    Check(net->test(request, &done, &size), what);
    if (done) return size;
    sched_yield();
  }
}

void* PostSend(void* comm, void* data, int size, void* mh) {
  void* request = nullptr;
  while (request == nullptr) {
    Check(net->isend(comm, data, size, 1, mh, &request), "isend");
    if (request == nullptr) sched_yield();
  }
  return request;
}

void* PostRecv(void* comm, void* data, int size, void* mh) {
  void* request = nullptr;
  int tag = 1;
  while (request == nullptr) {
    Check(net->irecv(comm, 1, &data, &size, &tag, &mh, &request), "irecv");
    if (request == nullptr) sched_yield();
  }
  return request;
}

void SendSmall(Link* link, uint64_t value) {
  link->small_out = value;
  Wait(PostSend(link->send_comm, &link->small_out, 8, link->small_out_mh), "test (small send)");
}

uint64_t ReceiveSmall(Link* link) {
  void* request = PostRecv(link->recv_comm, &link->small_in, 8, link->small_in_mh);
  if (Wait(request, "test (small receive)") != 8) Die("small message of the wrong size");
  return link->small_in;
}

// One data connection (an NCCL channel) and its staging buffer of kWindow slots.
struct Channel {
  void* comm = nullptr;
  std::vector<uint8_t> bytes;
  void* mh = nullptr;
  size_t slot_bytes = 0;
  uint8_t* slot(int i) { return bytes.data() + i * slot_bytes; }
};

// Channel c's part of a message of `size` bytes over `channels` channels (equal, to a byte).
size_t PartBytes(size_t size, size_t c, size_t channels) {
  return size * (c + 1) / channels - size * c / channels;
}

// Moves `messages` messages of `size` bytes from the sender to the receiver, each channel carrying
// its part through its own window, the channels progressed in turn by this thread (as NCCL's proxy
// thread does). With `verify`, every chunk is filled (sender) and checked (receiver) with its own
// seed.
void Pipeline(std::vector<Channel>* channels, size_t size, int messages, bool verify,
              uint64_t* verified) {
  struct Slot {
    void* request = nullptr;
    size_t index = 0;
  };
  struct State {
    size_t part = 0, chunk = 0, chunks_per_message = 0, total = 0;
    size_t posted = 0, completed = 0;
    int head = 0, in_flight = 0;  // the ring of slots is used in posting order: oldest at head
    Slot slots[kWindow];
    size_t chunk_size(size_t index) const {
      return std::min(chunk, part - (index % chunks_per_message) * chunk);
    }
  };
  const size_t count = channels->size();
  std::vector<State> states(count);
  auto seed = [&](size_t c, size_t index) { return (index + (c << 40)) * 1000003 + size; };
  auto post = [&](size_t c, int s) {
    Channel& channel = (*channels)[c];
    State& state = states[c];
    Slot& slot = state.slots[s];
    slot.index = state.posted++;
    size_t bytes = state.chunk_size(slot.index);
    uint8_t* data = channel.slot(s);
    if (sender) {
      if (verify) Fill(data, bytes, seed(c, slot.index));
      slot.request = PostSend(channel.comm, data, static_cast<int>(bytes), channel.mh);
    } else {
      int capacity = static_cast<int>(verify ? bytes + kVerifySlack : bytes);
      slot.request = PostRecv(channel.comm, data, capacity, channel.mh);
    }
  };
  size_t remaining = 0;
  for (size_t c = 0; c < count; ++c) {
    State& state = states[c];
    state.part = PartBytes(size, c, count);
    state.chunk = ChunkBytes(state.part);
    state.chunks_per_message = state.part == 0 ? 1 : (state.part + state.chunk - 1) / state.chunk;
    state.total = state.chunks_per_message * messages;
    remaining += state.total;
    while (state.in_flight < kWindow && state.posted < state.total) {
      post(c, (state.head + state.in_flight) % kWindow);
      ++state.in_flight;
    }
  }
  while (remaining > 0) {
    bool moved = false;
    for (size_t c = 0; c < count; ++c) {
      State& state = states[c];
      if (state.completed == state.total) continue;
      // Test the oldest outstanding chunk (NCCL's proxy tests in order); repost its slot when done.
      Slot& slot = state.slots[state.head];
      int done = 0, reported = -1;
      Check(net->test(slot.request, &done, &reported), sender ? "test (send)" : "test (receive)");
      if (!done) continue;
      size_t bytes = state.chunk_size(slot.index);
      if (static_cast<size_t>(reported) != bytes) {
        Die("channel %zu, chunk %zu of %zu-byte messages: test reported %d bytes, expected %zu", c,
            slot.index, size, reported, bytes);
      }
      if (verify && !sender) {
        if (!Matches((*channels)[c].slot(state.head), bytes, seed(c, slot.index))) {
          Die("channel %zu, chunk %zu of %zu-byte messages: the bytes differ", c, slot.index, size);
        }
        *verified += bytes;
      }
      ++state.completed;
      --remaining;
      --state.in_flight;
      int reuse = state.head;
      state.head = (state.head + 1) % kWindow;
      if (state.posted < state.total) {
        // Slot `reuse` becomes the newest: keep the ring in posting order.
        post(c, reuse);
        ++state.in_flight;
      }
      moved = true;
    }
    if (!moved) sched_yield();
  }
}

std::vector<size_t> ParseSizes(const char* text) {
  std::vector<size_t> sizes;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    sizes.push_back(std::strtoull(p, &end, 10));
    if (end == p) Die("bad sizes %s", text);
    p = *end == ',' ? end + 1 : end;
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: transport_bench PLUGIN send|recv DIR SIZES TARGET_BYTES MIN_ITERS "
                 "LATENCY_ITERS VERIFY_MESSAGES CHANNELS\n");
    return 2;
  }
  const std::string role = argv[2], dir = argv[3];
  sender = role == "send";
  if (!sender && role != "recv") Die("role must be send or recv");
  const std::vector<size_t> sizes = ParseSizes(argv[4]);
  const double target_bytes = std::strtod(argv[5], nullptr);
  const int min_iters = std::atoi(argv[6]);
  const int latency_iters = std::atoi(argv[7]);
  const int verify_messages = std::atoi(argv[8]);
  const int channel_count = std::atoi(argv[9]);
  if (channel_count < 1 || channel_count > 64) Die("CHANNELS must be 1..64");
  alarm(900);  // a hang is a failure, never a stuck benchmark

  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) Die("dlopen: %s", dlerror());
  net = static_cast<const ncclNet_v8_t*>(dlsym(library, "ncclNetPlugin_v8"));
  if (net == nullptr) Die("%s exports no ncclNetPlugin_v8", argv[1]);
  Check(net->init(Logger), "init");
  int devices = 0;
  Check(net->devices(&devices), "devices");
  if (devices < 1) Die("no devices");
  ncclNetProperties_v8_t props;
  std::memset(&props, 0, sizeof(props));
  Check(net->getProperties(0, &props), "getProperties");
  if (!(props.ptrSupport & NCCL_PTR_HOST)) Die("no host pointers");
  std::printf("{\"kind\":\"plugin\",\"role\":\"%s\",\"name\":\"%s\",\"device\":\"%s\"}\n",
              role.c_str(), net->name, props.name ? props.name : "");
  std::fflush(stdout);

  // Listen, publish the handle, then connect to the peer's and accept from it, interleaved.
  uint8_t own[NCCL_NET_HANDLE_MAXSIZE] = {}, peer[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listener = nullptr;
  Check(net->listen(0, own, &listener), "listen");
  WriteHandle(dir, role.c_str(), own);
  ReadHandle(dir, sender ? "recv" : "send", peer);
  Link link;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (link.send_comm == nullptr || link.recv_comm == nullptr) {
    ncclNetDeviceHandle_t* device = nullptr;
    if (link.send_comm == nullptr)
      Check(net->connect(0, peer, &link.send_comm, &device), "connect");
    if (link.recv_comm == nullptr) Check(net->accept(listener, &link.recv_comm, &device), "accept");
    if (Clock::now() > deadline) Die("connect/accept did not finish within 60 s");
    sched_yield();
  }
  Check(net->regMr(link.send_comm, &link.small_out, 8, NCCL_PTR_HOST, &link.small_out_mh), "regMr");
  Check(net->regMr(link.recv_comm, &link.small_in, 8, NCCL_PTR_HOST, &link.small_in_mh), "regMr");

  // The data connections, sender to receiver, one at a time: the sender connects channel c only
  // after the receiver said (on the link) that it accepted c - 1, so both sides number them alike.
  size_t largest_chunk = 0;
  for (size_t size : sizes) {
    for (int c = 0; c < channel_count; ++c) {
      largest_chunk = std::max(largest_chunk, ChunkBytes(PartBytes(size, c, channel_count)));
    }
  }
  std::vector<Channel> channels(channel_count);
  for (int c = 0; c < channel_count; ++c) {
    Channel& channel = channels[c];
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    std::memcpy(handle, peer, sizeof(handle));  // NCCL hands each connection a copy of its own
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (channel.comm == nullptr) {
      ncclNetDeviceHandle_t* device = nullptr;
      if (sender) {
        Check(net->connect(0, handle, &channel.comm, &device), "connect (channel)");
      } else {
        Check(net->accept(listener, &channel.comm, &device), "accept (channel)");
      }
      if (Clock::now() > deadline) Die("channel %d: connect/accept did not finish in 60 s", c);
      if (channel.comm == nullptr) sched_yield();
    }
    if (sender) {
      if (ReceiveSmall(&link) != static_cast<uint64_t>(c)) Die("channel %d: out of step", c);
    } else {
      SendSmall(&link, c);
    }
    channel.slot_bytes = largest_chunk + kVerifySlack;
    channel.bytes.assign(channel.slot_bytes * kWindow, 0x5a);
    Check(net->regMr(channel.comm, channel.bytes.data(), channel.bytes.size(), NCCL_PTR_HOST,
                     &channel.mh),
          "regMr");
  }
  Check(net->closeListen(listener), "closeListen");

  // 1. The check pass.
  uint64_t verified = 0;
  for (size_t size : sizes) {
    if (sender) {
      ReceiveSmall(&link);  // the receiver's window is posted
    } else {
      SendSmall(&link, size);
    }
    Pipeline(&channels, size, verify_messages, true, &verified);
    if (!sender) {
      std::printf("{\"kind\":\"verify\",\"size\":%zu,\"messages\":%d,\"bytes\":%zu}\n", size,
                  verify_messages, size * verify_messages);
      std::fflush(stdout);
    }
  }

  // 2. The timed pass. The staging buffers keep the pattern of the check pass (never refilled).
  for (size_t size : sizes) {
    int messages =
        std::max<int>(min_iters, static_cast<int>(target_bytes / std::max<size_t>(size, 1)));
    if (sender) ReceiveSmall(&link);
    const Clock::time_point start = Clock::now();
    const ProcessUsage usage_start = Usage();
    const double driver_cpu_start = DriverCpuSeconds();
    if (!sender) SendSmall(&link, size);
    uint64_t unused = 0;
    Pipeline(&channels, size, messages, false, &unused);
    const double seconds = Seconds(start, Clock::now());
    const double driver_cpu = DriverCpuSeconds() - driver_cpu_start;
    const ProcessUsage usage_end = Usage();
    const double cpu = usage_end.cpu_s - usage_start.cpu_s;
    const long sleeps = usage_end.sleeps - usage_start.sleeps;
    std::printf(
        "{\"kind\":\"timed\",\"role\":\"%s\",\"size\":%zu,\"messages\":%d,\"bytes\":%zu,"
        "\"seconds\":%.6f,\"cpu_s\":%.6f,\"driver_cpu_s\":%.6f,\"sleeps\":%ld}\n",
        role.c_str(), size, messages, size * messages, seconds, cpu, driver_cpu, sleeps);
    std::fflush(stdout);
  }

  // 3. 8-byte ping-pong: the sender sends, the receiver replies with the value + 1.
  if (sender) {
    std::vector<double> rtt;
    for (int i = -20; i < latency_iters; ++i) {
      uint64_t value = 0x1000 + i;
      auto t0 = Clock::now();
      void* reply = PostRecv(link.recv_comm, &link.small_in, 8, link.small_in_mh);
      link.small_out = value;
      void* request = PostSend(link.send_comm, &link.small_out, 8, link.small_out_mh);
      bool sent = false, received = false;
      while (!sent || !received) {
        int done = 0, size = 0;
        if (!sent) {
          Check(net->test(request, &done, &size), "test (ping)");
          sent = done;
        }
        if (!received) {
          Check(net->test(reply, &done, &size), "test (pong)");
          if (done && size != 8) Die("pong of %d bytes", size);
          received = done;
        }
        if (!sent || !received) sched_yield();
      }
      auto t1 = Clock::now();
      if (link.small_in != value + 1)
        Die("pong %llu for ping %llu", (unsigned long long)link.small_in,
            (unsigned long long)value);
      verified += 8;
      if (i >= 0) rtt.push_back(Seconds(t0, t1) * 1e6);
    }
    std::sort(rtt.begin(), rtt.end());
    std::printf("{\"kind\":\"latency\",\"iters\":%d,\"rtt_us\":[", latency_iters);
    for (size_t i = 0; i < rtt.size(); ++i) std::printf("%s%.2f", i ? "," : "", rtt[i]);
    std::printf("]}\n");
  } else {
    for (int i = -20; i < latency_iters; ++i) {
      void* request = PostRecv(link.recv_comm, &link.small_in, 8, link.small_in_mh);
      while (true) {
        int done = 0, size = 0;
        Check(net->test(request, &done, &size), "test (ping)");
        if (done) {
          if (size != 8) Die("ping of %d bytes", size);
          break;
        }
        sched_yield();
      }
      if (link.small_in != static_cast<uint64_t>(0x1000 + i)) Die("ping out of order");
      verified += 8;
      link.small_out = link.small_in + 1;
      void* reply = PostSend(link.send_comm, &link.small_out, 8, link.small_out_mh);
      while (true) {
        int done = 0, size = 0;
        Check(net->test(reply, &done, &size), "test (pong)");
        if (done) break;
        sched_yield();
      }
    }
  }
  // A last exchange, so that neither side closes while the other still reads.
  if (sender) {
    SendSmall(&link, 0xd0e);
    ReceiveSmall(&link);
  } else {
    ReceiveSmall(&link);
    SendSmall(&link, 0xd0e);
  }
  for (Channel& channel : channels) {
    Check(net->deregMr(channel.comm, channel.mh), "deregMr");
    Check(sender ? net->closeSend(channel.comm) : net->closeRecv(channel.comm), "close (channel)");
  }
  Check(net->deregMr(link.send_comm, link.small_out_mh), "deregMr");
  Check(net->deregMr(link.recv_comm, link.small_in_mh), "deregMr");
  Check(net->closeSend(link.send_comm), "closeSend");
  Check(net->closeRecv(link.recv_comm), "closeRecv");
  std::printf("{\"kind\":\"done\",\"role\":\"%s\",\"verified_bytes\":%llu}\n", role.c_str(),
              static_cast<unsigned long long>(verified));
  std::fflush(stdout);
  return 0;
}
