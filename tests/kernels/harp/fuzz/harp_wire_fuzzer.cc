// libFuzzer harness of what HARP reads from a peer (wire_format.h, transport_receive.cc): every
// frame decoder on arbitrary bytes, and a ReceiveConnection (the state machine that matches
// descriptors to posted receives and writes chunk payloads into their buffers) fed by a decoded
// script of frames over Unix socket pairs, driven without a worker thread. Whatever arrives, the
// connection completes its receives or fails with an error: no write outside a receive buffer
// (each is allocated at its exact size, so AddressSanitizer sees one byte past it), no undefined
// behaviour, no size reported larger than the receive.
//
// FuzzInput: a mode byte; mode 0: frames to decode, back to back; else the connection's set-up
// (streams, posted receives) and a script of writes to its sockets and passes of Progress().
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/wire_format.h"
#include "tests/fuzz/fuzz_input.h"

namespace harp = tf_ext::harp;

namespace {

void DecodeFrames(FuzzInput* in) {
  std::string error;
  while (!in->empty()) {
    switch (in->Byte() % 5) {
      case 0: {
        const std::vector<uint8_t> bytes = in->Bytes(harp::kHandleBytes);
        harp::ListenHandle handle;
        if (harp::DecodeHandle(bytes.data(), &handle, &error)) {
          CHECK(handle.port != 0);
          uint8_t again[harp::kHandleBytes];
          harp::EncodeHandle(handle, again);
          CHECK(memcmp(again, bytes.data(), 32) == 0);  // the checksummed part, exactly
        }
        break;
      }
      case 1: {
        const std::vector<uint8_t> bytes = in->Bytes(harp::kHelloBytes);
        harp::Hello hello;
        if (harp::DecodeHello(bytes.data(), &hello, &error)) {
          CHECK(hello.stream_count >= 1 && hello.stream_count <= 64);
          CHECK(hello.stream_index <= hello.stream_count);
        }
        break;
      }
      case 2: {
        const uint64_t nonce = in->Unsigned(8);
        const std::vector<uint8_t> bytes = in->Bytes(harp::kAckBytes);
        harp::DecodeAck(bytes.data(), nonce, &error);
        break;
      }
      case 3: {
        const uint64_t expected = in->Byte();
        const std::vector<uint8_t> bytes = in->Bytes(harp::kDescriptorBytes);
        harp::MessageDescriptor descriptor;
        if (harp::DecodeDescriptor(bytes.data(), expected, &descriptor, &error)) {
          CHECK(descriptor.sequence == expected);
          CHECK(!descriptor.inline_payload ||
                (descriptor.size >= 1 && descriptor.size <= harp::kMaxInlinePayloadBytes));
        }
        break;
      }
      default: {
        const uint64_t message_size = in->Unsigned(in->Byte() % 9);
        const uint64_t received = in->Unsigned(in->Byte() % 9);
        const std::vector<uint8_t> bytes = in->Bytes(harp::kChunkHeaderBytes);
        harp::ChunkHeader chunk;
        if (harp::DecodeChunkHeader(bytes.data(), &chunk, &error)) {
          CHECK(chunk.length >= 1 && chunk.length <= harp::kMaxWireChunkBytes);
          CHECK(chunk.offset + chunk.length >= chunk.offset);
          if (harp::ChunkFitsMessage(chunk, message_size, received, &error)) {
            CHECK(chunk.offset + chunk.length <= message_size);
            CHECK(received + chunk.length <= message_size && received <= message_size);
          }
        }
      }
    }
  }
}

// Writes all of `bytes` to a non-blocking socket whose peer buffers far more than a script sends.
void WriteAll(int fd, const void* bytes, size_t n) {
  if (n > 0) CHECK(send(fd, bytes, n, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(n));
}

void DriveReceiver(FuzzInput* in) {
  const int streams = 1 + in->Byte() % 3;
  int control[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, control) == 0);
  std::vector<int> local, peer;
  for (int i = 0; i < streams; ++i) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair) == 0);
    local.push_back(pair[0]);
    peer.push_back(pair[1]);
  }
  auto connection = std::make_unique<harp::ReceiveConnection>(control[0], local);

  // Up to three grouped receives of one to three buffers, each buffer exactly its capacity.
  struct Posted {
    harp::Request* request = nullptr;
    int count = 0;
    uint64_t capacity[3] = {};
    bool tested = false;
  };
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<Posted> posted(1 + in->Byte() % 3);
  for (Posted& receive : posted) {
    receive.count = 1 + in->Byte() % 3;
    void* data[3];
    int tags[3];
    for (int b = 0; b < receive.count; ++b) {
      receive.capacity[b] = in->Byte() % 4 == 0 ? 0 : in->Unsigned(2) % 3000;
      buffers.emplace_back(new uint8_t[receive.capacity[b]]);
      data[b] = buffers.back().get();
      tags[b] = in->Byte() % 3;
    }
    CHECK(harp::Transport::PostReceive(connection.get(), receive.count, data, receive.capacity,
                                       tags, &receive.request) == harp::Status::kOk);
    CHECK(receive.request != nullptr);
  }

  uint64_t described = 0;  // descriptors written, for well-sequenced ones
  size_t written = 0;      // bounded far below what a Unix socket buffers
  bool control_open = true;
  std::vector<bool> stream_open(streams, true);  // a socket shut for writing takes no more
  for (int op = 0; !in->empty() && op < 48 && written < 32 * 1024; ++op) {
    const uint8_t code = in->Byte() % 6;
    const int stream = in->Byte() % streams;
    switch (code) {
      case 0: {  // a descriptor, usually in sequence, maybe with its inline payload
        if (!control_open) break;
        harp::MessageDescriptor descriptor;
        const uint8_t shape = in->Byte();
        descriptor.sequence = shape & 1 ? in->Unsigned(1) : described;
        descriptor.inline_payload = shape & 2;
        descriptor.tag = in->Byte() % 4;
        descriptor.size = shape & 4 ? in->Unsigned(8) : in->Unsigned(2) % 3200;
        uint8_t bytes[harp::kDescriptorBytes];
        harp::EncodeDescriptor(descriptor, bytes);
        WriteAll(control[1], bytes, sizeof(bytes));
        written += sizeof(bytes);
        if (descriptor.inline_payload && descriptor.size <= harp::kMaxInlinePayloadBytes) {
          const std::vector<uint8_t> payload = in->Bytes(descriptor.size);
          WriteAll(control[1], payload.data(), payload.size());
          written += payload.size();
        }
        ++described;
        break;
      }
      case 1: {  // raw bytes on the control socket
        if (!control_open) break;
        const std::vector<uint8_t> bytes = in->Bytes(in->Byte() % 48);
        WriteAll(control[1], bytes.data(), bytes.size());
        written += bytes.size();
        break;
      }
      case 2: {  // a chunk: its header and up to its length of payload
        if (!stream_open[stream]) break;
        harp::ChunkHeader chunk;
        chunk.sequence = in->Byte() % 8;
        chunk.offset = in->Byte() & 0x80 ? in->Unsigned(8) : in->Unsigned(2) % 3200;
        chunk.length = in->Byte() & 0x80 ? in->Unsigned(8) : in->Unsigned(2) % 3200;
        uint8_t header[harp::kChunkHeaderBytes];
        harp::EncodeChunkHeader(chunk, header);
        WriteAll(peer[stream], header, sizeof(header));
        const size_t payload = chunk.length < 4096 ? chunk.length : in->Byte();
        const std::vector<uint8_t> bytes(payload, 0xA5);
        WriteAll(peer[stream], bytes.data(), bytes.size());
        written += sizeof(header) + payload;
        break;
      }
      case 3: {  // raw bytes on a stream
        if (!stream_open[stream]) break;
        const std::vector<uint8_t> bytes = in->Bytes(in->Byte() % 48);
        WriteAll(peer[stream], bytes.data(), bytes.size());
        written += bytes.size();
        break;
      }
      case 4:  // the peer closes a socket
        if (in->Byte() & 1) {
          shutdown(control[1], SHUT_WR);
          control_open = false;
        } else {
          shutdown(peer[stream], SHUT_WR);
          stream_open[stream] = false;
        }
        break;
      default:
        connection->Progress();
    }
  }
  for (int pass = 0; pass < 8; ++pass) connection->Progress();

  for (Posted& receive : posted) {
    bool done = false;
    uint64_t sizes[harp::kMaxReceivesPerRequest];
    std::string error;
    const harp::Status status = harp::Transport::TestRequest(receive.request, &done, sizes, &error);
    CHECK(status == harp::Status::kOk || status == harp::Status::kRemote);
    CHECK(status == harp::Status::kOk || !error.empty());
    if (done) {
      for (int b = 0; b < receive.count; ++b) CHECK(sizes[b] <= receive.capacity[b]);
    }
  }
  connection.reset();  // closes its ends before the buffers go
  close(control[1]);
  for (int fd : peer) close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  if (in.Byte() % 2 == 0) {
    DecodeFrames(&in);
  } else {
    DriveReceiver(&in);
  }
  return 0;
}
