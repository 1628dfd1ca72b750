// libFuzzer harness of the table snapshot reader (snapshot_file.h): whatever bytes a snapshot
// file holds, reading it ends in "" or an error message, never a crash, undefined behaviour or an
// allocation sized by an untrusted field (native_fuzz.sh sets libFuzzer's malloc limit).
//
// Input: a flags byte, then
//   raw (kRaw):  the file itself;
//   otherwise:   a recipe (key type, kind, dim, slots, tombstones, rows and their bytes) that
//                SnapshotWriter turns into a valid file, which must read back exactly; then the
//                input's remaining bytes are edits (flip a bit, truncate, splice a range of the
//                file elsewhere, set a byte) applied to the file before it is read again.
// With kFixChecksums the header's and each block's CRC32C are recomputed after the edits, so the
// fuzzer reaches the record parsing behind them instead of stopping at a checksum mismatch.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

namespace {

using tf_ext::de::Crc32c;
using tf_ext::de::SnapshotHeader;
using tf_ext::de::SnapshotKeyType;
using tf_ext::de::SnapshotKind;
using tf_ext::de::SnapshotReader;
using tf_ext::de::SnapshotWriter;
using tf_ext::de::StringSink;
using tf_ext::de::StringSource;

constexpr uint8_t kRaw = 1, kFixChecksums = 2, kStringKeys = 4, kDelta = 8;

struct Record {
  std::string key;  // an int64 key's 8 bytes, or a string key
  uint32_t update_count = 0;
  int64_t last_step = 0;
  std::vector<float> values;  // empty for a tombstone
};

struct Contents {
  SnapshotHeader header;
  std::vector<Record> tombstones, rows;
};

// Reads a whole file; the error, or "" with what it held. Every callback argument is touched in
// full, so a key or a row that points outside the reader's buffers is an AddressSanitizer report.
std::string ReadAll(std::string_view file, Contents* contents) {
  StringSource source(file);
  SnapshotReader reader(&source);
  std::string error = reader.ReadHeader(&contents->header);
  if (!error.empty()) return error;
  const SnapshotHeader& header = contents->header;
  CHECK(header.slot_initial_values.size() == header.num_slots);
  const size_t row_floats = size_t{header.dim} * (1 + header.num_slots);
  auto record = [&](std::string key, uint32_t count, int64_t step, const float* values) {
    Record r{std::move(key), count, step, {}};
    if (values != nullptr) r.values.assign(values, values + row_floats);
    return r;
  };
  auto int_key = [](int64_t key) { return std::string(reinterpret_cast<char*>(&key), 8); };
  error = reader.ReadRecords(
      [&](int64_t key) {
        contents->tombstones.push_back(record(int_key(key), 0, 0, nullptr));
        return true;
      },
      [&](int64_t key, uint32_t count, int64_t step, const float* values) {
        contents->rows.push_back(record(int_key(key), count, step, values));
        return true;
      },
      [&](std::string_view key) {
        contents->tombstones.push_back(record(std::string(key), 0, 0, nullptr));
        return true;
      },
      [&](std::string_view key, uint32_t count, int64_t step, const float* values) {
        contents->rows.push_back(record(std::string(key), count, step, values));
        return true;
      });
  if (error.empty()) {
    CHECK(contents->rows.size() == header.rows);
    CHECK(contents->tombstones.size() == header.tombstones);
  }
  return error;
}

// Rewrites the header's and every whole block's checksum, as far as the sizes they declare lie
// inside the file.
void FixChecksums(std::string* file) {
  constexpr size_t kFixed = 8 + 5 * 4 + 5 * 8;
  if (file->size() < kFixed) return;
  uint32_t num_slots, name_bytes;
  memcpy(&num_slots, file->data() + 8 + 4 * 4, 4);
  if (num_slots > 64) return;
  size_t pos = kFixed + 4 * size_t{num_slots};
  if (file->size() < pos + 4) return;
  memcpy(&name_bytes, file->data() + pos, 4);
  pos += 4;
  if (name_bytes > file->size() - pos || file->size() - pos - name_bytes < 4) return;
  pos += name_bytes;
  const uint32_t header_crc = Crc32c(0, file->data(), pos);
  memcpy(&(*file)[pos], &header_crc, 4);
  pos += 4;
  while (file->size() - pos >= 16) {
    uint32_t bytes;
    memcpy(&bytes, file->data() + pos + 8, 4);
    if (bytes > file->size() - pos - 16) return;
    const uint32_t crc = Crc32c(Crc32c(0, file->data() + pos, 12), file->data() + pos + 16, bytes);
    memcpy(&(*file)[pos + 12], &crc, 4);
    pos += 16 + bytes;
  }
}

// Builds a valid file from the recipe at the start of `input`; `expected` gets its contents.
std::string WriteRecipe(uint8_t flags, FuzzInput* input, Contents* expected) {
  SnapshotHeader& header = expected->header;
  const bool string_keys = flags & kStringKeys;
  header.kind = flags & kDelta ? SnapshotKind::kDelta : SnapshotKind::kFull;
  header.key_type = string_keys ? SnapshotKeyType::kString : SnapshotKeyType::kInt64;
  header.dim = 1 + input->Byte() % 8;
  header.num_slots = input->Byte() % 3;
  header.chain_id = input->Byte();
  header.sequence = header.kind == SnapshotKind::kDelta ? 1 + input->Byte() % 4 : 0;
  header.step = input->Byte();
  for (uint32_t s = 0; s < header.num_slots; ++s) header.slot_initial_values.push_back(s + 0.5f);
  header.table_name = input->Text(input->Byte() % 8);
  const size_t tombstones = header.kind == SnapshotKind::kDelta ? input->Byte() % 6 : 0;
  const size_t rows = input->Byte() % 12;
  header.rows = rows;
  header.tombstones = tombstones;
  auto key = [&] { return string_keys ? input->Text(input->Byte() % 12) : input->Text(8); };
  for (size_t i = 0; i < tombstones; ++i) expected->tombstones.push_back(Record{key(), 0, 0, {}});
  for (size_t i = 0; i < rows; ++i) {
    Record r{key(), input->Byte(), static_cast<int64_t>(input->Unsigned(2)) - 1000, {}};
    for (uint32_t j = 0; j < header.dim * (1 + header.num_slots); ++j) {
      r.values.push_back(static_cast<float>(input->Byte()) - 128.0f);
    }
    expected->rows.push_back(std::move(r));
  }
  StringSink sink;
  SnapshotWriter writer(&sink);
  CHECK(writer.Begin(header));
  auto int_key = [](const std::string& bytes) {
    int64_t value;
    memcpy(&value, bytes.data(), 8);
    return value;
  };
  for (const Record& t : expected->tombstones) {
    CHECK(string_keys ? writer.Tombstone(std::string_view(t.key))
                      : writer.Tombstone(int_key(t.key)));
  }
  for (const Record& r : expected->rows) {
    const float* values = r.values.data();
    CHECK(string_keys ? writer.Row(std::string_view(r.key), r.update_count, r.last_step, values,
                                   values + header.dim)
                      : writer.Row(int_key(r.key), r.update_count, r.last_step, values,
                                   values + header.dim));
  }
  CHECK(writer.Finish());
  return sink.bytes;
}

bool SameRecords(const std::vector<Record>& a, const std::vector<Record>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].key != b[i].key || a[i].update_count != b[i].update_count ||
        a[i].last_step != b[i].last_step || a[i].values != b[i].values) {  // never NaN
      return false;
    }
  }
  return true;
}

void Edit(FuzzInput* input, std::string* file) {
  for (int edits = 0; !input->empty() && edits < 8 && !file->empty(); ++edits) {
    const uint8_t op = input->Byte() % 4;
    const size_t at = input->Unsigned(2) % file->size();
    switch (op) {
      case 0:  // flip a bit
        (*file)[at] ^= static_cast<char>(1 << (input->Byte() % 8));
        break;
      case 1:  // truncate
        file->resize(at);
        break;
      case 2: {  // splice: copy a range of the file over another place, or insert it there
        const size_t from = input->Unsigned(2) % file->size();
        const size_t length = std::min<size_t>(input->Unsigned(2) % 64, file->size() - from);
        const std::string range = file->substr(from, length);
        if (input->Byte() & 1) {
          file->insert(at, range);
        } else {
          file->replace(at, std::min(length, file->size() - at), range);
        }
        break;
      }
      default:  // set a byte
        (*file)[at] = static_cast<char>(input->Byte());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput input(data, size);
  const uint8_t flags = input.Byte();
  std::string file;
  if (flags & kRaw) {
    file = input.Rest();
  } else {
    Contents expected;
    file = WriteRecipe(flags, &input, &expected);
    Contents read;
    const std::string error = ReadAll(file, &read);
    CHECK(error.empty());
    CHECK(read.header.table_name == expected.header.table_name);
    CHECK(read.header.dim == expected.header.dim && read.header.kind == expected.header.kind);
    CHECK(SameRecords(read.tombstones, expected.tombstones));
    CHECK(SameRecords(read.rows, expected.rows));
    Edit(&input, &file);
  }
  if (flags & kFixChecksums) FixChecksums(&file);
  Contents contents;
  ReadAll(file, &contents);
  return 0;
}
