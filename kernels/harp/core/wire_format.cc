#include "kernels/harp/core/wire_format.h"

#include <cstring>

namespace tf_ext {
namespace harp HARP_HIDDEN {
namespace {

// Distinct magics per frame kind: a frame read at the wrong place fails its check.
constexpr uint32_t kHandleMagic = 0x50524148;            // "HARP"
constexpr uint32_t kHelloMagic = 0x4c4c4548;             // "HELL"
constexpr uint32_t kAckMagic = 0x4b434148;               // "HACK"
constexpr uint32_t kDescriptorMagic = 0x43534448;        // "HDSC"
constexpr uint32_t kInlineDescriptorMagic = 0x49534448;  // "HDSI": the payload follows
constexpr uint32_t kChunkMagic = 0x4b4e4348;             // "HCNK"

template <typename T>
void Put(uint8_t* bytes, size_t offset, T value) {
  std::memcpy(bytes + offset, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes + offset, sizeof(T));
  return value;
}

// FNV-1a: a garbage handle passes with probability 2^-64, not a security boundary.
uint64_t Checksum(const uint8_t* bytes, size_t size) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

constexpr size_t kHandleChecksummed = 24;

}  // namespace

void EncodeHandle(const ListenHandle& handle, void* out) {
  uint8_t* bytes = static_cast<uint8_t*>(out);
  std::memset(bytes, 0, kHandleBytes);
  Put<uint32_t>(bytes, 0, kHandleMagic);
  Put<uint16_t>(bytes, 4, kWireVersion);
  Put<uint16_t>(bytes, 6, handle.port);
  Put<uint32_t>(bytes, 8, handle.ipv4_address);
  Put<uint64_t>(bytes, 16, handle.nonce);
  Put<uint64_t>(bytes, kHandleChecksummed, Checksum(bytes, kHandleChecksummed));
}

bool DecodeHandle(const void* in, ListenHandle* handle, std::string* error) {
  const uint8_t* bytes = static_cast<const uint8_t*>(in);
  if (Get<uint32_t>(bytes, 0) != kHandleMagic) {
    *error = "not a HARP handle (bad magic)";
    return false;
  }
  if (Get<uint16_t>(bytes, 4) != kWireVersion) {
    *error = "HARP handle of wire version " + std::to_string(Get<uint16_t>(bytes, 4)) +
             ", expected " + std::to_string(kWireVersion);
    return false;
  }
  if (Get<uint64_t>(bytes, kHandleChecksummed) != Checksum(bytes, kHandleChecksummed)) {
    *error = "corrupt HARP handle (checksum mismatch)";
    return false;
  }
  handle->port = Get<uint16_t>(bytes, 6);
  handle->ipv4_address = Get<uint32_t>(bytes, 8);
  handle->nonce = Get<uint64_t>(bytes, 16);
  if (handle->port == 0 || Get<uint32_t>(bytes, 12) != 0) {
    *error = "corrupt HARP handle (port 0 or reserved bits set)";
    return false;
  }
  return true;
}

void EncodeHello(const Hello& hello, uint8_t* bytes) {
  std::memset(bytes, 0, kHelloBytes);
  Put<uint32_t>(bytes, 0, kHelloMagic);
  Put<uint16_t>(bytes, 4, kWireVersion);
  Put<uint16_t>(bytes, 6, hello.stream_index);
  Put<uint16_t>(bytes, 8, hello.stream_count);
  Put<uint64_t>(bytes, 16, hello.nonce);
  Put<uint64_t>(bytes, 24, hello.connection_id);
}

bool DecodeHello(const uint8_t* bytes, Hello* hello, std::string* error) {
  if (Get<uint32_t>(bytes, 0) != kHelloMagic || Get<uint16_t>(bytes, 4) != kWireVersion) {
    *error = "bad connection hello (magic or version)";
    return false;
  }
  hello->stream_index = Get<uint16_t>(bytes, 6);
  hello->stream_count = Get<uint16_t>(bytes, 8);
  hello->nonce = Get<uint64_t>(bytes, 16);
  hello->connection_id = Get<uint64_t>(bytes, 24);
  if (hello->stream_count == 0 || hello->stream_count > 64 ||
      hello->stream_index > hello->stream_count) {
    *error = "bad connection hello (stream " + std::to_string(hello->stream_index) + " of " +
             std::to_string(hello->stream_count) + ")";
    return false;
  }
  return true;
}

void EncodeAck(uint64_t nonce, uint8_t* bytes) {
  std::memset(bytes, 0, kAckBytes);
  Put<uint32_t>(bytes, 0, kAckMagic);
  Put<uint64_t>(bytes, 8, nonce);
}

bool DecodeAck(const uint8_t* bytes, uint64_t expected_nonce, std::string* error) {
  if (Get<uint32_t>(bytes, 0) != kAckMagic || Get<uint64_t>(bytes, 8) != expected_nonce) {
    *error = "bad connection acknowledgement from the listener";
    return false;
  }
  return true;
}

void EncodeDescriptor(const MessageDescriptor& descriptor, uint8_t* bytes) {
  Put<uint32_t>(bytes, 0, descriptor.inline_payload ? kInlineDescriptorMagic : kDescriptorMagic);
  Put<int32_t>(bytes, 4, descriptor.tag);
  Put<uint64_t>(bytes, 8, descriptor.sequence);
  Put<uint64_t>(bytes, 16, descriptor.size);
}

bool DecodeDescriptor(const uint8_t* bytes, uint64_t expected_sequence,
                      MessageDescriptor* descriptor, std::string* error) {
  const uint32_t magic = Get<uint32_t>(bytes, 0);
  if (magic != kDescriptorMagic && magic != kInlineDescriptorMagic) {
    *error = "malformed message descriptor (bad magic)";
    return false;
  }
  descriptor->inline_payload = magic == kInlineDescriptorMagic;
  descriptor->tag = Get<int32_t>(bytes, 4);
  descriptor->sequence = Get<uint64_t>(bytes, 8);
  descriptor->size = Get<uint64_t>(bytes, 16);
  if (descriptor->inline_payload &&
      (descriptor->size == 0 || descriptor->size > kMaxInlinePayloadBytes)) {
    *error = "malformed message descriptor (inline payload of " + std::to_string(descriptor->size) +
             " bytes; 1 to " + std::to_string(kMaxInlinePayloadBytes) + " allowed)";
    return false;
  }
  if (descriptor->sequence != expected_sequence) {
    *error = "message descriptor out of sequence (got " + std::to_string(descriptor->sequence) +
             ", expected " + std::to_string(expected_sequence) + ")";
    return false;
  }
  return true;
}

void EncodeChunkHeader(const ChunkHeader& header, uint8_t* bytes) {
  Put<uint32_t>(bytes, 0, kChunkMagic);
  Put<uint32_t>(bytes, 4, 0);
  Put<uint64_t>(bytes, 8, header.sequence);
  Put<uint64_t>(bytes, 16, header.offset);
  Put<uint64_t>(bytes, 24, header.length);
}

bool DecodeChunkHeader(const uint8_t* bytes, ChunkHeader* header, std::string* error) {
  if (Get<uint32_t>(bytes, 0) != kChunkMagic || Get<uint32_t>(bytes, 4) != 0) {
    *error = "malformed chunk header (bad magic)";
    return false;
  }
  header->sequence = Get<uint64_t>(bytes, 8);
  header->offset = Get<uint64_t>(bytes, 16);
  header->length = Get<uint64_t>(bytes, 24);
  if (header->length == 0 || header->length > kMaxWireChunkBytes) {
    *error = "malformed chunk header (length " + std::to_string(header->length) + ")";
    return false;
  }
  if (header->offset + header->length < header->offset) {
    *error = "malformed chunk header (offset + length overflows)";
    return false;
  }
  return true;
}

bool ChunkFitsMessage(const ChunkHeader& header, uint64_t message_size, uint64_t received,
                      std::string* error) {
  if (header.offset >= message_size || header.length > message_size - header.offset ||
      received + header.length > message_size) {
    *error = "chunk [" + std::to_string(header.offset) + ", +" + std::to_string(header.length) +
             ") does not fit message " + std::to_string(header.sequence) + " of " +
             std::to_string(message_size) + " bytes (" + std::to_string(received) + " received)";
    return false;
  }
  return true;
}

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
