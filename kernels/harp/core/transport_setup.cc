#include "kernels/harp/core/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/errqueue.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

namespace tf_ext {
namespace harp HARP_HIDDEN {
namespace {

using Clock = std::chrono::steady_clock;

std::string SystemError(const char* what) { return std::string(what) + ": " + strerror(errno); }

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

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

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Worker: one thread driving the sockets of the connections assigned to it.

class Worker {
 public:
  // pthread rather than std::thread, whose state type (over this class) would be exported.
  explicit Worker(int cpu) : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), cpu_(cpu) {
    pthread_create(&thread_, nullptr, &Worker::Start, this);
  }

  ~Worker() {
    stop_.store(true, std::memory_order_seq_cst);
    Signal();
    pthread_join(thread_, nullptr);
    for (Connection* connection : connections_) delete connection;
    for (Connection* connection : incoming_) delete connection;
    close(wake_fd_);
  }

  void Add(Connection* connection) {
    {
      std::lock_guard<std::mutex> lock(mutex_);  // connection set-up only, not the data path
      incoming_.push_back(connection);
      has_incoming_.store(true, std::memory_order_seq_cst);
    }
    Wake();
  }

  // Called after posting (or after an inline pass left work): a system call only when the worker
  // is (about to be) asleep. Both sides use sequentially consistent read-modify-writes on
  // `sleeping_` (an RMW reads the latest value, and the two synchronise), so either the worker sees
  // what the caller did before it decides to sleep, or the caller sees `sleeping_` and signals.
  void Wake() {
    if (sleeping_.fetch_add(0, std::memory_order_seq_cst) != 0) Signal();
  }

 private:
  void Signal() {
    uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));
    (void)ignored;
  }

  bool HasWork() {
    if (has_incoming_.load(std::memory_order_seq_cst) || stop_.load(std::memory_order_seq_cst)) {
      return true;
    }
    for (Connection* connection : connections_) {
      if (connection->close_requested_.load(std::memory_order_seq_cst)) return true;
      if (CallerDriven(connection)) continue;
      if (!connection->posted_.Empty()) return true;
    }
    return false;
  }

  // A connection the caller drives itself (a receiving one on the small-message fast path, or one
  // the caller claimed): the worker leaves it alone but for closing it and the idle check.
  static bool CallerDriven(const Connection* connection) {
    return connection->caller_claimed_.load(std::memory_order_seq_cst) ||
           (!connection->is_send() && connection->caller_driven_.load(std::memory_order_seq_cst));
  }

  static void* Start(void* self) {
    auto* worker = static_cast<Worker*>(self);
    if (worker->cpu_ >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(worker->cpu_, &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    worker->Run();
    return nullptr;
  }

  void Run() {
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      if (has_incoming_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(mutex_);
        connections_.insert(connections_.end(), incoming_.begin(), incoming_.end());
        incoming_.clear();
        has_incoming_.store(false, std::memory_order_seq_cst);
      }
      bool moved = false;
      const auto now = Clock::now();
      const bool idle_check = now - last_idle_check_ >= std::chrono::milliseconds(kPollMs);
      if (idle_check) last_idle_check_ = now;
      for (size_t i = 0; i < connections_.size();) {
        Connection* connection = connections_[i];
        if (connection->close_requested_.load(std::memory_order_acquire)) {
          connections_[i] = connections_.back();
          connections_.pop_back();
          // The last touch: from here the closing thread owns (and deletes) the connection.
          connection->released_.store(true, std::memory_order_release);
          continue;
        }
        // A connection the caller holds (an inline pass) is skipped: the caller finishes its pass
        // and wakes this worker if it leaves anything for it.
        if (!CallerDriven(connection)) {
          if (connection->TryAcquire()) {
            moved |= connection->Progress();
            connection->ReleaseOwnership();
          }
        } else if (idle_check) {
          // The caller drives it, but ran no pass over a whole poll period: one pass here.
          const uint64_t passes = connection->inline_passes_.load(std::memory_order_relaxed);
          if (passes == connection->inline_passes_seen_ && connection->TryAcquire()) {
            moved |= connection->Progress();
            connection->ReleaseOwnership();
          }
          connection->inline_passes_seen_ = passes;
        }
        ++i;
      }
      if (moved) continue;
      // Announce the sleep first, then look at the connections: a caller that posts, or finishes
      // an inline pass, after this sees the flag and signals; one that did so before is seen here.
      sleeping_.exchange(1, std::memory_order_seq_cst);
      fds.clear();
      fds.push_back(pollfd{wake_fd_, POLLIN, 0});
      for (Connection* connection : connections_) {
        if (CallerDriven(connection)) continue;
        // Set before trying: a caller whose inline pass made us skip it sees this when done.
        connection->poll_skipped_.store(true, std::memory_order_seq_cst);
        if (!connection->TryAcquire()) continue;
        connection->poll_skipped_.store(false, std::memory_order_relaxed);
        connection->AddPollEvents(&fds);
        connection->ReleaseOwnership();
      }
      // The timeout bounds how long a missed edge (e.g. a peer's FIN on a socket we were not
      // polling) can go unnoticed; it is not on the data path.
      if (!HasWork()) poll(fds.data(), fds.size(), kPollMs);
      sleeping_.store(0, std::memory_order_seq_cst);
      uint64_t drained;
      while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
      }
    }
  }

  static constexpr int kPollMs = 50;
  const int wake_fd_;
  const int cpu_;
  pthread_t thread_;
  Clock::time_point last_idle_check_ = Clock::now();  // the worker thread's own
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_{0};
  std::mutex mutex_;
  std::vector<Connection*> incoming_;
  std::atomic<bool> has_incoming_{false};
  std::vector<Connection*> connections_;  // the worker thread's own
};

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(bool is_send, int control_fd, std::vector<int> stream_fds, int pool_size)
    : is_send_(is_send), control_fd_(control_fd), stream_fds_(std::move(stream_fds)) {
  for (int slot = 0; slot < pool_size; ++slot) {
    pool_.push_back(std::make_unique<Request>());
    pool_.back()->owner = this;
    pool_.back()->slot = slot;
    free_slots_.push_back(pool_size - 1 - slot);
  }
}

Connection::~Connection() {
  CloseFd(&control_fd_);
  for (int& fd : stream_fds_) CloseFd(&fd);
}

void Connection::Fail(const std::string& why) {
  if (!failed_.load(std::memory_order_relaxed)) {
    failure_ = why;
    failed_.store(true, std::memory_order_release);
  }
  FailHeldRequests();
}

bool Connection::NextPosted(Request** request) {
  while (posted_.Pop(request)) {
    if (!failed_.load(std::memory_order_relaxed)) return true;
    Publish(*request, Request::kFailed);
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// SendConnection

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

SendConnection::SendConnection(int control_fd, std::vector<int> stream_fds, size_t chunk_bytes,
                               size_t zerocopy_threshold, LogFunction log)
    : Connection(true, control_fd, std::move(stream_fds), kSendRequests),
      chunk_bytes_(chunk_bytes),
      zerocopy_threshold_(zerocopy_threshold),
      log_(log),
      streams_(stream_fds_.size()) {
  if (zerocopy_threshold_ == 0) return;
  int one = 1;
  for (int fd : stream_fds_) {
    if (setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) != 0) {
      DisableZerocopy(SystemError("setsockopt(SO_ZEROCOPY)"));
      return;
    }
  }
}

// Copying sends from here on (for this connection).
void SendConnection::DisableZerocopy(const std::string& why) {
  zerocopy_threshold_ = 0;
  LogZerocopyFallback(why);
}

// Said once per process.
void SendConnection::LogZerocopyFallback(const std::string& why) {
  static std::atomic<bool> logged{false};
  if (log_ != nullptr && !logged.exchange(true)) {
    log_(LogLevel::kWarning,
         "HARP: MSG_ZEROCOPY unavailable (" + why + "): falling back to copying sends");
  }
}

void SendConnection::FailHeldRequests() {
  for (Message& message : messages_) Publish(message.request, Request::kFailed);
  messages_.clear();
  next_to_assign_ = 0;
  for (Stream& stream : streams_) {
    stream.message = nullptr;
    stream.zerocopy_in_flight.clear();
  }
}

// Drains one stream's error queue: completion notifications of zero-copy sends (each a range of
// ids, inclusive), which release the messages those sends belonged to.
bool SendConnection::ReadCompletions(size_t index) {
  Stream& stream = streams_[index];
  bool moved = false;
  while (!stream.zerocopy_in_flight.empty()) {
    alignas(cmsghdr) char control[128];
    msghdr header{};
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    ssize_t got = recvmsg(stream_fds_[index], &header, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (!WouldBlock()) Fail(SystemError("HARP: reading zero-copy completions"));
      return moved || failed();
    }
    for (cmsghdr* message = CMSG_FIRSTHDR(&header); message != nullptr;
         message = CMSG_NXTHDR(&header, message)) {
      const bool is_error = (message->cmsg_level == SOL_IP && message->cmsg_type == IP_RECVERR) ||
                            (message->cmsg_level == SOL_IPV6 && message->cmsg_type == IPV6_RECVERR);
      if (!is_error) continue;
      sock_extended_err error;
      std::memcpy(&error, CMSG_DATA(message), sizeof(error));
      if (error.ee_origin != SO_EE_ORIGIN_ZEROCOPY || error.ee_errno != 0) {
        errno = error.ee_errno != 0 ? static_cast<int>(error.ee_errno) : EPROTO;
        Fail(SystemError("HARP: error on a data stream"));
        return true;
      }
      const uint32_t low = error.ee_info, high = error.ee_data;
      const uint64_t count = static_cast<uint32_t>(high - low) + uint64_t{1};
      zerocopy_completed_.fetch_add(count, std::memory_order_relaxed);
      if (error.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) {
        zerocopy_copied_.fetch_add(count, std::memory_order_relaxed);
      }
      auto& in_flight = stream.zerocopy_in_flight;
      for (auto send = in_flight.begin(); send != in_flight.end();) {
        // Ids wrap at 2^32: compare by distance.
        if (static_cast<int32_t>(send->id - low) >= 0 &&
            static_cast<int32_t>(high - send->id) >= 0) {
          Message& owner = messages_[send->sequence - messages_.front().sequence];
          --owner.zerocopy_pending;
          send = in_flight.erase(send);
          moved = true;
        } else {
          ++send;
        }
      }
    }
  }
  return moved;
}

bool SendConnection::FlushControl() {
  bool moved = false;
  while (!control_out_.empty()) {
    ssize_t sent =
        send(control_fd_, control_out_.data(), control_out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (!WouldBlock()) Fail(SystemError("HARP: send on the control socket"));
      return moved;
    }
    control_out_.erase(control_out_.begin(), control_out_.begin() + sent);
    control_flushed_ += sent;
    moved = true;
  }
  return moved;
}

// The free stream whose socket holds the fewest bytes not yet acknowledged by the peer (unsent
// or in flight), ties going round-robin from the stream after the last one given a chunk; -1 when
// every stream has a chunk. A socket's buffer takes a whole chunk long before its flow has carried
// it, so "the first stream whose send does not block" gave one stream every chunk of a steady,
// one-message-at-a-time sender (NCCL's proxy posts a step once the GPU filled it): one flow,
// capped at a cloud's per-flow rate. The least-queued stream goes to the flows that drain fastest.
int SendConnection::LeastQueuedFreeStream() const {
  int best = -1;
  int best_queued = 0;
  for (size_t k = 0; k < streams_.size(); ++k) {
    const size_t i = (next_stream_ + k) % streams_.size();
    if (streams_[i].message != nullptr) continue;
    int queued = 0;
    if (ioctl(stream_fds_[i], SIOCOUTQ, &queued) != 0) queued = 0;  // unknown: as if empty
    if (queued <= 0) return static_cast<int>(i);  // none can hold fewer: no more system calls
    if (best < 0 || queued < best_queued) {
      best = static_cast<int>(i);
      best_queued = queued;
    }
  }
  return best;
}

// Whether a message has bytes no stream was given yet (moving next_to_assign_ to the first such).
bool SendConnection::HasUnassignedBytes() {
  while (next_to_assign_ < messages_.size() &&
         messages_[next_to_assign_].assigned ==
             messages_[next_to_assign_].request->buffers[0].capacity) {
    ++next_to_assign_;
  }
  return next_to_assign_ < messages_.size();
}

// Gives free stream `index` the next chunk of the oldest message with unassigned bytes (there is
// one: HasUnassignedBytes).
void SendConnection::AssignChunk(size_t index) {
  Message& message = messages_[next_to_assign_];
  const uint64_t size = message.request->buffers[0].capacity;
  Stream& stream = streams_[index];
  next_stream_ = (index + 1) % streams_.size();
  stream.message = &message;
  stream.offset = message.assigned;
  stream.length = std::min<uint64_t>(chunk_bytes_, size - message.assigned);
  message.assigned += stream.length;
  stream.header_sent = 0;
  stream.payload_sent = 0;
  stream.zerocopy = zerocopy_threshold_ > 0 && stream.length >= zerocopy_threshold_;
  EncodeChunkHeader(ChunkHeader{message.sequence, stream.offset, stream.length}, stream.header);
}

// One step of one stream with a chunk: sends what the socket takes of it. True if anything moved.
bool SendConnection::DriveStream(size_t index) {
  Stream& stream = streams_[index];
  if (stream.message == nullptr) return false;
  if (stream.zerocopy) {
    // The header (in `stream`, rewritten for the next chunk) must not be sent zero-copy: it goes
    // first with a copying send, then the payload from the request's buffer with MSG_ZEROCOPY.
    while (stream.header_sent < kChunkHeaderBytes) {
      ssize_t sent = send(stream_fds_[index], stream.header + stream.header_sent,
                          kChunkHeaderBytes - stream.header_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (WouldBlock()) return false;
        Fail(SystemError("HARP: send on a data stream"));
        return true;
      }
      stream.header_sent += sent;
      if (stream.header_sent < kChunkHeaderBytes) return true;
    }
    while (true) {
      ssize_t sent =
          send(stream_fds_[index],
               stream.message->request->buffers[0].data + stream.offset + stream.payload_sent,
               stream.length - stream.payload_sent, MSG_NOSIGNAL | MSG_DONTWAIT | MSG_ZEROCOPY);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (WouldBlock()) return false;
        if (errno == ENOBUFS) {  // over the socket's optmem limit: this chunk's rest copies
          LogZerocopyFallback(SystemError("send(MSG_ZEROCOPY)"));
          stream.zerocopy = false;
          return true;
        }
        Fail(SystemError("HARP: send on a data stream"));
        return true;
      }
      stream.zerocopy_in_flight.push_back(
          ZerocopySend{stream.next_zerocopy_id++, stream.message->sequence});
      ++stream.message->zerocopy_pending;
      stream.payload_sent += sent;
      if (stream.payload_sent == stream.length) {
        stream.message->written += stream.length;
        stream.message = nullptr;
      }
      return true;
    }
  }
  while (true) {
    iovec parts[2];
    int count = 0;
    if (stream.header_sent < kChunkHeaderBytes) {
      parts[count++] = {stream.header + stream.header_sent, kChunkHeaderBytes - stream.header_sent};
    }
    parts[count++] = {
        stream.message->request->buffers[0].data + stream.offset + stream.payload_sent,
        stream.length - stream.payload_sent};
    msghdr message_header{};
    message_header.msg_iov = parts;
    message_header.msg_iovlen = count;
    ssize_t sent = sendmsg(stream_fds_[index], &message_header, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (WouldBlock()) return false;
      Fail(SystemError("HARP: send on a data stream"));
      return true;
    }
    size_t header_part = std::min<size_t>(sent, kChunkHeaderBytes - stream.header_sent);
    stream.header_sent += header_part;
    stream.payload_sent += sent - header_part;
    if (stream.header_sent == kChunkHeaderBytes && stream.payload_sent == stream.length) {
      stream.message->written += stream.length;
      stream.message = nullptr;
    }
    return true;
  }
}

bool SendConnection::Progress() {
  bool moved = false;
  Request* request;
  while (NextPosted(&request)) {
    messages_.push_back(Message{request, next_sequence_++});
    Message& message = messages_.back();
    const uint64_t size = request->buffers[0].capacity;
    // A small message goes whole on the control socket, copied behind its descriptor: one
    // segment, no chunk (and its buffer is free once the control bytes are in the kernel).
    const bool inline_payload = size > 0 && size <= kMaxInlinePayloadBytes;
    uint8_t descriptor[kDescriptorBytes];
    EncodeDescriptor(
        MessageDescriptor{message.sequence, size, request->buffers[0].tag, inline_payload},
        descriptor);
    control_out_.insert(control_out_.end(), descriptor, descriptor + kDescriptorBytes);
    control_queued_ += kDescriptorBytes;
    if (inline_payload) {
      const uint8_t* payload = request->buffers[0].data;
      control_out_.insert(control_out_.end(), payload, payload + size);
      control_queued_ += size;
      message.assigned = message.written = size;
    }
    message.descriptor_end = control_queued_;
    moved = true;
  }
  if (failed()) return moved;
  if (!peer_closed_ && !inline_pass_) {
    // The receiver never writes after the handshake: a readable control socket means it closed
    // (or is not a HARP peer). (Not in the caller's inline passes: the worker polls for this.)
    uint8_t unexpected[16];
    ssize_t got = recv(control_fd_, unexpected, sizeof(unexpected), MSG_DONTWAIT);
    if (got == 0) {
      peer_closed_ = true;
      moved = true;
    } else if (got > 0) {
      Fail("HARP: protocol error: the receiver wrote on the control socket");
      return true;
    } else if (!WouldBlock() && errno != EINTR) {
      Fail(SystemError("HARP: receive on the control socket"));
      return true;
    }
  }
  moved |= FlushControl();
  for (bool pass_moved = true; pass_moved && !failed();) {
    pass_moved = false;
    for (size_t i = 0; i < streams_.size() && !failed(); ++i) pass_moved |= DriveStream(i);
    // New chunks, one at a time, each to the least-queued free stream (one whose send blocks
    // keeps its chunk and is no longer free). Streams are looked at only when there is a chunk.
    while (!failed() && HasUnassignedBytes()) {
      const int stream = LeastQueuedFreeStream();
      if (stream < 0) break;
      AssignChunk(stream);
      pass_moved |= DriveStream(stream);
    }
    moved |= pass_moved;
  }
  for (size_t i = 0; i < streams_.size() && !failed(); ++i) {
    if (!streams_[i].zerocopy_in_flight.empty()) moved |= ReadCompletions(i);
  }
  if (failed()) return true;
  // In posting order: a message is done once its bytes and its descriptor are in the kernel, and
  // the kernel released every zero-copy send of its bytes.
  while (!messages_.empty()) {
    Message& front = messages_.front();
    if (front.written != front.request->buffers[0].capacity ||
        control_flushed_ < front.descriptor_end || front.zerocopy_pending != 0) {
      break;
    }
    Publish(front.request, Request::kDone);
    messages_.pop_front();
    if (next_to_assign_ > 0) --next_to_assign_;
    moved = true;
  }
  if (peer_closed_ && !messages_.empty()) {
    Fail("HARP: the receiver closed the connection with sends in flight");
    return true;
  }
  return moved;
}

void SendConnection::AddPollEvents(std::vector<pollfd>* fds) const {
  if (failed()) return;
  short control_events = (control_out_.empty() ? 0 : POLLOUT) | (peer_closed_ ? 0 : POLLIN);
  if (control_events) fds->push_back(pollfd{control_fd_, control_events, 0});
  for (size_t i = 0; i < streams_.size(); ++i) {
    // Zero-copy completions make the socket report POLLERR, whatever the events asked for.
    if (streams_[i].message != nullptr || !streams_[i].zerocopy_in_flight.empty()) {
      fds->push_back(pollfd{stream_fds_[i],
                            static_cast<short>(streams_[i].message != nullptr ? POLLOUT : 0), 0});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// ReceiveConnection

ReceiveConnection::ReceiveConnection(int control_fd, std::vector<int> stream_fds)
    : Connection(false, control_fd, std::move(stream_fds), kMaxRequests),
      messages_(kMessageWindow),
      streams_(stream_fds_.size()) {}

void ReceiveConnection::FailHeldRequests() {
  for (PostedReceive& receive : receives_) Publish(receive.request, Request::kFailed);
  receives_.clear();
  for (Message& message : messages_) message = Message();
  active_messages_ = 0;
  large_active_ = 0;
  for (Stream& stream : streams_) stream.message = nullptr;
}

bool ReceiveConnection::ReadControl() {
  if (control_eof_) return false;
  if (control_begin_ > 0) {
    std::memmove(control_in_, control_in_ + control_begin_, control_end_ - control_begin_);
    control_end_ -= control_begin_;
    control_begin_ = 0;
  }
  if (control_end_ == sizeof(control_in_)) return false;
  ssize_t got = recv(control_fd_, control_in_ + control_end_, sizeof(control_in_) - control_end_,
                     MSG_DONTWAIT);
  if (got == 0) {
    control_eof_ = true;
    return true;
  }
  if (got < 0) {
    if (!WouldBlock() && errno != EINTR) Fail(SystemError("HARP: receive on the control socket"));
    return failed();
  }
  control_end_ += got;
  return true;
}

bool ReceiveConnection::MatchDescriptors() {
  bool moved = false;
  control_stalled_ = false;
  while (control_end_ - control_begin_ >= kDescriptorBytes) {
    MessageDescriptor descriptor;
    std::string error;
    if (!DecodeDescriptor(control_in_ + control_begin_, next_sequence_, &descriptor, &error)) {
      Fail("HARP: protocol error: " + error);
      return true;
    }
    const size_t record_bytes =
        kDescriptorBytes + (descriptor.inline_payload ? descriptor.size : uint64_t{0});
    control_awaiting_payload_ = control_end_ - control_begin_ < record_bytes;
    if (control_awaiting_payload_) break;  // the rest of its inline payload is still to come
    // The first posted receive, in posting order, with an unmatched buffer of this tag.
    PostedReceive* match = nullptr;
    int buffer = 0;
    for (PostedReceive& receive : receives_) {
      for (int b = 0; b < receive.request->count && match == nullptr; ++b) {
        if (!receive.matched[b] && receive.request->buffers[b].tag == descriptor.tag) {
          match = &receive;
          buffer = b;
        }
      }
      if (match != nullptr) break;
    }
    if (match == nullptr) {
      control_stalled_ = true;  // until a matching receive is posted
      break;
    }
    Request::Buffer& target = match->request->buffers[buffer];
    if (descriptor.size > target.capacity) {
      Fail("HARP: message " + std::to_string(descriptor.sequence) + " of " +
           std::to_string(descriptor.size) + " bytes (tag " + std::to_string(descriptor.tag) +
           ") is larger than its posted receive of " + std::to_string(target.capacity) + " bytes");
      return true;
    }
    Message& slot = messages_[descriptor.sequence % kMessageWindow];
    if (!descriptor.inline_payload && slot.active) {
      Fail("HARP: protocol error: more than " + std::to_string(kMessageWindow) +
           " messages in flight");
      return true;
    }
    match->matched[buffer] = true;
    target.size = descriptor.size;
    last_large_ = descriptor.size > kInlineBytes;
    if (last_large_) ++large_active_;
    if (descriptor.inline_payload) {  // the whole message is here (size checked above)
      std::memcpy(target.data, control_in_ + control_begin_ + kDescriptorBytes, descriptor.size);
      ++match->complete;
    } else if (descriptor.size == 0) {
      ++match->complete;
    } else {
      slot.active = true;
      ++active_messages_;
      slot.sequence = descriptor.sequence;
      slot.size = descriptor.size;
      slot.received = 0;
      slot.arrived = 0;
      slot.receive = match;
      slot.buffer = buffer;
    }
    ++next_sequence_;
    control_begin_ += record_bytes;
    moved = true;
  }
  return moved;
}

void ReceiveConnection::FinishBuffer(Message* message) {
  if (message->size > kInlineBytes) --large_active_;
  ++message->receive->complete;
  *message = Message();
  --active_messages_;
}

bool ReceiveConnection::DriveStream(size_t index) {
  Stream& stream = streams_[index];
  if (stream.eof) return false;
  // An inline pass with no matched message waiting for data reads no stream: any chunk there is
  // for a message not described yet, which would stall anyway. One system call (the control
  // socket) per idle test instead of one per stream. (The worker, woken by poll, reads on.)
  if (inline_pass_ && active_messages_ == 0 && stream.message == nullptr &&
      stream.header_received == 0) {
    return false;
  }
  bool moved = false;
  if (stream.message == nullptr) {
    if (stream.header_received < kChunkHeaderBytes) {
      ssize_t got = recv(stream_fds_[index], stream.header + stream.header_received,
                         kChunkHeaderBytes - stream.header_received, MSG_DONTWAIT);
      if (got == 0) {
        if (stream.header_received == 0) {
          stream.eof = true;
        } else {
          Fail("HARP: protocol error: the peer closed a stream inside a chunk header");
        }
        return true;
      }
      if (got < 0) {
        if (!WouldBlock() && errno != EINTR) Fail(SystemError("HARP: receive on a data stream"));
        return failed();
      }
      stream.header_received += got;
      if (stream.header_received < kChunkHeaderBytes) return true;
      moved = true;
    }
    std::string error;
    ChunkHeader& chunk = stream.chunk;
    if (!DecodeChunkHeader(stream.header, &chunk, &error)) {
      Fail("HARP: protocol error: " + error);
      return true;
    }
    if (chunk.sequence >= next_sequence_) {
      if (chunk.sequence - next_sequence_ >= kMessageWindow) {
        Fail("HARP: protocol error: chunk for message " + std::to_string(chunk.sequence) +
             ", far beyond the described ones");
        return true;
      }
      // Its descriptor is not matched yet: leave the payload in the socket (TCP flow control
      // holds the sender back) until a receive for it is posted.
      stream.stalled = true;
      return moved;
    }
    Message& message = messages_[chunk.sequence % kMessageWindow];
    if (!message.active || message.sequence != chunk.sequence) {
      Fail("HARP: protocol error: chunk for message " + std::to_string(chunk.sequence) +
           ", which is complete or has no data");
      return true;
    }
    if (!ChunkFitsMessage(chunk, message.size, message.received, &error)) {
      Fail("HARP: protocol error: " + error);
      return true;
    }
    message.received += chunk.length;  // claimed now, so no two chunks can overfill it
    stream.message = &message;
    stream.payload_received = 0;
  }
  stream.stalled = false;
  Message& message = *stream.message;
  uint8_t* destination = message.receive->request->buffers[message.buffer].data +
                         stream.chunk.offset + stream.payload_received;
  ssize_t got = recv(stream_fds_[index], destination, stream.chunk.length - stream.payload_received,
                     MSG_DONTWAIT);
  if (got == 0) {
    Fail("HARP: the peer closed the connection in the middle of a chunk");
    return true;
  }
  if (got < 0) {
    if (!WouldBlock() && errno != EINTR) Fail(SystemError("HARP: receive on a data stream"));
    return moved || failed();
  }
  stream.payload_received += got;
  if (stream.payload_received == stream.chunk.length) {
    message.arrived += stream.chunk.length;
    stream.message = nullptr;
    stream.header_received = 0;
    if (message.arrived == message.size) FinishBuffer(&message);
  }
  return true;
}

void ReceiveConnection::CheckPeerClosed() {
  if (!control_eof_) return;
  const size_t buffered = control_end_ - control_begin_;
  if (buffered > 0 && (buffered < kDescriptorBytes || control_awaiting_payload_)) {
    Fail("HARP: protocol error: the peer closed the control socket inside a descriptor");
    return;
  }
  bool unmatched = false;
  for (const PostedReceive& receive : receives_) {
    for (int b = 0; b < receive.request->count; ++b) unmatched |= !receive.matched[b];
  }
  if (unmatched && buffered == 0) {
    Fail("HARP: the peer closed the connection with receives still posted");
    return;
  }
  bool all_streams_closed = std::all_of(streams_.begin(), streams_.end(),
                                        [](const Stream& stream) { return stream.eof; });
  bool data_missing = std::any_of(messages_.begin(), messages_.end(),
                                  [](const Message& message) { return message.active; });
  if (all_streams_closed && data_missing) {
    Fail("HARP: the peer closed the connection in the middle of a message");
  }
}

bool ReceiveConnection::Progress() {
  const bool moved = Pass();
  // Who drives it next: the caller while only small messages come (the last one matched was
  // small, none large is receiving), else the worker. Only the holder writes this flag.
  const bool caller = failed() || (large_active_ == 0 && !last_large_);
  if (caller != caller_driven_.load(std::memory_order_relaxed)) {
    caller_driven_.store(caller, std::memory_order_seq_cst);
  }
  return moved;
}

bool ReceiveConnection::Pass() {
  bool moved = false;
  Request* request;
  while (NextPosted(&request)) {
    receives_.push_back(PostedReceive{request});
    moved = true;
  }
  if (failed()) return moved;
  for (bool pass_moved = true; pass_moved && !failed();) {
    pass_moved = ReadControl();
    if (!failed()) pass_moved |= MatchDescriptors();
    for (size_t i = 0; i < streams_.size() && !failed(); ++i) pass_moved |= DriveStream(i);
    moved |= pass_moved;
  }
  if (failed()) return true;
  // In posting order: a receive is done once every buffer's message arrived.
  while (!receives_.empty() && receives_.front().complete == receives_.front().request->count) {
    Publish(receives_.front().request, Request::kDone);
    receives_.pop_front();
    moved = true;
  }
  CheckPeerClosed();
  return moved || failed();
}

void ReceiveConnection::AddPollEvents(std::vector<pollfd>* fds) const {
  if (failed()) return;
  if (!control_eof_ && !control_stalled_ && control_end_ - control_begin_ < sizeof(control_in_)) {
    fds->push_back(pollfd{control_fd_, POLLIN, 0});
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (!streams_[i].eof && !streams_[i].stalled) {
      fds->push_back(pollfd{stream_fds_[i], POLLIN, 0});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Posting and testing (the caller's side)

Status Transport::PostSend(Connection* connection, void* data, uint64_t size, int tag,
                           Request** out) {
  *out = nullptr;
  if (!connection->is_send()) return Status::kInvalidUsage;
  if (connection->failed()) return Status::kRemote;
  if (size > 0 && data == nullptr) return Status::kInvalidArgument;
  if (connection->free_slots_.empty()) return Status::kOk;  // full: NCCL tries again
  Request* request = connection->pool_[connection->free_slots_.back()].get();
  connection->free_slots_.pop_back();
  request->count = 1;
  request->buffers[0] = Request::Buffer{static_cast<uint8_t*>(data), size, tag, size};
  request->large = size > kInlineBytes;
  if (request->large) ++connection->large_outstanding_;
  request->state.store(Request::kPosted, std::memory_order_relaxed);
  connection->posted_.Push(request);  // never full: the ring holds the whole pool
  *out = request;
  return Status::kOk;
}

Status Transport::PostReceive(Connection* connection, int count, void* const* data,
                              const uint64_t* sizes, const int* tags, Request** out) {
  *out = nullptr;
  if (connection->is_send()) return Status::kInvalidUsage;
  if (count < 1 || count > kMaxReceivesPerRequest) return Status::kInvalidArgument;
  for (int b = 0; b < count; ++b) {
    if (sizes[b] > 0 && data[b] == nullptr) return Status::kInvalidArgument;
  }
  if (connection->failed()) return Status::kRemote;
  if (connection->free_slots_.empty()) return Status::kOk;
  Request* request = connection->pool_[connection->free_slots_.back()].get();
  connection->free_slots_.pop_back();
  request->count = count;
  for (int b = 0; b < count; ++b) {
    request->buffers[b] = Request::Buffer{static_cast<uint8_t*>(data[b]), sizes[b], tags[b], 0};
  }
  request->large = false;  // a receiving connection goes by the messages it matches instead
  request->state.store(Request::kPosted, std::memory_order_relaxed);
  connection->posted_.Push(request);
  *out = request;
  return Status::kOk;
}

Status Transport::TestRequest(Request* request, bool* done, uint64_t* sizes, std::string* error) {
  const int state = request->state.load(std::memory_order_acquire);
  *done = false;
  if (state == Request::kPosted) return Status::kOk;
  Connection* connection = request->owner;
  if (state != Request::kDone && state != Request::kFailed) return Status::kInvalidUsage;
  if (sizes != nullptr && state == Request::kDone) {
    for (int b = 0; b < request->count; ++b) sizes[b] = request->buffers[b].size;
  }
  request->state.store(Request::kFree, std::memory_order_relaxed);
  connection->free_slots_.push_back(request->slot);
  if (request->large) --connection->large_outstanding_;
  if (state == Request::kFailed) {
    *error = connection->failure();
    return Status::kRemote;
  }
  *done = true;
  return Status::kOk;
}

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
  // The address to listen on: HARP_IFNAME as an IPv4 address, or an interface's first IPv4
  // address, or (empty) the first non-loopback interface that is up, else loopback.
  in_addr address{};
  const std::string& wanted = config.interface;
  bool is_address = !wanted.empty() && inet_pton(AF_INET, wanted.c_str(), &address) == 1;
  bool found = is_address;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) == 0) {
    for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
      in_addr entry_address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr;
      bool matches = false;
      if (is_address) {
        matches = entry_address.s_addr == address.s_addr;
      } else if (!wanted.empty()) {
        matches = wanted == entry->ifa_name;
      } else {
        matches = (entry->ifa_flags & IFF_UP) && !(entry->ifa_flags & IFF_LOOPBACK);
      }
      if (matches) {
        address = entry_address;
        transport->interface_name_ = entry->ifa_name;
        found = true;
        break;
      }
    }
    freeifaddrs(interfaces);
  }
  if (!found && wanted.empty()) {
    inet_pton(AF_INET, "127.0.0.1", &address);
    transport->interface_name_ = "lo";
    found = true;
  }
  if (!found) {
    *error = "HARP_IFNAME='" + wanted +
             "' is invalid: no such interface with an IPv4 address (expected an interface name or "
             "an IPv4 address of this machine, or empty for the first interface that is up)";
    return Status::kInvalidUsage;
  }
  if (transport->interface_name_.empty()) transport->interface_name_ = wanted;
  transport->ipv4_address_ = address.s_addr;
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &address, text, sizeof(text));
  transport->address_text_ = text;
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

// Sends and receives take turns over the workers separately, receives starting half-way round:
// NCCL sets up a send and a receive per channel in an order of its own, and a single round-robin
// could put every channel's send (each direction's bulk copying) on the same worker. With n
// workers, the k-th send goes to worker k mod n, the k-th receive to (k + n/2) mod n: two channels
// on four workers use all four cores, and with two or more workers the first send and the first
// receive never share one.
size_t Transport::WorkerFor(bool is_send, uint64_t ordinal, size_t workers) {
  return static_cast<size_t>((ordinal + (is_send ? 0 : workers / 2)) % workers);
}

void Transport::Attach(Connection* connection) {
  std::atomic<uint64_t>& next = connection->is_send() ? next_send_worker_ : next_receive_worker_;
  const size_t index = WorkerFor(connection->is_send(),
                                 next.fetch_add(1, std::memory_order_relaxed), workers_.size());
  connection->worker_ = workers_[index].get();
  connection->worker_->Add(connection);
}

int Transport::WorkerIndex(const Connection* connection) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].get() == connection->worker_) return static_cast<int>(i);
  }
  return -1;
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

Status Transport::Send(SendConnection* connection, void* data, uint64_t size, int tag,
                       Request** out) {
  Status status = PostSend(connection, data, size, tag, out);
  if (*out != nullptr) Drive(connection, true);
  if (status == Status::kRemote) Log(LogLevel::kWarning, connection->failure());
  return status;
}

Status Transport::Receive(ReceiveConnection* connection, int count, void* const* data,
                          const uint64_t* sizes, const int* tags, Request** out) {
  Status status = PostReceive(connection, count, data, sizes, tags, out);
  if (*out != nullptr) Drive(connection, true);
  if (status == Status::kRemote) Log(LogLevel::kWarning, connection->failure());
  return status;
}

bool Transport::TryClaim(Connection* connection) {
  int claimed = caller_claims_.load(std::memory_order_relaxed);
  while (claimed < config_.caller_connections) {
    if (caller_claims_.compare_exchange_weak(claimed, claimed + 1, std::memory_order_relaxed)) {
      connection->caller_claimed_.store(true, std::memory_order_seq_cst);
      return true;
    }
  }
  return false;
}

void Transport::Drive(Connection* connection, bool posted) {
  const bool small = connection->is_send()
                         ? connection->large_outstanding_ == 0
                         : connection->caller_driven_.load(std::memory_order_seq_cst);
  // NCCL's proxy thread spins on test() whatever the transport: the first busy connections (up
  // to HARP_CALLER_CONNECTIONS) it drives itself, so that its spinning moves bytes; the workers
  // take the rest, each on a core of its own.
  const bool claimed = connection->caller_claimed() || (!small && TryClaim(connection));
  if (!small && !claimed) {
    if (posted) connection->worker_->Wake();  // the worker's connection, as before the fast path
    return;
  }
  // The small-message fast path: one pass in this thread, unless the worker holds the connection
  // (then it is making progress, and polls what it leaves; a request just posted it sees before it
  // sleeps). A pass that leaves writes unfinished hands them to the worker's poll.
  if (connection->TryAcquire()) {
    connection->inline_pass_ = true;
    const bool moved = connection->Progress();
    connection->inline_pass_ = false;
    connection->inline_passes_.fetch_add(1, std::memory_order_relaxed);
    // Leftover: writes only socket readiness will move, or a receiving connection that the pass
    // handed to the worker (it matched a large message).
    const bool leftover =
        connection->HasUnfinishedWrites() ||
        (!connection->is_send() && !connection->caller_driven_.load(std::memory_order_relaxed));
    connection->ReleaseOwnership();
    // A claimed connection's leftovers wait for the caller's next test (the worker looks only
    // after a poll period without one).
    if (!leftover || claimed) return;
    // A pass that moved nothing left things as the worker last saw them (or as an earlier pass
    // that woke it left them), unless the worker skipped the connection while building its poll
    // set because this thread held it: then the worker must look again. (Without this a caller
    // testing a send held back by a full socket would wake the worker on every test.)
    if (!moved && !posted &&
        !connection->poll_skipped_.exchange(false, std::memory_order_seq_cst)) {
      return;
    }
  } else if (!posted) {
    return;
  }
  connection->worker_->Wake();
}

Status Transport::Test(Request* request, bool* done, uint64_t* sizes) {
  if (request->state.load(std::memory_order_acquire) == Request::kPosted) {
    Drive(request->owner, false);
  }
  std::string error;
  Status status = TestRequest(request, done, sizes, &error);
  if (status != Status::kOk) Log(LogLevel::kWarning, error.empty() ? "HARP: bad request" : error);
  return status;
}

void Transport::Close(Connection* connection) {
  if (connection == nullptr) return;
  // Synchronous: once close returns, NCCL may free the buffers of requests still in flight, so
  // the worker must have let go of the connection first (it does within one pass of its loop).
  Worker* worker = connection->worker_;
  if (connection->caller_claimed()) caller_claims_.fetch_sub(1, std::memory_order_relaxed);
  connection->close_requested_.store(true, std::memory_order_seq_cst);
  worker->Wake();
  while (!connection->released_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  delete connection;
}

void Transport::CloseListen(ListenSocket* listener) { delete listener; }

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
