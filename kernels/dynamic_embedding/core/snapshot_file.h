// The file of one table snapshot: a full checkpoint of a table or a delta (the rows changed and
// the ids removed since the previous snapshot of its chain). Written and read in bounded chunks,
// so saving or restoring a table of any size needs memory for one chunk, not a copy of the table.
// No TensorFlow types: the kernels adapt TensorFlow's file systems to ByteSink/ByteSource.
//
// Layout (little-endian):
//   header   "TFEXTSNP", format version, kind, key type, dim, num_slots, chain id, sequence,
//            step, row and tombstone counts, [version 2: admission kind, sketch depth (u32),
//            sketch width (u64)], [version 3: initializer version (u32)], slot initial values,
//            table name; then its CRC32C
//   blocks   type (tombstones, rows, then version 2's admission state: pending counts or sketch
//            counters), record count, payload bytes, CRC32C of the block's first three fields
//            and payload; then the payload. Tombstones come first so one pass over a delta
//            replays it: an id removed and added again since the base is a tombstone and a row,
//            and the row must win.
//   end      a block of type kEnd whose payload repeats the row and tombstone counts (version
//            2: and the pending and sketch counter counts), so a truncated file is detected.
// A row record is its key (int64: 8 bytes; string: u32 length + bytes), its update count (u32),
// last step (i64) and dim * (1 + num_slots) floats: the embedding, then each slot. A pending
// record is a key and its count (u32); a sketch block's records are counters (u32), in order.
//
// Versions. 1 holds no admission state; 2 adds it, the whole state of the table at the save
// (also in a delta: it is bounded). A file without admission state is written as version 1, as
// before version 2, so that earlier builds still read it; they refuse a version 2 file by its
// version. 3 adds the table's initializer version (initializers.h) and is written only for a
// table whose version is not 1, with version 2's admission fields (kind kNone, zeros, when the
// table has none); a file of version 1 or 2 comes from a version 1 table. This build reads all.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_FILE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_FILE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/limits.h"

namespace tf_ext {
namespace de {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // Appends n bytes; false on error (the sink keeps its own message).
  virtual bool Append(const char* data, size_t n) = 0;
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads exactly n bytes into out; false at the end of the data or on error.
  virtual bool Read(char* out, size_t n) = 0;
};

// CRC32C (Castagnoli), continuing from `crc` (0 to start). Uses SSE4.2 where the CPU has it.
uint32_t Crc32c(uint32_t crc, const char* data, size_t n);

enum class SnapshotKind : uint32_t { kFull = 0, kDelta = 1 };
// The admission state a snapshot holds (admission.h): none, a count-min sketch's counters, or
// the exact counts of the ids waiting.
enum class SnapshotAdmission : uint32_t { kNone = 0, kSketch = 1, kExact = 2 };
enum class SnapshotKeyType : uint32_t { kInt64 = 0, kString = 1 };

struct SnapshotHeader {
  SnapshotKind kind = SnapshotKind::kFull;
  SnapshotKeyType key_type = SnapshotKeyType::kInt64;
  uint32_t dim = 0;
  uint32_t num_slots = 0;
  uint64_t chain_id = 0;  // the full snapshot's id; its deltas carry the same
  uint64_t sequence = 0;  // 0 for the full snapshot, n for the n-th delta after it
  int64_t step = 0;       // the global step of the save (informational)
  uint64_t rows = 0;
  uint64_t tombstones = 0;
  std::vector<float> slot_initial_values;  // num_slots values
  std::string table_name;
  SnapshotAdmission admission = SnapshotAdmission::kNone;
  uint64_t sketch_width = 0;  // with kSketch: counters per row (a power of two), and rows
  uint32_t sketch_depth = 0;
  uint32_t initializer_version = 1;  // InitializerSpec::version of the table saved
};

// The version written when a snapshot holds admission state.
constexpr uint32_t kSnapshotFormatVersion = 2;
constexpr uint32_t kSnapshotFormatVersionWithoutAdmission = 1;
// Written for a table whose initializer version is not 1; the newest this build reads.
constexpr uint32_t kSnapshotFormatVersionWithInitializerVersion = 3;
constexpr size_t kSnapshotChunkBytes = size_t{1} << 20;

// The fewest bytes a file with this header takes (its header, records and end block, not
// counting block heads or string keys' bytes), saturating at UINT64_MAX: what the header claims.
uint64_t MinimumSnapshotBytes(const SnapshotHeader& header);

// Why a table (CPU or GPU) cannot give a delta since `since_version`.
inline std::string NoDeltaBase(int64_t since_version) {
  return "no delta since version " + std::to_string(since_version) +
         " can be taken (the table was restored, or never snapshotted with tracking, or a later "
         "delta was committed since): write a full snapshot";
}

// The admission state a snapshot of a table with this admission spec holds.
inline void DescribeAdmission(const AdmissionSpec& spec, SnapshotHeader* header) {
  header->admission = spec.min_count <= 1 ? SnapshotAdmission::kNone
                      : spec.exact        ? SnapshotAdmission::kExact
                                          : SnapshotAdmission::kSketch;
  const bool sketch = header->admission == SnapshotAdmission::kSketch;
  header->sketch_width = sketch ? static_cast<uint64_t>(SketchWidth(spec.sketch_width)) : 0;
  header->sketch_depth = sketch ? static_cast<uint32_t>(spec.sketch_depth) : 0;
}

// Writes one snapshot: Begin, then every Tombstone, then every Row, then the admission state
// the header announces (every Pending count, or SketchCounters), then Finish. Records are
// gathered into chunks of about kSnapshotChunkBytes, each written with its checksum. A file is
// at most `max_bytes` (kMaxSnapshotFileBytes; less in tests): Begin refuses a header that claims
// more (MinimumSnapshotBytes), and a write past it fails; then over_limit() is true.
class SnapshotWriter {
 public:
  explicit SnapshotWriter(ByteSink* sink, uint64_t max_bytes = kMaxSnapshotFileBytes)
      : sink_(sink), max_bytes_(max_bytes) {}
  bool Begin(const SnapshotHeader& header);
  template <typename Key>
  bool Tombstone(const Key& key) {
    if (!StartRecord(kTombstones)) return false;
    PutKey(key);
    return EndRecord();
  }
  // The row's embedding (dim floats) and its slots (dim * num_slots floats).
  template <typename Key>
  bool Row(const Key& key, uint32_t update_count, int64_t last_step, const float* embedding,
           const float* slots) {
    if (!StartRecord(kRows)) return false;
    PutKey(key);
    Put(update_count);
    Put(last_step);
    Append(reinterpret_cast<const char*>(embedding), sizeof(float) * dim_);
    Append(reinterpret_cast<const char*>(slots), sizeof(float) * dim_ * num_slots_);
    return EndRecord();
  }
  // An id waiting for admission and its exact count (header.admission kExact).
  template <typename Key>
  bool Pending(const Key& key, uint32_t count) {
    if (admission_ != SnapshotAdmission::kExact || !StartRecord(kPending)) return false;
    PutKey(key);
    Put(count);
    return EndRecord();
  }
  // The sketch's counters (header.admission kSketch), in order: width * depth of them, over one
  // or more calls.
  bool SketchCounters(const uint32_t* counters, size_t n);
  // Every counter of a CountMinSketch (admission.h).
  template <typename Sketch>
  bool SketchCounters(const Sketch& sketch) {
    std::vector<uint32_t> buffer(kSnapshotChunkBytes / sizeof(uint32_t));
    for (size_t first = 0; first < sketch.NumCounters(); first += buffer.size()) {
      const size_t n = std::min(buffer.size(), sketch.NumCounters() - first);
      sketch.CopyCounters(first, n, buffer.data());
      if (!SketchCounters(buffer.data(), n)) return false;
    }
    return true;
  }
  bool Finish();
  uint64_t bytes_written() const { return bytes_written_; }
  // Whether the last failure was the file reaching max_bytes (then bytes_written() plus the
  // bytes refused, or the header's claim, is more than max_bytes: over_limit_bytes()).
  bool over_limit() const { return over_limit_bytes_ > 0; }
  uint64_t over_limit_bytes() const { return over_limit_bytes_; }

  // In file order: a type's blocks may follow only those of the types before it.
  enum BlockType : uint32_t { kTombstones = 1, kRows = 2, kEnd = 3, kPending = 4, kSketch = 5 };
  static int BlockOrder(uint32_t type) {
    switch (type) {
      case kTombstones:
        return 0;
      case kRows:
        return 1;
      case kPending:
        return 2;
      case kSketch:
        return 3;
      case kEnd:
        return 4;
      default:
        return -1;
    }
  }

 private:
  void PutKey(int64_t key) { Put(key); }
  void PutKey(std::string_view key) {  // its length, then its bytes
    Put(static_cast<uint32_t>(key.size()));
    Append(key.data(), key.size());
  }
  template <typename T>
  void Put(const T& value) {
    Append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void Append(const char* data, size_t n) { chunk_.append(data, n); }
  bool StartRecord(BlockType type);
  bool EndRecord();
  bool FlushChunk();
  bool Write(const char* data, size_t n);

  ByteSink* sink_;
  const uint64_t max_bytes_;
  uint64_t over_limit_bytes_ = 0;
  std::string chunk_;
  BlockType chunk_type_ = kTombstones;
  uint32_t chunk_records_ = 0;
  uint64_t records_[6] = {};  // by block type
  uint64_t expected_rows_ = 0, expected_tombstones_ = 0, expected_counters_ = 0;
  uint32_t dim_ = 0, num_slots_ = 0;
  SnapshotAdmission admission_ = SnapshotAdmission::kNone;
  uint64_t bytes_written_ = 0;
};

// Reads one snapshot in chunks. Every method returns "" or what is wrong with the data. A file
// over `max_bytes` (kMaxSnapshotFileBytes; less in tests) is refused: by its header's claim
// (MinimumSnapshotBytes) before any record is read, or when the blocks read pass it.
class SnapshotReader {
 public:
  explicit SnapshotReader(ByteSource* source, uint64_t max_bytes = kMaxSnapshotFileBytes)
      : source_(source), max_bytes_(max_bytes) {}
  std::string ReadHeader(SnapshotHeader* header);
  // Calls tombstone(key) for each removed id, then row(key, update_count, last_step, values)
  // for each row (values: dim * (1 + num_slots) floats), then the admission callbacks, then
  // checks the end block. Keys are int64_t or std::string_view, as the header's key type says.
  // Stops at the first callback that returns false (returning "stopped"). Admission state
  // without a callback (or without `admission`) is checked and skipped.
  using Int64Row = std::function<bool(int64_t, uint32_t, int64_t, const float*)>;
  using StringRow = std::function<bool(std::string_view, uint32_t, int64_t, const float*)>;
  struct AdmissionRecords {
    std::function<bool(int64_t, uint32_t)> int64_pending;  // (key, count)
    std::function<bool(std::string_view, uint32_t)> string_pending;
    // Counters [first, first + n) of the sketch of the header's width and depth, in order.
    std::function<bool(uint64_t first, const uint32_t* counters, size_t n)> sketch;
  };
  std::string ReadRecords(const std::function<bool(int64_t)>& int64_tombstone,
                          const Int64Row& int64_row,
                          const std::function<bool(std::string_view)>& string_tombstone,
                          const StringRow& string_row, const AdmissionRecords* admission = nullptr);

 private:
  bool ReadExact(char* out, size_t n) { return source_->Read(out, n); }
  // A block's payload of `bytes` (at most kMaxPayload) into *payload; false if the data ends first.
  bool ReadPayload(uint32_t bytes, std::string* payload);
  std::string OverLimit(const char* what, uint64_t bytes) const;
  ByteSource* source_;
  const uint64_t max_bytes_;
  uint64_t bytes_read_ = 0;
  SnapshotHeader header_;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_FILE_H_
