// HARP's transport in one process over loopback: connection set-up that never blocks, messages of
// many sizes with every byte checked, the request limits, grouped receives and tag matching,
// receives larger than sends, bad and stale handles, and a peer closing mid-transfer. Also the
// single-producer/single-consumer ring under two threads (run under TSan by `make sanitize`).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/harp/core/spsc_ring.h"
#include "kernels/harp/core/transport.h"

namespace {

namespace harp = tf_ext::harp;
using harp::ReceiveConnection;
using harp::Request;
using harp::SendConnection;
using harp::Status;
using harp::Transport;
using Clock = std::chrono::steady_clock;

std::vector<std::string>* logged = nullptr;
void Record(harp::LogLevel, const std::string& message) {
  if (logged != nullptr) logged->push_back(message);
}

std::unique_ptr<Transport> MakeTransport(int streams = 3, size_t chunk = 64 * 1024) {
  harp::Config config;
  config.interface = "127.0.0.1";
  config.streams_per_connection = streams;
  config.worker_threads = 2;
  config.chunk_bytes = chunk;
  config.timeout_ms = 5000;
  std::unique_ptr<Transport> transport;
  std::string error;
  EXPECT_EQ(Transport::Create(config, Record, &transport, &error), Status::kOk) << error;
  return transport;
}

struct Pair {
  SendConnection* send = nullptr;
  ReceiveConnection* receive = nullptr;
};

Pair Connect(Transport* transport) {
  uint8_t handle[128];
  harp::ListenSocket* listener = nullptr;
  EXPECT_EQ(transport->Listen(handle, &listener), Status::kOk);
  uint8_t peer_copy[128];
  std::memcpy(peer_copy, handle, sizeof(handle));  // what NCCL's bootstrap hands the peer
  Pair pair;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((pair.send == nullptr || pair.receive == nullptr) && Clock::now() < deadline) {
    if (pair.send == nullptr) {
      EXPECT_EQ(transport->Connect(peer_copy, &pair.send), Status::kOk);
    }
    if (pair.receive == nullptr) {
      EXPECT_EQ(transport->Accept(listener, &pair.receive), Status::kOk);
    }
  }
  transport->CloseListen(listener);
  EXPECT_NE(pair.send, nullptr);
  EXPECT_NE(pair.receive, nullptr);
  return pair;
}

// Polls until done; the status of the first non-OK test, or kOk.
Status Wait(Transport* transport, Request* request, uint64_t* sizes, double seconds = 20) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  bool done = false;
  while (Clock::now() < deadline) {
    Status status = transport->Test(request, &done, sizes);
    if (status != Status::kOk || done) return status;
    std::this_thread::yield();
  }
  ADD_FAILURE() << "request not done within " << seconds << " s";
  return Status::kInternalError;
}

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> bytes(size);
  uint32_t state = seed * 2654435761u + 1;
  for (uint8_t& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<uint8_t>(state >> 24);
  }
  return bytes;
}

TEST(HarpTransportTest, MessagesOfManySizesArriveIntact) {
  auto transport = MakeTransport();
  Pair pair = Connect(transport.get());
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{65536}, size_t{65537},
                      size_t{1} << 20, (size_t{3} << 20) + 7}) {
    std::vector<uint8_t> sent = Pattern(size, static_cast<uint32_t>(size));
    std::vector<uint8_t> received(size + 100, 0xee);  // larger than the message
    Request* send = nullptr;
    Request* receive = nullptr;
    void* data[] = {received.data()};
    uint64_t capacity[] = {received.size()};
    int tags[] = {5};
    ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
    ASSERT_EQ(transport->Send(pair.send, sent.data(), size, 5, &send), Status::kOk);
    uint64_t sizes[8];
    ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    ASSERT_EQ(Wait(transport.get(), receive, sizes), Status::kOk);
    EXPECT_EQ(sizes[0], size);
    EXPECT_TRUE(std::equal(sent.begin(), sent.end(), received.begin())) << size;
    EXPECT_EQ(received[size], 0xee);  // nothing written past the message
  }
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

TEST(HarpTransportTest, RequestLimitsAndOrderedCompletion) {
  auto transport = MakeTransport(2, 4096);
  Pair pair = Connect(transport.get());
  // 32 receives fit, the 33rd is "try again" (null request, OK status).
  std::vector<std::vector<uint8_t>> buffers(harp::kMaxRequests, std::vector<uint8_t>(10000));
  std::vector<Request*> receives;
  for (auto& buffer : buffers) {
    void* data[] = {buffer.data()};
    uint64_t capacity[] = {buffer.size()};
    int tags[] = {0};
    Request* request = nullptr;
    ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &request), Status::kOk);
    ASSERT_NE(request, nullptr);
    receives.push_back(request);
  }
  {
    void* data[] = {buffers[0].data()};
    uint64_t capacity[] = {1};
    int tags[] = {0};
    Request* request = reinterpret_cast<Request*>(1);
    EXPECT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &request), Status::kOk);
    EXPECT_EQ(request, nullptr);
  }
  std::vector<std::vector<uint8_t>> messages;
  std::vector<Request*> sends;
  for (int i = 0; i < harp::kMaxRequests; ++i) {
    messages.push_back(Pattern(1000 + 250 * i, i));
    Request* request = nullptr;
    ASSERT_EQ(
        transport->Send(pair.send, messages.back().data(), messages.back().size(), 0, &request),
        Status::kOk);
    ASSERT_NE(request, nullptr);
    sends.push_back(request);
  }
  uint64_t sizes[8];
  for (int i = 0; i < harp::kMaxRequests; ++i) {
    ASSERT_EQ(Wait(transport.get(), sends[i], sizes), Status::kOk);
    ASSERT_EQ(Wait(transport.get(), receives[i], sizes), Status::kOk);
    EXPECT_EQ(sizes[0], messages[i].size());
    EXPECT_TRUE(std::equal(messages[i].begin(), messages[i].end(), buffers[i].begin())) << i;
  }
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

TEST(HarpTransportTest, GroupedReceiveMatchesTagsInPostingOrder) {
  auto transport = MakeTransport();
  Pair pair = Connect(transport.get());
  std::vector<std::vector<uint8_t>> buffers(3, std::vector<uint8_t>(5000));
  void* data[] = {buffers[0].data(), buffers[1].data(), buffers[2].data()};
  uint64_t capacity[] = {5000, 5000, 5000};
  int tags[] = {7, 8, 9};
  Request* grouped = nullptr;
  ASSERT_EQ(transport->Receive(pair.receive, 3, data, capacity, tags, &grouped), Status::kOk);
  // Sent in another tag order, with different sizes: each lands in its tag's buffer.
  const int send_tags[] = {9, 7, 8};
  const size_t send_sizes[] = {100, 4000, 0};
  std::vector<std::vector<uint8_t>> messages;
  std::vector<Request*> sends;
  for (int i = 0; i < 3; ++i) {
    messages.push_back(Pattern(send_sizes[i], send_tags[i]));
    Request* request = nullptr;
    ASSERT_EQ(transport->Send(pair.send, messages[i].data(), send_sizes[i], send_tags[i], &request),
              Status::kOk);
    sends.push_back(request);
  }
  uint64_t sizes[8];
  for (Request* send : sends) ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
  ASSERT_EQ(Wait(transport.get(), grouped, sizes), Status::kOk);
  EXPECT_EQ(sizes[0], 4000u);
  EXPECT_EQ(sizes[1], 0u);
  EXPECT_EQ(sizes[2], 100u);
  EXPECT_TRUE(std::equal(messages[1].begin(), messages[1].end(), buffers[0].begin()));
  EXPECT_TRUE(std::equal(messages[0].begin(), messages[0].end(), buffers[2].begin()));
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

TEST(HarpTransportTest, SendLargerThanReceiveFailsTheConnection) {
  auto transport = MakeTransport();
  Pair pair = Connect(transport.get());
  std::vector<uint8_t> small(10), big(11);
  void* data[] = {small.data()};
  uint64_t capacity[] = {small.size()};
  int tags[] = {0};
  Request* receive = nullptr;
  Request* send = nullptr;
  ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
  ASSERT_EQ(transport->Send(pair.send, big.data(), big.size(), 0, &send), Status::kOk);
  uint64_t sizes[8];
  EXPECT_EQ(Wait(transport.get(), receive, sizes), Status::kRemote);
  EXPECT_TRUE(pair.receive->failed());
  EXPECT_NE(pair.receive->failure().find("larger than its posted receive"), std::string::npos);
  // Later calls fail at once.
  EXPECT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kRemote);
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

TEST(HarpTransportTest, PeerClosingMidTransferFailsWithinBoundedTime) {
  auto transport = MakeTransport(2, 4096);
  Pair pair = Connect(transport.get());
  // Far more than the kernel buffers of two streams hold (tcp_wmem + tcp_rmem, ~10 MiB each).
  std::vector<uint8_t> sent(64 << 20, 1), received(64 << 20);
  void* data[] = {received.data()};
  uint64_t capacity[] = {received.size()};
  int tags[] = {0};
  Request* receive = nullptr;
  Request* send = nullptr;
  ASSERT_EQ(transport->Send(pair.send, sent.data(), sent.size(), 0, &send), Status::kOk);
  // Without a posted receive most of the message stays in the sender; the close cuts it off.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  transport->Close(pair.send);
  ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
  auto start = Clock::now();
  uint64_t sizes[8];
  EXPECT_EQ(Wait(transport.get(), receive, sizes, 5), Status::kRemote);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  transport->Close(pair.receive);
}

TEST(HarpTransportTest, BadAndStaleHandlesFail) {
  std::vector<std::string> messages;
  logged = &messages;
  auto transport = MakeTransport();
  SendConnection* send = nullptr;
  uint8_t garbage[128];
  for (size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = static_cast<uint8_t>(i * 31 + 7);
  EXPECT_EQ(transport->Connect(garbage, &send), Status::kInvalidArgument);
  EXPECT_EQ(send, nullptr);
  // A handle whose listener is gone: the connection is refused.
  uint8_t handle[128];
  harp::ListenSocket* listener = nullptr;
  ASSERT_EQ(transport->Listen(handle, &listener), Status::kOk);
  transport->CloseListen(listener);
  Status status = Status::kOk;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (status == Status::kOk && send == nullptr && Clock::now() < deadline) {
    status = transport->Connect(handle, &send);
  }
  EXPECT_NE(status, Status::kOk);
  EXPECT_EQ(send, nullptr);
  // A live listener, but a handle with another nonce (an earlier listener's on the same port).
  ASSERT_EQ(transport->Listen(handle, &listener), Status::kOk);
  harp::ListenHandle decoded;
  std::string error;
  ASSERT_TRUE(harp::DecodeHandle(handle, &decoded, &error));
  decoded.nonce ^= 1;
  uint8_t stale[128];
  harp::EncodeHandle(decoded, stale);
  status = Status::kOk;
  ReceiveConnection* receive = nullptr;
  deadline = Clock::now() + std::chrono::seconds(10);
  while (status == Status::kOk && send == nullptr && Clock::now() < deadline) {
    status = transport->Connect(stale, &send);
    EXPECT_EQ(transport->Accept(listener, &receive), Status::kOk);
  }
  EXPECT_EQ(status, Status::kRemote);
  EXPECT_EQ(send, nullptr);
  EXPECT_EQ(receive, nullptr);
  transport->CloseListen(listener);
  logged = nullptr;
  bool named = false;
  for (const std::string& message : messages) named |= message.find("stale") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(HarpTransportTest, ConnectGivesUpAfterTheTimeout) {
  harp::Config config;
  config.interface = "127.0.0.1";
  config.timeout_ms = 300;
  std::unique_ptr<Transport> transport;
  std::string error;
  ASSERT_EQ(Transport::Create(config, Record, &transport, &error), Status::kOk) << error;
  // The listener's kernel completes the TCP handshakes, but nobody calls accept: no ack comes.
  uint8_t handle[128];
  harp::ListenSocket* listener = nullptr;
  ASSERT_EQ(transport->Listen(handle, &listener), Status::kOk);
  SendConnection* send = nullptr;
  Status status = Status::kOk;
  auto start = Clock::now();
  while (status == Status::kOk && Clock::now() - start < std::chrono::seconds(10)) {
    status = transport->Connect(handle, &send);
    ASSERT_EQ(send, nullptr);
  }
  EXPECT_EQ(status, Status::kRemote);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  transport->CloseListen(listener);
}

TEST(HarpTransportTest, ManyConnectionsAtOnce) {
  auto transport = MakeTransport(2, 16384);
  std::vector<Pair> pairs;
  for (int i = 0; i < 8; ++i) pairs.push_back(Connect(transport.get()));
  std::vector<std::vector<uint8_t>> sent, received;
  std::vector<Request*> requests;
  for (size_t i = 0; i < pairs.size(); ++i) {
    sent.push_back(Pattern(300000 + i, static_cast<uint32_t>(i)));
    received.emplace_back(sent.back().size());
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    void* data[] = {received[i].data()};
    uint64_t capacity[] = {received[i].size()};
    int tags[] = {1};
    Request* receive = nullptr;
    Request* send = nullptr;
    ASSERT_EQ(transport->Receive(pairs[i].receive, 1, data, capacity, tags, &receive), Status::kOk);
    ASSERT_EQ(transport->Send(pairs[i].send, sent[i].data(), sent[i].size(), 1, &send),
              Status::kOk);
    requests.push_back(send);
    requests.push_back(receive);
  }
  uint64_t sizes[8];
  for (Request* request : requests) ASSERT_EQ(Wait(transport.get(), request, sizes), Status::kOk);
  for (size_t i = 0; i < pairs.size(); ++i) {
    EXPECT_EQ(sent[i], received[i]) << i;
    transport->Close(pairs[i].send);
    transport->Close(pairs[i].receive);
  }
}

// NCCL opens a send and a receive connection per channel; each direction's copying should get a
// core of its own, whatever order the connections are made in.
TEST(HarpTransportTest, SendsAndReceivesSpreadOverTheWorkersSeparately) {
  EXPECT_EQ(Transport::WorkerFor(true, 0, 4), 0u);
  EXPECT_EQ(Transport::WorkerFor(true, 5, 4), 1u);
  EXPECT_EQ(Transport::WorkerFor(false, 0, 4), 2u);
  EXPECT_EQ(Transport::WorkerFor(false, 3, 4), 1u);
  EXPECT_EQ(Transport::WorkerFor(false, 0, 1), 0u);
  // Two workers (the default), two channels set up as send, receive, send, receive: one turn for
  // all would give both sends to one worker.
  auto transport = MakeTransport();
  Pair first = Connect(transport.get()), second = Connect(transport.get());
  EXPECT_NE(transport->WorkerIndex(first.send), transport->WorkerIndex(first.receive));
  EXPECT_EQ(
      (std::set<int>{transport->WorkerIndex(first.send), transport->WorkerIndex(second.send)}),
      (std::set<int>{0, 1}));
  EXPECT_EQ((std::set<int>{transport->WorkerIndex(first.receive),
                           transport->WorkerIndex(second.receive)}),
            (std::set<int>{0, 1}));
  for (Pair* pair : {&first, &second}) {
    transport->Close(pair->send);
    transport->Close(pair->receive);
  }
}

// NCCL's proxy thread spins on test() whatever the transport; HARP_CALLER_CONNECTIONS busy
// connections it drives itself, the rest stay with the workers. A claimed connection must still
// move when the caller stops testing it (the worker's pass once per poll period), and closing it
// frees its claim for the next busy connection.
TEST(HarpTransportTest, TheCallerClaimsItsFirstBusyConnectionsOnly) {
  auto transport = MakeTransport(2, 64 * 1024);  // HARP_CALLER_CONNECTIONS: the default, 1
  ASSERT_EQ(transport->config().caller_connections, 1);
  Pair first = Connect(transport.get()), second = Connect(transport.get());
  uint64_t sizes[8];
  auto transfer = [&](Pair* pair, size_t size, uint32_t seed, bool test_the_send) {
    std::vector<uint8_t> sent = Pattern(size, seed), received(size);
    void* data[] = {received.data()};
    uint64_t capacity[] = {size};
    int tags[] = {1};
    Request* receive = nullptr;
    Request* send = nullptr;
    if (test_the_send) {
      ASSERT_EQ(transport->Receive(pair->receive, 1, data, capacity, tags, &receive), Status::kOk);
      ASSERT_EQ(transport->Send(pair->send, sent.data(), size, 1, &send), Status::kOk);
    } else {
      // The send first: its pass fills the socket buffers (nothing is received before the
      // receive is posted) and returns; from then on, with no test of the send, only the
      // worker's once-per-period passes move its bytes.
      ASSERT_EQ(transport->Send(pair->send, sent.data(), size, 1, &send), Status::kOk);
      ASSERT_EQ(transport->Receive(pair->receive, 1, data, capacity, tags, &receive), Status::kOk);
    }
    if (test_the_send) {
      ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    }
    ASSERT_EQ(Wait(transport.get(), receive, sizes), Status::kOk);
    if (!test_the_send) {
      ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    }
    EXPECT_EQ(sent, received);
  };
  transfer(&first, 1000, 1, true);  // small: nothing claimed
  EXPECT_FALSE(first.send->caller_claimed());
  transfer(&first, 4 << 20, 2, true);
  EXPECT_TRUE(first.send->caller_claimed());
  EXPECT_FALSE(first.receive->caller_claimed());  // one claim in all
  transfer(&second, 4 << 20, 3, true);
  EXPECT_FALSE(second.send->caller_claimed());
  transfer(&first, 32 << 20, 4, false);  // the claimed send, not tested until its receive is done
  transport->Close(first.send);
  transport->Close(first.receive);
  // The claim is free again: the second pair's receive (posted first) or send takes it.
  transfer(&second, 4 << 20, 5, true);
  EXPECT_TRUE(second.send->caller_claimed() || second.receive->caller_claimed());
  transport->Close(second.send);
  transport->Close(second.receive);

  harp::Config config = transport->config();
  config.caller_connections = 0;
  std::unique_ptr<Transport> unclaimed;
  std::string error;
  ASSERT_EQ(Transport::Create(config, Record, &unclaimed, &error), Status::kOk) << error;
  transport = std::move(unclaimed);
  Pair third = Connect(transport.get());
  transfer(&third, 4 << 20, 6, true);
  EXPECT_FALSE(third.send->caller_claimed() || third.receive->caller_claimed());
  transport->Close(third.send);
  transport->Close(third.receive);
}

TEST(HarpTransportTest, UnknownInterfaceIsRejected) {
  harp::Config config;
  config.interface = "no-such-if0";
  std::unique_ptr<Transport> transport;
  std::string error;
  EXPECT_EQ(Transport::Create(config, nullptr, &transport, &error), Status::kInvalidUsage);
  EXPECT_NE(error.find("HARP_IFNAME='no-such-if0' is invalid"), std::string::npos) << error;
  config.interface = "lo";
  EXPECT_EQ(Transport::Create(config, nullptr, &transport, &error), Status::kOk) << error;
  EXPECT_EQ(transport->address(), "127.0.0.1");
  config.interface = "";
  config.cpu_affinity = {100000};
  EXPECT_EQ(Transport::Create(config, nullptr, &transport, &error), Status::kInvalidUsage);
  EXPECT_NE(error.find("HARP_CPU_AFFINITY"), std::string::npos) << error;
}

TEST(HarpTransportTest, PinnedWorkersAndSendLimit) {
  harp::Config config;
  config.interface = "127.0.0.1";
  config.worker_threads = 3;
  config.cpu_affinity = {0};  // every worker on CPU 0
  config.streams_per_connection = 1;
  std::unique_ptr<Transport> transport;
  std::string error;
  ASSERT_EQ(Transport::Create(config, Record, &transport, &error), Status::kOk) << error;
  Pair pair = Connect(transport.get());
  // The send side takes 32 * maxRecvs requests before asking to try again.
  std::vector<uint8_t> byte(1, 7);
  std::vector<Request*> sends;
  for (int i = 0; i <= harp::kSendRequests; ++i) {
    Request* request = nullptr;
    ASSERT_EQ(transport->Send(pair.send, byte.data(), 1, 0, &request), Status::kOk);
    if (i < harp::kSendRequests) {
      ASSERT_NE(request, nullptr) << i;
      sends.push_back(request);
    } else {
      EXPECT_EQ(request, nullptr);
    }
  }
  // Received one at a time, 32 posted at most.
  std::vector<uint8_t> buffer(harp::kSendRequests, 0);
  uint64_t sizes[8];
  for (int first = 0; first < harp::kSendRequests; first += harp::kMaxRequests) {
    std::vector<Request*> receives;
    for (int i = first; i < first + harp::kMaxRequests; ++i) {
      void* data[] = {&buffer[i]};
      uint64_t capacity[] = {1};
      int tags[] = {0};
      Request* request = nullptr;
      ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &request), Status::kOk);
      ASSERT_NE(request, nullptr);
      receives.push_back(request);
    }
    for (Request* request : receives) {
      ASSERT_EQ(Wait(transport.get(), request, sizes), Status::kOk);
    }
  }
  for (Request* request : sends) ASSERT_EQ(Wait(transport.get(), request, sizes), Status::kOk);
  EXPECT_EQ(buffer, std::vector<uint8_t>(harp::kSendRequests, 7));
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

// The small-message fast path (kInlineBytes): a sender thread and a receiver thread, as NCCL's
// proxies on two ranks, with small messages (driven by the caller's own thread) interleaved with
// large ones (driven by the workers), so that connections pass back and forth between the two
// while requests are in flight. Every size, every byte and the order are checked, and nothing is
// written past a message. Under TSan (`make sanitize`) this checks the ownership handshake.
TEST(HarpTransportTest, SmallMessagesInterleavedWithLargeOnesKeepOrder) {
  auto transport = MakeTransport(3, 64 * 1024);
  Pair pair = Connect(transport.get());
  constexpr int kMessages = 400;
  constexpr int kWindow = 8;
  const uint64_t inline_bytes = harp::kInlineBytes;
  auto size_of = [&](int i) -> size_t {
    switch (i % 10) {
      case 3:
        return 100000 + (static_cast<size_t>(i) * 7919) % 500000;  // large: the worker's
      case 7:
        return inline_bytes + 1;  // just above the fast path's bound
      case 8:
        return inline_bytes;  // just at it
      case 9:
        return 0;
      default:
        return 1 + (static_cast<size_t>(i) * 131) % 4000;
    }
  };
  // Receives: exactly the message, or somewhat larger (sometimes larger than kInlineBytes for a
  // small message: the receiving side goes by the messages' sizes, not the buffers').
  auto capacity_of = [&](int i) -> size_t {
    return size_of(i) + (i % 3 == 0 ? 0 : 9000 * (i % 3));
  };
  std::thread receiver([&] {
    std::vector<std::vector<uint8_t>> buffers(kWindow);
    std::vector<Request*> window(kWindow, nullptr);
    int posted = 0, checked = 0;
    while (checked < kMessages) {
      while (posted < kMessages && posted - checked < kWindow) {
        const int slot = posted % kWindow;
        buffers[slot].assign(capacity_of(posted) + 1, 0xee);  // + a guard byte
        void* data[] = {buffers[slot].data()};
        uint64_t capacity[] = {capacity_of(posted)};
        int tags[] = {posted % 3};
        Request* request = nullptr;
        ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &request), Status::kOk);
        if (request == nullptr) break;
        window[slot] = request;
        ++posted;
      }
      const int slot = checked % kWindow;
      uint64_t sizes[8];
      ASSERT_EQ(Wait(transport.get(), window[slot], sizes), Status::kOk) << checked;
      const size_t size = size_of(checked);
      ASSERT_EQ(sizes[0], size) << checked;
      std::vector<uint8_t> expected = Pattern(size, static_cast<uint32_t>(checked));
      ASSERT_TRUE(std::equal(expected.begin(), expected.end(), buffers[slot].begin())) << checked;
      ASSERT_TRUE(std::all_of(buffers[slot].begin() + size, buffers[slot].end(), [](uint8_t byte) {
        return byte == 0xee;
      })) << checked;
      ++checked;
    }
  });
  {
    std::vector<std::vector<uint8_t>> messages(kWindow);
    std::vector<Request*> window(kWindow, nullptr);
    int posted = 0, done = 0;
    while (done < kMessages) {
      while (posted < kMessages && posted - done < kWindow) {
        const int slot = posted % kWindow;
        messages[slot] = Pattern(size_of(posted), static_cast<uint32_t>(posted));
        Request* request = nullptr;
        ASSERT_EQ(transport->Send(pair.send, messages[slot].data(), messages[slot].size(),
                                  posted % 3, &request),
                  Status::kOk);
        if (request == nullptr) break;
        window[slot] = request;
        ++posted;
      }
      uint64_t sizes[8];
      ASSERT_EQ(Wait(transport.get(), window[done % kWindow], sizes), Status::kOk) << done;
      ++done;
    }
  }
  receiver.join();
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

// A receiving connection the caller drives (only small messages so far) whose posted receive the
// caller does not test while it waits for the matching send, far larger than the kernel's socket
// buffers: the worker gives such a connection a pass once per poll period, so the send completes.
TEST(HarpTransportTest, UntestedReceiveOfACallerDrivenConnectionStillDrains) {
  auto transport = MakeTransport(2, 64 * 1024);
  Pair pair = Connect(transport.get());
  uint64_t sizes[8];
  uint8_t small_out = 7, small_in = 0;
  {
    void* data[] = {&small_in};
    uint64_t capacity[] = {1};
    int tags[] = {0};
    Request* receive = nullptr;
    Request* send = nullptr;
    ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
    ASSERT_EQ(transport->Send(pair.send, &small_out, 1, 0, &send), Status::kOk);
    ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    ASSERT_EQ(Wait(transport.get(), receive, sizes), Status::kOk);
    ASSERT_EQ(small_in, 7);
  }
  std::vector<uint8_t> sent = Pattern(48 << 20, 3), received(48 << 20);
  void* data[] = {received.data()};
  uint64_t capacity[] = {received.size()};
  int tags[] = {0};
  Request* receive = nullptr;
  Request* send = nullptr;
  ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
  ASSERT_EQ(transport->Send(pair.send, sent.data(), sent.size(), 0, &send), Status::kOk);
  ASSERT_EQ(Wait(transport.get(), send, sizes, 4), Status::kOk);  // under HARP_TIMEOUT_MS
  ASSERT_EQ(Wait(transport.get(), receive, sizes), Status::kOk);
  EXPECT_EQ(sizes[0], sent.size());
  EXPECT_TRUE(sent == received);
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

// 8-byte ping-pong over two connections (one each way), each side in its own thread: the
// benchmark's latency pattern, with every reply checked.
TEST(HarpTransportTest, SmallPingPongBetweenTwoThreads) {
  auto transport = MakeTransport();
  Pair forward = Connect(transport.get());
  Pair backward = Connect(transport.get());
  constexpr int kRounds = 500;
  std::thread echo([&] {
    uint64_t in = 0, out = 0;
    for (int i = 0; i < kRounds; ++i) {
      void* data[] = {&in};
      uint64_t capacity[] = {sizeof(in)};
      int tags[] = {1};
      Request* receive = nullptr;
      while (receive == nullptr) {
        ASSERT_EQ(transport->Receive(forward.receive, 1, data, capacity, tags, &receive),
                  Status::kOk);
      }
      uint64_t sizes[8];
      ASSERT_EQ(Wait(transport.get(), receive, sizes), Status::kOk);
      ASSERT_EQ(sizes[0], sizeof(in));
      ASSERT_EQ(in, 1000u + i);
      out = in + 1;
      Request* send = nullptr;
      while (send == nullptr) {
        ASSERT_EQ(transport->Send(backward.send, &out, sizeof(out), 1, &send), Status::kOk);
      }
      ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    }
  });
  uint64_t ping = 0, pong = 0;
  auto start = Clock::now();
  for (int i = 0; i < kRounds; ++i) {
    void* data[] = {&pong};
    uint64_t capacity[] = {sizeof(pong)};
    int tags[] = {1};
    Request* reply = nullptr;
    ASSERT_EQ(transport->Receive(backward.receive, 1, data, capacity, tags, &reply), Status::kOk);
    ASSERT_NE(reply, nullptr);
    ping = 1000u + i;
    Request* send = nullptr;
    ASSERT_EQ(transport->Send(forward.send, &ping, sizeof(ping), 1, &send), Status::kOk);
    ASSERT_NE(send, nullptr);
    uint64_t sizes[8];
    ASSERT_EQ(Wait(transport.get(), send, sizes), Status::kOk);
    ASSERT_EQ(Wait(transport.get(), reply, sizes), Status::kOk);
    ASSERT_EQ(sizes[0], sizeof(pong));
    ASSERT_EQ(pong, ping + 1);
  }
  const double us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kRounds / 2;
  std::printf("8-byte ping-pong: %.1f us half round trip (informational)\n", us);
  echo.join();
  transport->Close(forward.send);
  transport->Close(forward.receive);
  transport->Close(backward.send);
  transport->Close(backward.receive);
}

// HARP_ZEROCOPY_THRESHOLD: chunks of at least the threshold go with MSG_ZEROCOPY, and a send is
// done only once the kernel released them. The send buffer is overwritten as soon as `test`
// reports a send done, before the receive is even posted: the receiver must still see the old
// bytes. (On loopback the kernel copies at delivery and says so; what is checked is correctness.)
TEST(HarpTransportTest, ZerocopySendsReleaseBuffersOnlyWhenTheKernelIsDone) {
  std::vector<std::string> messages;
  logged = &messages;
  harp::Config config;
  config.interface = "127.0.0.1";
  config.streams_per_connection = 3;
  config.chunk_bytes = 64 * 1024;
  config.zerocopy_threshold = 8192;
  config.timeout_ms = 5000;
  std::unique_ptr<Transport> transport;
  std::string error;
  ASSERT_EQ(Transport::Create(config, Record, &transport, &error), Status::kOk) << error;
  Pair pair = Connect(transport.get());
  // Small (copied, inline), at the threshold, multi-chunk, and larger than the socket buffers.
  const size_t sizes[] = {100,     8191, 8192,          65536,    200000,
                          1 << 20, 5000, (1 << 20) + 3, 8192 * 3, 12 << 20};
  std::vector<uint8_t> buffer, received;
  uint64_t got[8];
  int index = 0;
  for (size_t size : sizes) {
    buffer = Pattern(size, 77 + index);
    const std::vector<uint8_t> expected = buffer;
    received.assign(size, 0);
    void* data[] = {received.data()};
    uint64_t capacity[] = {size};
    int tags[] = {3};
    Request* send = nullptr;
    Request* receive = nullptr;
    ASSERT_EQ(transport->Send(pair.send, buffer.data(), size, 3, &send), Status::kOk);
    ASSERT_NE(send, nullptr);
    // Up to ~200 KB fits in three loopback sockets' buffers without a posted receive.
    const bool fits_in_the_kernel = size <= 200000;
    if (!fits_in_the_kernel) {  // the receive has to run alongside
      ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
    }
    ASSERT_EQ(Wait(transport.get(), send, got), Status::kOk) << size;
    std::fill(buffer.begin(), buffer.end(), 0x5a);  // NCCL reuses the buffer at once
    if (fits_in_the_kernel) {
      ASSERT_EQ(transport->Receive(pair.receive, 1, data, capacity, tags, &receive), Status::kOk);
    }
    ASSERT_EQ(Wait(transport.get(), receive, got), Status::kOk) << size;
    EXPECT_EQ(got[0], size);
    EXPECT_TRUE(received == expected) << size;
    ++index;
  }
  bool fell_back = false;
  for (const std::string& message : messages) {
    fell_back |= message.find("MSG_ZEROCOPY unavailable") != std::string::npos;
  }
  logged = nullptr;
  std::printf("zero-copy sends completed: %llu (copied by the kernel: %llu)%s\n",
              static_cast<unsigned long long>(pair.send->zerocopy_completed()),
              static_cast<unsigned long long>(pair.send->zerocopy_copied()),
              fell_back ? "; SO_ZEROCOPY unavailable here, sends copied" : "");
  EXPECT_TRUE(fell_back || pair.send->zerocopy_completed() > 0);
  transport->Close(pair.send);
  transport->Close(pair.receive);
}

// A steady sender (each message done before the next is posted, as NCCL's proxy posts a step once
// the GPU filled it) spreads its chunks over the streams whose sockets hold the fewest
// unacknowledged bytes, instead of giving all of them to the first stream whose socket buffer takes
// them (which made one capped flow carry everything). Unix socket pairs stand in for the streams:
// their send queue counts what the peer has not read yet, as a capped flow's counts what it has not
// carried.
TEST(HarpTransportTest, SteadySenderSpreadsChunksOverTheLeastQueuedStreams) {
  constexpr int kStreams = 4;
  constexpr size_t kChunk = 16 * 1024;
  int control[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, control), 0);
  std::vector<int> local, peer;
  for (int i = 0; i < kStreams; ++i) {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair), 0);
    local.push_back(pair[0]);
    peer.push_back(pair[1]);
  }
  SendConnection connection(control[0], local, kChunk);
  std::vector<uint8_t> payload = Pattern(kChunk, 7);
  auto send_one = [&](int message) {
    Request* request = nullptr;
    ASSERT_EQ(Transport::PostSend(&connection, payload.data(), payload.size(), 0, &request),
              Status::kOk);
    bool done = false;
    uint64_t sizes[8];
    std::string error;
    for (int pass = 0; pass < 100 && !done; ++pass) {
      connection.Progress();
      ASSERT_EQ(Transport::TestRequest(request, &done, sizes, &error), Status::kOk) << error;
    }
    ASSERT_TRUE(done) << "message " << message;
  };
  // The next chunk on stream `i`, read off its peer end: its message's sequence number.
  auto read_chunk = [&](int i) -> uint64_t {
    uint8_t header[harp::kChunkHeaderBytes];
    EXPECT_EQ(recv(peer[i], header, sizeof(header), MSG_DONTWAIT),
              static_cast<ssize_t>(sizeof(header)))
        << "stream " << i << " carried no chunk";
    harp::ChunkHeader chunk;
    std::string error;
    EXPECT_TRUE(harp::DecodeChunkHeader(header, &chunk, &error)) << error;
    EXPECT_EQ(chunk.length, kChunk);
    std::vector<uint8_t> body(kChunk);
    EXPECT_EQ(recv(peer[i], body.data(), body.size(), MSG_DONTWAIT),
              static_cast<ssize_t>(body.size()));
    EXPECT_TRUE(body == payload) << "stream " << i;
    return chunk.sequence;
  };
  for (int message = 0; message < kStreams; ++message) send_one(message);
  // Stream 2's peer reads its chunk: its socket is now the only empty one, and takes the next
  // message (round-robin alone would give it to stream 0).
  const uint64_t drained = read_chunk(2);
  send_one(kStreams);
  const uint64_t fifth = read_chunk(2);
  std::set<uint64_t> sequences = {drained, fifth};
  for (int i : {0, 1, 3}) sequences.insert(read_chunk(i));
  EXPECT_EQ(sequences.size(), static_cast<size_t>(kStreams) + 1);  // one message per stream
  EXPECT_EQ(fifth, *sequences.rbegin());                           // then the fifth on stream 2
  for (int fd : peer) close(fd);
  close(control[1]);
}

TEST(HarpSpscRingTest, TwoThreadsPassEveryValueInOrder) {
  harp::SpscRing<uint64_t, 64> ring;
  constexpr uint64_t kCount = 200000;
  std::thread consumer([&] {
    uint64_t expected = 0, value = 0;
    while (expected < kCount) {
      if (ring.Pop(&value)) {
        ASSERT_EQ(value, expected);
        ++expected;
      }
    }
  });
  for (uint64_t i = 0; i < kCount;) {
    if (ring.Push(i)) ++i;
  }
  consumer.join();
  EXPECT_TRUE(ring.Empty());
}

}  // namespace
