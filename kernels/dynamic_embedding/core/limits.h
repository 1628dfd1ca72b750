// The documented limits of a dynamic embedding table, in one place (docs/dynamic_embedding.md,
// Limits; tf_ext/dynamic_embedding/limits.py mirrors them for Python's early checks, and
// tests/dynamic_embedding/test_limits.py compares the two). Each Check function returns "" within
// the limit, else the error text, which names the table, the value given and the limit. No
// TensorFlow types; the constants are plain, so CUDA code includes this header too.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_LIMITS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_LIMITS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>

namespace tf_ext {
namespace de {

// Floats per row. A row and its optimizer slots live in one entry of a shard's chunk (about
// 16 KiB, embedding_table_entries.h): at 4096 an entry with 4 slots is 80 KiB already.
constexpr int kMaxDim = 4096;
// Shards of a sharded table (tf_ext.ShardedDynamicEmbeddingVariable): one table and one snapshot
// file per shard, and the manifest lists them all.
constexpr int kMaxShards = 65536;
// Rows of one table. A shard of the table indexes its entries by 32-bit ids, and a table's rows
// may all hash to one shard: half that id space, so that calls running at once, each checked
// against this limit before it adds at most kMaxIdsPerCall rows, can never overflow it.
constexpr int64_t kMaxTableRows = int64_t{1} << 31;
// Bytes of one string key. Each checkpoint record holds its key whole, and the snapshot reader
// refuses a longer one (a corrupt length must not make it allocate without bound).
constexpr int64_t kMaxKeyBytes = int64_t{1} << 20;
// Ids in one lookup or update call (per table). Positions within a call fit an int32, as
// tf.unique's, the optimizer's de-duplication, must.
constexpr int64_t kMaxIdsPerCall = (int64_t{1} << 31) - 1;
// Bytes of one snapshot file (a table's, or one shard's, in a checkpoint). A table is restored
// into memory whole; a file claiming more is corrupt, and is refused before anything is read.
constexpr uint64_t kMaxSnapshotFileBytes = uint64_t{1} << 40;

namespace limits_internal {
inline std::string Over(std::string_view table, std::string_view what, const std::string& value,
                        const std::string& limit) {
  return "dynamic embedding table '" + std::string(table) + "': " + std::string(what) + " " +
         value + " is over the limit of " + limit + " (docs/dynamic_embedding.md, Limits)";
}

// `what` (a setting in [1, max]) of value `value`.
inline std::string InRange(std::string_view table, std::string_view what, int64_t value,
                           int64_t max) {
  if (value >= 1 && value <= max) return "";
  return "dynamic embedding table '" + std::string(table) + "': " + std::string(what) +
         " must be in [1, " + std::to_string(max) + "], got " + std::to_string(value) +
         (value > max ? " (docs/dynamic_embedding.md, Limits)" : "");
}
}  // namespace limits_internal

inline std::string CheckDim(std::string_view table, int64_t dim) {
  return limits_internal::InRange(table, "dim", dim, kMaxDim);
}

// A table's own row limit (TfExtDynamicTable's max_rows), at most kMaxTableRows.
inline std::string CheckMaxRows(std::string_view table, int64_t max_rows) {
  return limits_internal::InRange(table, "max_rows", max_rows, kMaxTableRows);
}

inline std::string CheckShards(std::string_view table, int64_t num_shards) {
  return limits_internal::InRange(table, "num_shards", num_shards, kMaxShards);
}

// Key `index` of a call, of `bytes` bytes.
inline std::string CheckKeyBytes(std::string_view table, int64_t index, int64_t bytes) {
  if (bytes <= kMaxKeyBytes) return "";
  return limits_internal::Over(table, "string key " + std::to_string(index) + " of",
                               std::to_string(bytes) + " bytes",
                               std::to_string(kMaxKeyBytes) + " bytes");
}

inline std::string CheckIdsPerCall(std::string_view table, int64_t ids) {
  if (ids <= kMaxIdsPerCall) return "";
  return limits_internal::Over(table, "a call of", std::to_string(ids) + " ids",
                               std::to_string(kMaxIdsPerCall) + " ids per call");
}

// A table that holds `rows` and may gain `new_rows` more (at most: ids not in it yet).
inline std::string CheckTableRows(std::string_view table, int64_t rows, int64_t new_rows,
                                  int64_t max_rows = kMaxTableRows) {
  if (new_rows <= max_rows - rows) return "";
  return limits_internal::Over(table,
                               "holds " + std::to_string(rows) + " rows; with " +
                                   std::to_string(new_rows) + " new ids it would hold",
                               std::to_string(rows + new_rows) + " rows",
                               std::to_string(max_rows) + " rows");
}

// Whether `error` is a limit's (CheckTableRows, ...): a TensorFlow adapter raises it as
// ResourceExhausted.
inline bool IsOverLimit(std::string_view error) {
  return error.find(" is over the limit of ") != std::string_view::npos;
}

// Whether a table holding `rows` has room for what a call of keys key_at(0..n-1) may add,
// checked before the call changes anything: far from the limit every key may be new; near it,
// the distinct keys for which contains(key) is false are counted.
template <typename Contains, typename KeyAt>
std::string CheckRowsFit(std::string_view table, int64_t rows, int64_t n, Contains&& contains,
                         KeyAt&& key_at, int64_t max_rows = kMaxTableRows) {
  if (CheckTableRows(table, rows, n, max_rows).empty()) return "";
  std::unordered_set<std::decay_t<decltype(key_at(0))>> absent;
  for (int64_t i = 0; i < n; ++i) {
    const auto key = key_at(i);
    if (!contains(key)) absent.insert(key);
  }
  return CheckTableRows(table, rows, static_cast<int64_t>(absent.size()), max_rows);
}

inline std::string CheckSnapshotFileBytes(std::string_view table, uint64_t bytes) {
  if (bytes <= kMaxSnapshotFileBytes) return "";
  return limits_internal::Over(
      table, "a snapshot file of at least", std::to_string(bytes) + " bytes",
      std::to_string(kMaxSnapshotFileBytes) + " bytes per file (shard the table: num_shards)");
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_LIMITS_H_
