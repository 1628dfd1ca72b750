#include <errno.h>
#include <time.h>

// After time.h: linux/errqueue.h uses struct timespec without declaring it.
#include <linux/errqueue.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/transport_internal.h"
#include "kernels/harp/core/wire_format.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

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

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
