// HARP's frames: every field check of the decoders, then the receive path itself (a
// ReceiveConnection over socket pairs, driven by hand) fed with well-formed, mutated, truncated
// and random frames. The receive buffers are exactly the posted sizes, so under AddressSanitizer
// any write outside them fails the test; the fuzz must end with the request done (only for
// well-formed input), failed, or still pending, and never with a wrong size.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/wire_format.h"

namespace {

using tf_ext::harp::ChunkFitsMessage;
using tf_ext::harp::ChunkHeader;
using tf_ext::harp::DecodeAck;
using tf_ext::harp::DecodeChunkHeader;
using tf_ext::harp::DecodeDescriptor;
using tf_ext::harp::DecodeHandle;
using tf_ext::harp::DecodeHello;
using tf_ext::harp::EncodeAck;
using tf_ext::harp::EncodeChunkHeader;
using tf_ext::harp::EncodeDescriptor;
using tf_ext::harp::EncodeHandle;
using tf_ext::harp::EncodeHello;
using tf_ext::harp::Hello;
using tf_ext::harp::ListenHandle;
using tf_ext::harp::MessageDescriptor;
using tf_ext::harp::ReceiveConnection;
using tf_ext::harp::Request;
using tf_ext::harp::Status;
using tf_ext::harp::Transport;
namespace harp = tf_ext::harp;

TEST(HarpWireFormatTest, HandleRoundTripAndRejections) {
  uint8_t bytes[harp::kHandleBytes];
  EncodeHandle(ListenHandle{0x0100007f, 4242, 0x1234567890abcdefull}, bytes);
  ListenHandle decoded;
  std::string error;
  ASSERT_TRUE(DecodeHandle(bytes, &decoded, &error)) << error;
  EXPECT_EQ(decoded.ipv4_address, 0x0100007fu);
  EXPECT_EQ(decoded.port, 4242);
  EXPECT_EQ(decoded.nonce, 0x1234567890abcdefull);
  // The connector slot is not covered: NCCL's copy of the handle carries HARP's own state there.
  std::memset(bytes + harp::kHandleConnectorSlotOffset, 0xff, 8);
  EXPECT_TRUE(DecodeHandle(bytes, &decoded, &error)) << error;
  // Any flipped bit of the checked part is rejected.
  for (size_t bit = 0; bit < 32 * 8; ++bit) {
    uint8_t flipped[harp::kHandleBytes];
    std::memcpy(flipped, bytes, sizeof(flipped));
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_FALSE(DecodeHandle(flipped, &decoded, &error)) << "bit " << bit;
  }
  uint8_t zeros[harp::kHandleBytes] = {};
  EXPECT_FALSE(DecodeHandle(zeros, &decoded, &error));
  EXPECT_NE(error.find("not a HARP handle"), std::string::npos);
  std::mt19937_64 random(7);
  for (int i = 0; i < 1000; ++i) {
    uint8_t garbage[harp::kHandleBytes];
    for (uint8_t& byte : garbage) byte = static_cast<uint8_t>(random());
    EXPECT_FALSE(DecodeHandle(garbage, &decoded, &error));
  }
}

TEST(HarpWireFormatTest, HelloAndAck) {
  uint8_t bytes[harp::kHelloBytes];
  EncodeHello(Hello{11, 22, 3, 4}, bytes);
  Hello hello;
  std::string error;
  ASSERT_TRUE(DecodeHello(bytes, &hello, &error)) << error;
  EXPECT_EQ(hello.nonce, 11u);
  EXPECT_EQ(hello.connection_id, 22u);
  EXPECT_EQ(hello.stream_index, 3);
  EXPECT_EQ(hello.stream_count, 4);
  EncodeHello(Hello{11, 22, 5, 4}, bytes);  // index beyond the count
  EXPECT_FALSE(DecodeHello(bytes, &hello, &error));
  EncodeHello(Hello{11, 22, 0, 0}, bytes);
  EXPECT_FALSE(DecodeHello(bytes, &hello, &error));
  bytes[0] ^= 1;
  EXPECT_FALSE(DecodeHello(bytes, &hello, &error));
  uint8_t ack[harp::kAckBytes];
  EncodeAck(99, ack);
  EXPECT_TRUE(DecodeAck(ack, 99, &error));
  EXPECT_FALSE(DecodeAck(ack, 98, &error));
}

TEST(HarpWireFormatTest, DescriptorChecksMagicAndSequence) {
  uint8_t bytes[harp::kDescriptorBytes];
  EncodeDescriptor(MessageDescriptor{5, 1000, -3}, bytes);
  MessageDescriptor descriptor;
  std::string error;
  ASSERT_TRUE(DecodeDescriptor(bytes, 5, &descriptor, &error)) << error;
  EXPECT_EQ(descriptor.size, 1000u);
  EXPECT_EQ(descriptor.tag, -3);
  EXPECT_FALSE(DecodeDescriptor(bytes, 6, &descriptor, &error));
  EXPECT_NE(error.find("out of sequence"), std::string::npos);
  bytes[1] ^= 0x40;
  EXPECT_FALSE(DecodeDescriptor(bytes, 5, &descriptor, &error));
}

TEST(HarpWireFormatTest, InlineDescriptorChecksItsPayloadSize) {
  uint8_t bytes[harp::kDescriptorBytes];
  MessageDescriptor descriptor;
  std::string error;
  EncodeDescriptor(MessageDescriptor{2, 8, 4, true}, bytes);
  ASSERT_TRUE(DecodeDescriptor(bytes, 2, &descriptor, &error)) << error;
  EXPECT_TRUE(descriptor.inline_payload);
  EXPECT_EQ(descriptor.size, 8u);
  EncodeDescriptor(MessageDescriptor{2, 8, 4}, bytes);
  ASSERT_TRUE(DecodeDescriptor(bytes, 2, &descriptor, &error)) << error;
  EXPECT_FALSE(descriptor.inline_payload);
  for (uint64_t size : {uint64_t{0}, harp::kMaxInlinePayloadBytes + 1, ~uint64_t{0}}) {
    EncodeDescriptor(MessageDescriptor{2, size, 4, true}, bytes);
    EXPECT_FALSE(DecodeDescriptor(bytes, 2, &descriptor, &error)) << size;
    EXPECT_NE(error.find("inline payload"), std::string::npos) << error;
  }
}

TEST(HarpWireFormatTest, ChunkHeaderChecks) {
  uint8_t bytes[harp::kChunkHeaderBytes];
  ChunkHeader header;
  std::string error;
  EncodeChunkHeader(ChunkHeader{1, 4096, 4096}, bytes);
  ASSERT_TRUE(DecodeChunkHeader(bytes, &header, &error)) << error;
  EXPECT_TRUE(ChunkFitsMessage(header, 8192, 0, &error)) << error;
  EXPECT_FALSE(ChunkFitsMessage(header, 8191, 0, &error));     // past the end
  EXPECT_FALSE(ChunkFitsMessage(header, 8192, 4097, &error));  // more bytes than the message
  EXPECT_FALSE(ChunkFitsMessage(header, 4096, 0, &error));     // starts at the end
  EncodeChunkHeader(ChunkHeader{1, 0, 0}, bytes);              // empty chunk
  EXPECT_FALSE(DecodeChunkHeader(bytes, &header, &error));
  EncodeChunkHeader(ChunkHeader{1, 0, harp::kMaxWireChunkBytes + 1}, bytes);
  EXPECT_FALSE(DecodeChunkHeader(bytes, &header, &error));
  EncodeChunkHeader(ChunkHeader{1, ~uint64_t{0} - 10, 100}, bytes);  // offset + length overflows
  EXPECT_FALSE(DecodeChunkHeader(bytes, &header, &error));
  EncodeChunkHeader(ChunkHeader{1, 0, 16}, bytes);
  bytes[5] = 1;  // reserved
  EXPECT_FALSE(DecodeChunkHeader(bytes, &header, &error));
  header = ChunkHeader{1, ~uint64_t{0} - 10, 100};
  EXPECT_FALSE(ChunkFitsMessage(header, ~uint64_t{0}, 0, &error));
}

// A ReceiveConnection whose peer ends are plain sockets the test writes into.
class RogueSender {
 public:
  explicit RogueSender(int streams) {
    int pair[2];
    for (int i = 0; i <= streams; ++i) {
      EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair), 0);
      (i == 0 ? control_ : stream_fds_.emplace_back()) = pair[0];
      peers_.push_back(pair[1]);
    }
    connection_.reset(new ReceiveConnection(control_, stream_fds_));
  }
  ~RogueSender() {
    connection_.reset();
    for (int fd : peers_) close(fd);
  }
  ReceiveConnection* connection() { return connection_.get(); }
  // Socket 0 is the control socket, 1.. the streams.
  void Write(int socket, const std::vector<uint8_t>& bytes) {
    if (!bytes.empty()) {
      ssize_t ignored = send(peers_[socket], bytes.data(), bytes.size(), MSG_DONTWAIT);
      (void)ignored;
    }
  }
  void Close(int socket) { shutdown(peers_[socket], SHUT_WR); }
  void Drive() {
    for (int quiet = 0, i = 0; quiet < 3 && i < 1000; ++i) {
      quiet = connection_->Progress() ? 0 : quiet + 1;
    }
  }

 private:
  int control_ = -1;
  std::vector<int> stream_fds_;
  std::vector<int> peers_;
  std::unique_ptr<ReceiveConnection> connection_;
};

std::vector<uint8_t> Descriptor(uint64_t sequence, uint64_t size, int tag) {
  std::vector<uint8_t> bytes(harp::kDescriptorBytes);
  EncodeDescriptor(MessageDescriptor{sequence, size, tag}, bytes.data());
  return bytes;
}

// A descriptor with its payload inline (on the control socket).
std::vector<uint8_t> InlineMessage(uint64_t sequence, const std::vector<uint8_t>& payload, int tag,
                                   uint64_t claimed_size = 0) {
  std::vector<uint8_t> bytes(harp::kDescriptorBytes);
  EncodeDescriptor(
      MessageDescriptor{sequence, claimed_size ? claimed_size : payload.size(), tag, true},
      bytes.data());
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

std::vector<uint8_t> Chunk(uint64_t sequence, uint64_t offset, const std::vector<uint8_t>& payload,
                           uint64_t claimed_length = 0) {
  std::vector<uint8_t> bytes(harp::kChunkHeaderBytes);
  EncodeChunkHeader(ChunkHeader{sequence, offset, claimed_length ? claimed_length : payload.size()},
                    bytes.data());
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

TEST(HarpWireFormatTest, WellFormedFramesFillTheReceive) {
  RogueSender sender(2);
  std::vector<uint8_t> buffer(100), payload(60);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  void* data[] = {buffer.data()};
  uint64_t sizes[] = {buffer.size()};
  int tags[] = {9};
  Request* request = nullptr;
  ASSERT_EQ(Transport::PostReceive(sender.connection(), 1, data, sizes, tags, &request),
            Status::kOk);
  ASSERT_NE(request, nullptr);
  sender.Write(1, Chunk(0, 40, std::vector<uint8_t>(payload.begin() + 40, payload.end())));
  sender.Drive();  // the chunk waits for its descriptor
  sender.Write(0, Descriptor(0, 60, 9));
  sender.Write(2, Chunk(0, 0, std::vector<uint8_t>(payload.begin(), payload.begin() + 40)));
  sender.Drive();
  bool done = false;
  uint64_t got[8];
  std::string error;
  ASSERT_EQ(Transport::TestRequest(request, &done, got, &error), Status::kOk) << error;
  ASSERT_TRUE(done);
  EXPECT_EQ(got[0], 60u);  // the message's size, not the posted one
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), buffer.begin()));
}

TEST(HarpWireFormatTest, InlineMessagesFillTheReceive) {
  RogueSender sender(2);
  std::vector<uint8_t> first(30), second(100, 0xee), payload(30);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 5 + 1);
  Request* requests[2] = {};
  for (int r = 0; r < 2; ++r) {
    void* data[] = {r == 0 ? first.data() : second.data()};
    uint64_t sizes[] = {r == 0 ? first.size() : second.size()};
    int tags[] = {9};
    ASSERT_EQ(Transport::PostReceive(sender.connection(), 1, data, sizes, tags, &requests[r]),
              Status::kOk);
  }
  // The second arrives in two pieces: it completes only once its payload is whole.
  std::vector<uint8_t> bytes = InlineMessage(0, payload, 9);
  std::vector<uint8_t> next =
      InlineMessage(1, std::vector<uint8_t>(payload.begin(), payload.end() - 3), 9);
  bytes.insert(bytes.end(), next.begin(), next.begin() + 30);
  sender.Write(0, bytes);
  sender.Drive();
  bool done = false;
  uint64_t got[8];
  std::string error;
  ASSERT_EQ(Transport::TestRequest(requests[0], &done, got, &error), Status::kOk) << error;
  ASSERT_TRUE(done);
  EXPECT_EQ(got[0], 30u);
  EXPECT_EQ(first, payload);
  ASSERT_EQ(Transport::TestRequest(requests[1], &done, got, &error), Status::kOk) << error;
  EXPECT_FALSE(done);
  sender.Write(0, std::vector<uint8_t>(next.begin() + 30, next.end()));
  sender.Drive();
  ASSERT_EQ(Transport::TestRequest(requests[1], &done, got, &error), Status::kOk) << error;
  ASSERT_TRUE(done);
  EXPECT_EQ(got[0], 27u);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end() - 3, second.begin()));
  EXPECT_EQ(second[27], 0xee);  // nothing past the message
}

TEST(HarpWireFormatTest, MalformedFramesFailTheConnection) {
  struct Case {
    const char* name;
    std::function<void(RogueSender*)> write;
    const char* expected;
  };
  const std::vector<uint8_t> payload(16, 1);
  std::vector<Case> cases = {
      {"bad descriptor magic", [&](RogueSender* s) { s->Write(0, std::vector<uint8_t>(24, 0xab)); },
       "bad magic"},
      {"descriptor out of sequence", [&](RogueSender* s) { s->Write(0, Descriptor(3, 16, 1)); },
       "out of sequence"},
      {"message larger than the receive",
       [&](RogueSender* s) { s->Write(0, Descriptor(0, 65, 1)); }, "larger than its posted"},
      {"chunk past the message",
       [&](RogueSender* s) {
         s->Write(0, Descriptor(0, 16, 1));
         s->Write(1, Chunk(0, 8, payload));
       },
       "does not fit"},
      {"chunk of a finished message",
       [&](RogueSender* s) {
         s->Write(0, Descriptor(0, 16, 1));
         s->Write(1, Chunk(0, 0, payload));
         s->Write(2, Chunk(0, 0, payload));
       },
       "which is complete"},
      {"chunk far ahead", [&](RogueSender* s) { s->Write(1, Chunk(100000, 0, payload)); },
       "far beyond"},
      {"truncated header",
       [&](RogueSender* s) {
         s->Write(1, std::vector<uint8_t>(10, 0));
         s->Close(1);
       },
       "inside a chunk header"},
      {"truncated payload",
       [&](RogueSender* s) {
         s->Write(0, Descriptor(0, 16, 1));
         std::vector<uint8_t> chunk = Chunk(0, 0, payload);
         chunk.resize(chunk.size() - 4);
         s->Write(1, chunk);
         s->Close(1);
       },
       "middle of a chunk"},
      {"peer closed with receives posted", [&](RogueSender* s) { s->Close(0); },
       "receives still posted"},
      {"inline payload larger than the receive",
       [&](RogueSender* s) { s->Write(0, InlineMessage(0, std::vector<uint8_t>(65, 2), 1)); },
       "larger than its posted"},
      {"inline payload too large for the wire",
       [&](RogueSender* s) {
         s->Write(0, InlineMessage(0, payload, 1, harp::kMaxInlinePayloadBytes + 1));
       },
       "inline payload"},
      {"truncated inline payload",
       [&](RogueSender* s) {
         std::vector<uint8_t> message = InlineMessage(0, payload, 1);
         message.resize(message.size() - 5);
         s->Write(0, message);
         s->Close(0);
       },
       "inside a descriptor"},
  };
  for (const Case& c : cases) {
    RogueSender sender(2);
    std::vector<uint8_t> buffer(64);
    void* data[] = {buffer.data()};
    uint64_t sizes[] = {buffer.size()};
    int tags[] = {1};
    Request* request = nullptr;
    ASSERT_EQ(Transport::PostReceive(sender.connection(), 1, data, sizes, tags, &request),
              Status::kOk);
    c.write(&sender);
    sender.Drive();
    bool done = false;
    uint64_t got[8];
    std::string error;
    EXPECT_EQ(Transport::TestRequest(request, &done, got, &error), Status::kRemote) << c.name;
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.name << ": " << error;
    EXPECT_TRUE(sender.connection()->failed()) << c.name;
  }
}

// >= 10,000 frames: valid message streams with random mutations (bit flips, truncation, field
// rewrites, garbage, dropped or duplicated frames) against receives of random sizes.
TEST(HarpWireFormatTest, FuzzedFramesNeverOverflow) {
  std::mt19937_64 random(12345);
  auto uniform = [&](uint64_t below) { return below ? random() % below : 0; };
  int frames = 0, failed = 0, completed = 0;
  for (int round = 0; frames < 10000; ++round) {
    const int streams = 1 + static_cast<int>(uniform(3));
    RogueSender sender(streams);
    // Two receives, the second grouped, with exact-size buffers (ASan sees any overflow).
    std::vector<std::vector<uint8_t>> buffers;
    const int tags[] = {1, 2, 3};
    for (int b = 0; b < 3; ++b) buffers.emplace_back(uniform(3000));
    void* data[3];
    uint64_t sizes[3];
    for (int b = 0; b < 3; ++b) {
      data[b] = buffers[b].data();
      sizes[b] = buffers[b].size();
    }
    Request* requests[2] = {};
    ASSERT_EQ(Transport::PostReceive(sender.connection(), 1, data, sizes, tags, &requests[0]),
              Status::kOk);
    ASSERT_EQ(
        Transport::PostReceive(sender.connection(), 2, data + 1, sizes + 1, tags + 1, &requests[1]),
        Status::kOk);
    // The frames a correct sender would write: 3 messages no larger than their receives.
    struct Frame {
      int socket;
      std::vector<uint8_t> bytes;
    };
    std::vector<Frame> frames_to_send;
    for (uint64_t sequence = 0; sequence < 3; ++sequence) {
      const uint64_t size = uniform(buffers[sequence].size() + 1);
      frames_to_send.push_back({0, Descriptor(sequence, size, tags[sequence])});
      for (uint64_t offset = 0; offset < size;) {
        uint64_t length = std::min<uint64_t>(size - offset, 1 + uniform(1500));
        frames_to_send.push_back({1 + static_cast<int>(uniform(streams)),
                                  Chunk(sequence, offset, std::vector<uint8_t>(length, 0x5a))});
        offset += length;
      }
    }
    const bool mutate = round % 8 != 0;  // every 8th round stays well-formed
    if (mutate) {
      for (int m = 0, mutations = 1 + static_cast<int>(uniform(3)); m < mutations; ++m) {
        Frame& frame = frames_to_send[uniform(frames_to_send.size())];
        switch (uniform(7)) {
          case 0:  // flip a bit anywhere
            frame.bytes[uniform(frame.bytes.size())] ^= static_cast<uint8_t>(1u << uniform(8));
            break;
          case 1:  // truncate
            frame.bytes.resize(uniform(frame.bytes.size()));
            break;
          case 2:  // rewrite a 64-bit header field with something hostile
          {
            const uint64_t hostile[] = {0,        1,    ~uint64_t{0}, uint64_t{1} << 63,
                                        random(), 4096, 3000};
            uint64_t value = hostile[uniform(7)];
            if (frame.bytes.size() >= 24) std::memcpy(&frame.bytes[8 + 8 * uniform(2)], &value, 8);
            break;
          }
          case 3:  // replace with garbage
            for (uint8_t& byte : frame.bytes) byte = static_cast<uint8_t>(random());
            break;
          case 4:  // duplicate
            frames_to_send.push_back(frame);
            break;
          case 5:  // send on another socket
            frame.socket = static_cast<int>(uniform(streams + 1));
            break;
          default:  // drop
            frame.bytes.clear();
            break;
        }
      }
      std::shuffle(frames_to_send.begin(), frames_to_send.end(), random);
    }
    for (const Frame& frame : frames_to_send) {
      sender.Write(frame.socket, frame.bytes);
      if (uniform(4) == 0) sender.Drive();
    }
    frames += static_cast<int>(frames_to_send.size());
    if (uniform(2) == 0) {
      for (int socket = 0; socket <= streams; ++socket) sender.Close(socket);
    }
    sender.Drive();
    for (Request* request : requests) {
      bool done = false;
      uint64_t got[8] = {};
      std::string error;
      Status status = Transport::TestRequest(request, &done, got, &error);
      if (status != Status::kOk) {
        ++failed;
        EXPECT_FALSE(error.empty());
        continue;
      }
      if (!done) continue;
      ++completed;
      for (int b = 0; b < request->count; ++b) {
        EXPECT_LE(got[b], request->buffers[b].capacity);
      }
    }
    if (!mutate) {
      EXPECT_FALSE(sender.connection()->failed()) << sender.connection()->failure();
    }
  }
  EXPECT_GE(frames, 10000);
  EXPECT_GT(failed, 0);
  EXPECT_GT(completed, 0);
}

}  // namespace
