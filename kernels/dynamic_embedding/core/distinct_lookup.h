// Lookups that find each distinct int64 key of a batch once and copy its row to every position
// that holds it: the fused lookup (fused_lookup_kernels.cc) always, the unfused find kernel
// (the CPU backend, table_backend.cc) where DuplicatesPay says so. TensorFlow-free.
//
// The rows are those of a lookup of every key, to the bit (a row is copied, never recomputed: a
// missing key's initial row depends on the key alone), and the table's statistics count every key
// (FindDistinctBatch), so only the number of probes of the table changes.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_DISTINCT_LOOKUP_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_DISTINCT_LOOKUP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dynamic_embedding/core/combiners.h"
#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {

// Calls fn(begin, end) over [0, n) on the calling thread: the `for_ranges` of a caller that is
// already one task among many (a field of the fused lookup).
struct InCallingThread {
  template <typename Fn>
  void operator()(int64_t n, int64_t /*cost_per_item*/, Fn&& fn) const {
    if (n > 0) fn(0, n);
  }
};

// The rows of a batch's distinct keys, each found once.
struct DistinctRows {
  std::vector<int64_t> keys;  // in order of first occurrence
  std::vector<float> rows;    // rows[k * dim]: the row of keys[k]
};

// Finds the distinct keys of key_at(0..n-1) once each, `block` keys per FindDistinctBatch, the
// blocks spread by for_ranges(count, cost_per_item, fn(begin, end)); slots[i] gets key i's
// position among them. The statistics count all n keys.
template <typename KeyAt, typename Slot, typename ForRanges>
DistinctRows FindDistinctRows(const EmbeddingTable<int64_t>& table, int64_t n, KeyAt&& key_at,
                              Slot* slots, int64_t block, ForRanges&& for_ranges) {
  const int dim = table.dim();
  DistinctRows found;
  IndexDistinctKeys(n, key_at, &found.keys, slots);
  const int64_t num_distinct = static_cast<int64_t>(found.keys.size());
  std::vector<int64_t> occurrences(num_distinct, 0);
  for (int64_t i = 0; i < n; ++i) ++occurrences[slots[i]];
  found.rows.resize(num_distinct * dim);
  const int64_t num_blocks = (num_distinct + block - 1) / block;
  for_ranges(num_blocks, block * (50 + 2 * dim), [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t start = b * block;
      table.FindDistinctBatch(
          std::min(block, num_distinct - start), [&](int64_t k) { return found.keys[start + k]; },
          occurrences.data() + start, found.rows.data() + start * dim);
    }
  });
  return found;
}

// out[i * out_stride, + dim) = rows[slots[i] * dim, + dim) for i in [begin, end).
template <typename Slot>
void PlaceRows(const float* rows, int dim, const Slot* slots, int64_t begin, int64_t end,
               float* out, int64_t out_stride) {
  for (int64_t i = begin; i < end; ++i) {
    if (i + kRowsAhead < end) PrefetchRow(out + (i + kRowsAhead) * out_stride, dim);
    std::memcpy(out + i * out_stride, rows + static_cast<int64_t>(slots[i]) * dim,
                sizeof(float) * dim);
  }
}

// Whether finding a batch's distinct keys once pays, for rows of `dim` floats, judged from a
// sample: kDuplicateSample keys spread evenly over the batch, of which at least one in
// kDuplicateShare must repeat an earlier one. Indexing every key and copying each row twice saves
// nothing where the ids are distinct: a uniform batch deduplicated took 1.3 to 1.8 times the CPU
// time of a find of every id (benchmarks/lookup.py --dedup), so such a batch keeps the plain
// lookup. A sample has fewer repeats than the whole batch, so a batch that passes has more.
// What a repeat saves is a probe of a row that is hot in cache anyway, while the second copy grows
// with the row: on Zipf(1.1) ids it paid at dim 8 (1.25x the CPU time) but not at dim 64 (0.83 to
// 1.0x), so rows wider than kDuplicateMaxDim keep the plain lookup.
constexpr int64_t kDuplicateSample = 256;
constexpr int64_t kDuplicateShare = 8;
constexpr int kDuplicateMaxDim = 32;
template <typename KeyAt>
bool DuplicatesPay(int64_t n, int dim, KeyAt&& key_at) {
  if (n < kDuplicateSample || dim > kDuplicateMaxDim) return false;
  DistinctKeys<int64_t> seen(kDuplicateSample);
  std::vector<int64_t> distinct;
  distinct.reserve(kDuplicateSample);
  for (int64_t s = 0; s < kDuplicateSample; ++s)
    seen.SlotOf(key_at(s * (n / kDuplicateSample)), &distinct);
  const int64_t repeats = kDuplicateSample - static_cast<int64_t>(distinct.size());
  return repeats * kDuplicateShare >= kDuplicateSample;
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_DISTINCT_LOOKUP_H_
