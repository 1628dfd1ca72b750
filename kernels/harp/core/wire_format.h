// What HARP puts on the wire, and the checks every received byte goes through before it is used.
//
// A connection is one control socket plus N data sockets ("streams"), all TCP:
//   connection set-up: each socket opens with a Hello (which connection, which stream, the
//     listener's nonce); the listener answers on the control socket with an Ack once every stream
//     arrived, so a connector holding a stale handle (another listener's nonce) fails cleanly;
//   control socket: one MessageDescriptor per isend, in posting order (sequence, tag, size), which
//     the receiver matches against its posted receives;
//   data streams: chunks of messages, each behind a ChunkHeader (sequence, offset, length); the
//     sender gives each chunk to the free stream with the fewest unacknowledged bytes, the receiver
//     writes each payload straight into the matched receive buffer.
// All integers are in the host's byte order (NCCL runs both ends on the same architecture).
#ifndef TF_EXT_KERNELS_HARP_CORE_WIRE_FORMAT_H_
#define TF_EXT_KERNELS_HARP_CORE_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

constexpr uint16_t kWireVersion = 2;  // 2: descriptors with an inline payload

// The listen handle NCCL exchanges between ranks (at most NCCL_NET_HANDLE_MAXSIZE bytes).
constexpr size_t kHandleBytes = 128;
struct ListenHandle {
  uint32_t ipv4_address = 0;  // network byte order, as in sockaddr_in
  uint16_t port = 0;          // host byte order
  uint64_t nonce = 0;         // random per listener: a stale handle names the wrong listener
};
// Writes the handle into handle[0, kHandleBytes) (the connector-private slot zeroed).
void EncodeHandle(const ListenHandle& handle, void* bytes);
// False with `error` for anything EncodeHandle did not write (magic, version, checksum, port).
bool DecodeHandle(const void* bytes, ListenHandle* handle, std::string* error);
// A slot in the handle that NCCL keeps between the connector's repeated connect() calls: where
// the connector remembers its in-progress connection (never read from a peer).
constexpr size_t kHandleConnectorSlotOffset = 64;

constexpr size_t kHelloBytes = 32;
struct Hello {
  uint64_t nonce = 0;
  uint64_t connection_id = 0;  // random per connector: groups one connection's sockets
  uint16_t stream_index = 0;   // 0 = control, 1..stream_count = data
  uint16_t stream_count = 0;   // data streams of the connection
};
void EncodeHello(const Hello& hello, uint8_t* bytes);
bool DecodeHello(const uint8_t* bytes, Hello* hello, std::string* error);

constexpr size_t kAckBytes = 16;
void EncodeAck(uint64_t nonce, uint8_t* bytes);
bool DecodeAck(const uint8_t* bytes, uint64_t expected_nonce, std::string* error);

constexpr size_t kDescriptorBytes = 24;
// A message of 1 to kMaxInlinePayloadBytes bytes may travel whole on the control socket: its
// descriptor (another magic) followed at once by its `size` payload bytes, and no chunks. One
// segment on one socket, as small messages should be.
constexpr uint64_t kMaxInlinePayloadBytes = 1024;
struct MessageDescriptor {
  uint64_t sequence = 0;
  uint64_t size = 0;
  int32_t tag = 0;
  bool inline_payload = false;  // the payload follows the descriptor on the control socket
};
void EncodeDescriptor(const MessageDescriptor& descriptor, uint8_t* bytes);
// Checks the magic, that the sequence is the next one expected, and that an inline payload is
// 1 to kMaxInlinePayloadBytes bytes.
bool DecodeDescriptor(const uint8_t* bytes, uint64_t expected_sequence,
                      MessageDescriptor* descriptor, std::string* error);

constexpr size_t kChunkHeaderBytes = 32;
// The largest chunk a receiver accepts, whatever the sender's HARP_CHUNK_BYTES.
constexpr uint64_t kMaxWireChunkBytes = uint64_t{64} << 20;
struct ChunkHeader {
  uint64_t sequence = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
void EncodeChunkHeader(const ChunkHeader& header, uint8_t* bytes);
// Checks what the header alone can say: magic, reserved bits, 0 < length <= kMaxWireChunkBytes,
// offset + length without overflow.
bool DecodeChunkHeader(const uint8_t* bytes, ChunkHeader* header, std::string* error);
// Whether the chunk lies inside its message (of `message_size` bytes, `received` of them already
// in) and does not bring more bytes than the message has: what keeps writes inside the buffer.
bool ChunkFitsMessage(const ChunkHeader& header, uint64_t message_size, uint64_t received,
                      std::string* error);

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_WIRE_FORMAT_H_
