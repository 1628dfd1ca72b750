#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
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

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
