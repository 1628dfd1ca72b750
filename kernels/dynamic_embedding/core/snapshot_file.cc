#include "kernels/dynamic_embedding/core/snapshot_file.h"

#include <algorithm>
#include <array>
#include <limits>

#include "kernels/dynamic_embedding/core/initializers.h"

namespace tf_ext {
namespace de {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'E', 'X', 'T', 'S', 'N', 'P'};
constexpr uint32_t kMaxNameBytes = 1 << 16;
// The largest dim and slot count a header may declare; more is corruption. They bound what the
// reader allocates (a row: dim * (1 + num_slots) floats, about 4 MiB at most, under a block's
// kMaxPayload), and are on purpose looser than the table's kMaxDim and kMaxSlots
// (embedding_table.h): a well-formed file of a dim or slot count this build's table refuses is
// read, and the restore kernel says what does not fit, not that the file is corrupt.
constexpr uint32_t kMaxHeaderSlots = 16;
constexpr uint32_t kMaxHeaderDim = 1 << 16;
// A block's payload never exceeds a chunk plus one record; a larger count is corruption.
constexpr uint32_t kMaxPayload = 64u << 20;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[i] = crc;
  }
  return table;
}

uint32_t Crc32cPortable(uint32_t crc, const char* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  for (size_t i = 0; i < n; ++i) {
    crc = table[(crc ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (crc >> 8);
  }
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const char* data,
                                                          size_t n) {
  uint64_t wide = crc;
  for (; n >= 8; n -= 8, data += 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    wide = __builtin_ia32_crc32di(wide, word);
  }
  uint32_t narrow = static_cast<uint32_t>(wide);
  for (; n > 0; --n, ++data) narrow = __builtin_ia32_crc32qi(narrow, static_cast<uint8_t>(*data));
  return narrow;
}
#endif

// Little-endian field readers over a byte buffer, checking bounds.
class Cursor {
 public:
  Cursor(const char* data, size_t n) : data_(data), end_(data + n) {}
  template <typename T>
  bool Get(T* out) {
    if (static_cast<size_t>(end_ - data_) < sizeof(T)) return false;
    std::memcpy(out, data_, sizeof(T));
    data_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, const char** out) {
    if (static_cast<size_t>(end_ - data_) < n) return false;
    *out = data_;
    data_ += n;
    return true;
  }
  bool AtEnd() const { return data_ == end_; }

 private:
  const char* data_;
  const char* end_;
};

template <typename T>
void PutField(std::string* out, const T& value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const char* data, size_t n) {
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  crc = hardware ? Crc32cHardware(crc, data, n) : Crc32cPortable(crc, data, n);
#else
  crc = Crc32cPortable(crc, data, n);
#endif
  return ~crc;
}

uint64_t MinimumSnapshotBytes(const SnapshotHeader& header) {
  using Wide = unsigned __int128;  // no product of 64-bit counts overflows it
  const bool with_admission = header.admission != SnapshotAdmission::kNone;
  const bool with_initializer_version = header.initializer_version != 1;
  const Wide key = header.key_type == SnapshotKeyType::kString ? 4 : 8;  // a string's length
  const Wide row = key + 4 + 8 + Wide{4} * header.dim * (1 + Wide{header.num_slots});
  const Wide counters = header.admission == SnapshotAdmission::kSketch
                            ? Wide{header.sketch_width} * header.sketch_depth
                            : 0;
  const Wide head = sizeof(kMagic) + 5 * 4 + 5 * 8 +
                    (with_admission || with_initializer_version ? 16 : 0) +
                    (with_initializer_version ? 4 : 0) + Wide{4} * header.num_slots + 4 +
                    header.table_name.size() + 4;
  const Wide end = 16 + (with_admission ? 32 : 16);
  const Wide total =
      head + Wide{header.rows} * row + Wide{header.tombstones} * key + counters * 4 + end;
  return total > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                      : static_cast<uint64_t>(total);
}

// ---- writer ----------------------------------------------------------------------------------

bool SnapshotWriter::Write(const char* data, size_t n) {
  if (n > max_bytes_ - bytes_written_) {
    over_limit_bytes_ = bytes_written_ + n;
    return false;
  }
  if (!sink_->Append(data, n)) return false;
  bytes_written_ += n;
  return true;
}

bool SnapshotWriter::Begin(const SnapshotHeader& header) {
  const uint64_t claimed = MinimumSnapshotBytes(header);
  if (claimed > max_bytes_) {
    over_limit_bytes_ = claimed;
    return false;
  }
  dim_ = header.dim;
  num_slots_ = header.num_slots;
  expected_rows_ = header.rows;
  expected_tombstones_ = header.tombstones;
  admission_ = header.admission;
  expected_counters_ =
      admission_ == SnapshotAdmission::kSketch ? header.sketch_width * header.sketch_depth : 0;
  const bool with_admission = admission_ != SnapshotAdmission::kNone;
  const bool with_initializer_version = header.initializer_version != 1;
  std::string bytes(kMagic, sizeof(kMagic));
  PutField(&bytes, with_initializer_version ? kSnapshotFormatVersionWithInitializerVersion
                   : with_admission         ? kSnapshotFormatVersion
                                            : kSnapshotFormatVersionWithoutAdmission);
  PutField(&bytes, static_cast<uint32_t>(header.kind));
  PutField(&bytes, static_cast<uint32_t>(header.key_type));
  PutField(&bytes, header.dim);
  PutField(&bytes, header.num_slots);
  PutField(&bytes, header.chain_id);
  PutField(&bytes, header.sequence);
  PutField(&bytes, header.step);
  PutField(&bytes, header.rows);
  PutField(&bytes, header.tombstones);
  if (with_admission || with_initializer_version) {
    PutField(&bytes, static_cast<uint32_t>(header.admission));
    PutField(&bytes, header.sketch_depth);
    PutField(&bytes, header.sketch_width);
  }
  if (with_initializer_version) PutField(&bytes, header.initializer_version);
  for (uint32_t s = 0; s < header.num_slots; ++s) PutField(&bytes, header.slot_initial_values[s]);
  PutField(&bytes, static_cast<uint32_t>(header.table_name.size()));
  bytes += header.table_name;
  PutField(&bytes, Crc32c(0, bytes.data(), bytes.size()));
  chunk_.reserve(kSnapshotChunkBytes + 4096);
  return Write(bytes.data(), bytes.size());
}

bool SnapshotWriter::StartRecord(BlockType type) {
  // Tombstones after rows could not be replayed in a pass.
  if (BlockOrder(type) < BlockOrder(chunk_type_)) return false;
  if (type != chunk_type_) {
    if (!FlushChunk()) return false;
    chunk_type_ = type;
  }
  return true;
}

bool SnapshotWriter::EndRecord() {
  ++chunk_records_;
  ++records_[chunk_type_];
  return chunk_.size() < kSnapshotChunkBytes || FlushChunk();
}

bool SnapshotWriter::SketchCounters(const uint32_t* counters, size_t n) {
  if (admission_ != SnapshotAdmission::kSketch || records_[kSketch] + n > expected_counters_) {
    return false;
  }
  while (n > 0) {
    if (!StartRecord(kSketch)) return false;
    const size_t room = (kSnapshotChunkBytes - chunk_.size()) / sizeof(uint32_t);
    const size_t take = std::min(n, std::max<size_t>(room, 1));
    Append(reinterpret_cast<const char*>(counters), sizeof(uint32_t) * take);
    chunk_records_ += static_cast<uint32_t>(take);
    records_[kSketch] += take;
    counters += take;
    n -= take;
    if (chunk_.size() >= kSnapshotChunkBytes && !FlushChunk()) return false;
  }
  return true;
}

bool SnapshotWriter::FlushChunk() {
  if (chunk_records_ == 0 && chunk_type_ != kEnd) return true;
  std::string head;
  PutField(&head, static_cast<uint32_t>(chunk_type_));
  PutField(&head, chunk_records_);
  PutField(&head, static_cast<uint32_t>(chunk_.size()));
  const uint32_t crc = Crc32c(Crc32c(0, head.data(), head.size()), chunk_.data(), chunk_.size());
  PutField(&head, crc);
  const bool ok = Write(head.data(), head.size()) && Write(chunk_.data(), chunk_.size());
  chunk_.clear();
  chunk_records_ = 0;
  return ok;
}

bool SnapshotWriter::Finish() {
  if (records_[kRows] != expected_rows_ || records_[kTombstones] != expected_tombstones_ ||
      records_[kSketch] != expected_counters_) {
    return false;
  }
  if (!FlushChunk()) return false;
  chunk_type_ = kEnd;
  PutField(&chunk_, records_[kRows]);
  PutField(&chunk_, records_[kTombstones]);
  if (admission_ != SnapshotAdmission::kNone) {
    PutField(&chunk_, records_[kPending]);
    PutField(&chunk_, records_[kSketch]);
  }
  return FlushChunk();
}

// ---- reader ----------------------------------------------------------------------------------

std::string SnapshotReader::ReadHeader(SnapshotHeader* header) {
  // The fixed part, then the slot values and the name, whose sizes it gives.
  constexpr size_t kFixed = sizeof(kMagic) + 5 * 4 + 5 * 8;
  std::string bytes(kFixed, '\0');
  if (!ReadExact(bytes.data(), kFixed)) return "too short for a snapshot header";
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return "not a tf_ext table snapshot (bad magic)";
  }
  Cursor cursor(bytes.data() + sizeof(kMagic), kFixed - sizeof(kMagic));
  uint32_t version = 0, kind = 0, key_type = 0;  // a short read leaves them invalid
  SnapshotHeader h;
  cursor.Get(&version);
  cursor.Get(&kind);
  cursor.Get(&key_type);
  cursor.Get(&h.dim);
  cursor.Get(&h.num_slots);
  cursor.Get(&h.chain_id);
  cursor.Get(&h.sequence);
  cursor.Get(&h.step);
  cursor.Get(&h.rows);
  cursor.Get(&h.tombstones);
  if (version < kSnapshotFormatVersionWithoutAdmission ||
      version > kSnapshotFormatVersionWithInitializerVersion) {
    return "snapshot format version " + std::to_string(version) + ", this build reads versions " +
           std::to_string(kSnapshotFormatVersionWithoutAdmission) + " to " +
           std::to_string(kSnapshotFormatVersionWithInitializerVersion);
  }
  if (kind > 1 || key_type > 1 || h.dim == 0 || h.dim > kMaxHeaderDim ||
      h.num_slots > kMaxHeaderSlots) {
    return "corrupt snapshot header";
  }
  h.kind = static_cast<SnapshotKind>(kind);
  h.key_type = static_cast<SnapshotKeyType>(key_type);
  if (version >= 2) {
    std::string admission_fields(16, '\0');
    if (!ReadExact(admission_fields.data(), admission_fields.size())) {
      return "truncated snapshot header";
    }
    bytes += admission_fields;  // checksummed with the rest
    Cursor fields(admission_fields.data(), admission_fields.size());
    uint32_t admission = 0;
    fields.Get(&admission);
    fields.Get(&h.sketch_depth);
    fields.Get(&h.sketch_width);
    // A sketch as the table builds one (admission.h): 1 to 16 rows of a power of two counters,
    // from 1024 to 2^32; anything else is corruption.
    const bool sketch_ok = h.sketch_depth >= 1 && h.sketch_depth <= 16 && h.sketch_width >= 1024 &&
                           h.sketch_width <= (uint64_t{1} << 32) &&
                           (h.sketch_width & (h.sketch_width - 1)) == 0;
    const bool no_sketch = h.sketch_depth == 0 && h.sketch_width == 0;
    // Version 1 is written when there is no admission state: version 2 always has some;
    // version 3 may have none.
    const bool valid =
        (admission == static_cast<uint32_t>(SnapshotAdmission::kSketch) && sketch_ok) ||
        (admission == static_cast<uint32_t>(SnapshotAdmission::kExact) && no_sketch) ||
        (admission == static_cast<uint32_t>(SnapshotAdmission::kNone) && no_sketch &&
         version >= kSnapshotFormatVersionWithInitializerVersion);
    if (!valid) return "corrupt snapshot header";
    h.admission = static_cast<SnapshotAdmission>(admission);
  }
  if (version >= kSnapshotFormatVersionWithInitializerVersion) {
    char field[4];
    if (!ReadExact(field, 4)) return "truncated snapshot header";
    bytes.append(field, 4);  // checksummed with the rest
    std::memcpy(&h.initializer_version, field, 4);
    // Version 3 is written only for a version other than 1.
    if (h.initializer_version < 2) return "corrupt snapshot header";
    if (h.initializer_version > static_cast<uint32_t>(kNewestInitializerVersion)) {
      return "initializer version " + std::to_string(h.initializer_version) +
             ", this build knows versions 1 to " + std::to_string(kNewestInitializerVersion);
    }
  }
  std::string rest(4 * h.num_slots + 4, '\0');
  if (!ReadExact(rest.data(), rest.size())) return "truncated snapshot header";
  uint32_t name_bytes;
  std::memcpy(&name_bytes, rest.data() + 4 * h.num_slots, 4);
  if (name_bytes > kMaxNameBytes) return "corrupt snapshot header";
  std::string name(name_bytes, '\0');
  uint32_t stored_crc;
  if (!ReadExact(name.data(), name.size()) || !ReadExact(reinterpret_cast<char*>(&stored_crc), 4)) {
    return "truncated snapshot header";
  }
  uint32_t crc = Crc32c(0, bytes.data(), bytes.size());
  crc = Crc32c(crc, rest.data(), rest.size());
  crc = Crc32c(crc, name.data(), name.size());
  if (crc != stored_crc) return "snapshot header checksum mismatch";
  h.slot_initial_values.resize(h.num_slots);
  // Not memcpy: with no slots, data() may be null, and memcpy from or to null is undefined even
  // for 0 bytes.
  for (uint32_t s = 0; s < h.num_slots; ++s) {
    std::memcpy(&h.slot_initial_values[s], rest.data() + 4 * s, 4);
  }
  h.table_name = std::move(name);
  const uint64_t claimed = MinimumSnapshotBytes(h);
  if (claimed > max_bytes_) return OverLimit("its header claims at least", claimed);
  bytes_read_ = bytes.size() + rest.size() + name_bytes + 4;
  header_ = h;
  *header = std::move(h);
  return "";
}

std::string SnapshotReader::OverLimit(const char* what, uint64_t bytes) const {
  return std::string(what) + " " + std::to_string(bytes) + " bytes, over the limit of " +
         std::to_string(max_bytes_) +
         " bytes per snapshot file (docs/dynamic_embedding.md, Limits)";
}

bool SnapshotReader::ReadPayload(uint32_t bytes, std::string* payload) {
  // In pieces of at most a chunk, the buffer growing only as they arrive: a corrupt or truncated
  // file whose block header declares up to kMaxPayload bytes costs memory for what it holds, not
  // for what it declares.
  payload->clear();
  while (payload->size() < bytes) {
    const size_t start = payload->size();
    const size_t piece = std::min<size_t>(bytes - start, kSnapshotChunkBytes);
    payload->resize(start + piece);
    if (!ReadExact(payload->data() + start, piece)) return false;
  }
  return true;
}

std::string SnapshotReader::ReadRecords(
    const std::function<bool(int64_t)>& int64_tombstone, const Int64Row& int64_row,
    const std::function<bool(std::string_view)>& string_tombstone, const StringRow& string_row,
    const AdmissionRecords* admission) {
  const bool string_keys = header_.key_type == SnapshotKeyType::kString;
  const size_t value_bytes = sizeof(float) * header_.dim * (1 + header_.num_slots);
  std::vector<float> values(header_.dim * (1 + header_.num_slots));
  std::vector<uint32_t> counters;
  std::string payload;
  uint64_t rows = 0, tombstones = 0, pending = 0, sketch_counters = 0;
  const uint64_t expected_counters = header_.admission == SnapshotAdmission::kSketch
                                         ? header_.sketch_width * header_.sketch_depth
                                         : 0;
  // The block types this file may hold: its admission state's only.
  auto allowed = [&](uint32_t type) {
    switch (type) {
      case SnapshotWriter::kPending:
        return header_.admission == SnapshotAdmission::kExact;
      case SnapshotWriter::kSketch:
        return header_.admission == SnapshotAdmission::kSketch;
      default:
        return SnapshotWriter::BlockOrder(type) >= 0;
    }
  };
  int last_order = 0;
  for (;;) {
    uint32_t head[4];
    if (!ReadExact(reinterpret_cast<char*>(head), sizeof(head))) {
      return "truncated: the file ends before its end block";
    }
    const uint32_t type = head[0], count = head[1], bytes = head[2];
    if (!allowed(type) || SnapshotWriter::BlockOrder(type) < last_order || bytes > kMaxPayload) {
      return "corrupt block header";
    }
    last_order = SnapshotWriter::BlockOrder(type);
    bytes_read_ += sizeof(head) + uint64_t{bytes};
    if (bytes_read_ > max_bytes_) return OverLimit("its blocks so far take", bytes_read_);
    if (!ReadPayload(bytes, &payload)) return "truncated block";
    const uint32_t crc =
        Crc32c(Crc32c(0, reinterpret_cast<const char*>(head), 12), payload.data(), payload.size());
    if (crc != head[3]) return "block checksum mismatch";
    Cursor cursor(payload.data(), payload.size());
    if (type == SnapshotWriter::kEnd) {
      uint64_t end_rows, end_tombstones, end_pending = 0, end_counters = 0;
      const bool with_admission = header_.admission != SnapshotAdmission::kNone;
      if (!cursor.Get(&end_rows) || !cursor.Get(&end_tombstones) ||
          (with_admission && (!cursor.Get(&end_pending) || !cursor.Get(&end_counters))) ||
          !cursor.AtEnd()) {
        return "corrupt end block";
      }
      if (end_rows != rows || end_tombstones != tombstones || rows != header_.rows ||
          tombstones != header_.tombstones || end_pending != pending ||
          end_counters != sketch_counters || sketch_counters != expected_counters) {
        return "record counts disagree with the header";
      }
      return "";
    }
    if (type == SnapshotWriter::kSketch) {
      if (bytes != sizeof(uint32_t) * uint64_t{count} ||
          sketch_counters + count > expected_counters) {
        return "corrupt sketch block";
      }
      if (admission != nullptr && admission->sketch) {
        counters.resize(count);
        std::memcpy(counters.data(), payload.data(), bytes);
        if (!admission->sketch(sketch_counters, counters.data(), count)) return "stopped";
      }
      sketch_counters += count;
      continue;
    }
    for (uint32_t r = 0; r < count; ++r) {
      int64_t int_key = 0;
      std::string_view string_key;
      if (string_keys) {
        uint32_t length;
        const char* data;
        if (!cursor.Get(&length) || length > kMaxKeyBytes || !cursor.GetBytes(length, &data)) {
          return "corrupt record";
        }
        string_key = std::string_view(data, length);
      } else if (!cursor.Get(&int_key)) {
        return "corrupt record";
      }
      if (type == SnapshotWriter::kTombstones) {
        ++tombstones;
        if (!(string_keys ? string_tombstone(string_key) : int64_tombstone(int_key))) {
          return "stopped";
        }
        continue;
      }
      if (type == SnapshotWriter::kPending) {
        uint32_t pending_count;
        if (!cursor.Get(&pending_count)) return "corrupt record";
        ++pending;
        if (admission == nullptr) continue;
        const bool go =
            string_keys
                ? !admission->string_pending || admission->string_pending(string_key, pending_count)
                : !admission->int64_pending || admission->int64_pending(int_key, pending_count);
        if (!go) return "stopped";
        continue;
      }
      uint32_t update_count;
      int64_t last_step;
      const char* data;
      if (!cursor.Get(&update_count) || !cursor.Get(&last_step) ||
          !cursor.GetBytes(value_bytes, &data)) {
        return "corrupt record";
      }
      std::memcpy(values.data(), data, value_bytes);
      ++rows;
      const bool go = string_keys ? string_row(string_key, update_count, last_step, values.data())
                                  : int64_row(int_key, update_count, last_step, values.data());
      if (!go) return "stopped";
    }
    if (!cursor.AtEnd()) return "corrupt block: bytes after its records";
    if (rows > header_.rows || tombstones > header_.tombstones) {
      return "record counts disagree with the header";
    }
  }
}

}  // namespace de
}  // namespace tf_ext
