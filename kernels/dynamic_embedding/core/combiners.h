// The combiners of embedding lookups (sum, mean, sqrtn over each row's ids) and their gradients,
// for the fused lookup and apply ops. TensorFlow-free.
//
// The arithmetic is the unfused graph's, in the same order, so fused and unfused results are equal
// to the last bit: rows are summed into zeroed segments in input order (UnsortedSegmentSum), a
// segment's count is a float sum of ones, and mean / sqrtn divide by max(count, 1) /
// max(sqrt(count), 1) (tf_ext/dynamic_embedding/lookup.py). A negative segment id drops its row,
// as UnsortedSegmentSum does.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COMBINERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COMBINERS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/dynamic_embedding/core/prefetch.h"

namespace tf_ext {
namespace de {

// kNone: one output row per id (the lookup's shape), no segments.
enum class Combiner { kNone, kSum, kMean, kSqrtn };

bool ParseCombiner(const std::string& name, Combiner* combiner);

// The divisor of each segment: 1 for sum, else max(count, 1) or max(sqrt(count), 1).
std::vector<float> SegmentScales(Combiner combiner, const int64_t* segment_ids, int64_t n,
                                 int64_t num_segments);

// out[num_segments, dim] = the combination of rows[n, dim] by segment_ids[n] (ids in
// [0, num_segments) or negative; the caller checks).
void CombineRows(Combiner combiner, const float* rows, const int64_t* segment_ids, int64_t n,
                 int64_t num_segments, int dim, float* out);

// CombineRows in parts, for rows that come in blocks, into out rows out_stride floats apart (a
// column window of a wider matrix): zero the segments, add each block of rows in input order,
// then divide by the segments' scales (segment_ids: all n of them).
void ZeroSegments(int64_t num_segments, int dim, float* out, int64_t out_stride);
void AddRowsToSegments(const float* rows, const int64_t* segment_ids, int64_t n, int dim,
                       float* out, int64_t out_stride);
void DivideSegments(Combiner combiner, const int64_t* segment_ids, int64_t n, int64_t num_segments,
                    int dim, float* out, int64_t out_stride);

// Positions of distinct keys, in order of first occurrence. int64 keys use an open-addressing
// table (the common case, and the fused apply's hot loop); other keys an unordered_map.
template <typename Key>
class DistinctKeys {
 public:
  explicit DistinctKeys(int64_t n) { positions_.reserve(static_cast<size_t>(n)); }
  // The position of `key` in *distinct, appending it if new.
  int64_t SlotOf(const Key& key, std::vector<Key>* distinct) {
    const auto [it, inserted] = positions_.emplace(key, static_cast<int64_t>(distinct->size()));
    if (inserted) distinct->push_back(key);
    return it->second;
  }

 private:
  std::unordered_map<Key, int64_t> positions_;
};

template <>
class DistinctKeys<int64_t> {
 public:
  // Sized for the distinct keys seen so far, not for n: a batch's keys repeat (a tenth of them
  // are distinct in the fusion benchmark), and a table sized for n missed the cache on every probe.
  explicit DistinctKeys(int64_t n) {
    size_t capacity = 16;
    while (capacity < static_cast<size_t>(2 * n) && capacity < kInitialCapacity) capacity *= 2;
    slots_.assign(capacity, Slot{0, -1});
  }
  int64_t SlotOf(int64_t key, std::vector<int64_t>* distinct) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = Home(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].position < 0) {
        const int64_t position = static_cast<int64_t>(distinct->size());
        slots_[i] = Slot{key, position};
        distinct->push_back(key);
        if (2 * distinct->size() > slots_.size()) Grow(*distinct);
        return position;
      }
      if (slots_[i].key == key) return slots_[i].position;
    }
  }

 private:
  static constexpr size_t kInitialCapacity = 1024;
  // The key sits beside its position: one cache line per probe, not one more in `distinct`.
  struct Slot {
    int64_t key;
    int64_t position;  // in `distinct`, or -1: empty
  };
  static size_t Home(int64_t key) {
    const uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
  // Keeps the load at most a half: four times the slots, the distinct keys placed again.
  void Grow(const std::vector<int64_t>& distinct) {
    slots_.assign(4 * slots_.size(), Slot{0, -1});
    const size_t mask = slots_.size() - 1;
    for (size_t k = 0; k < distinct.size(); ++k) {
      size_t i = Home(distinct[k]) & mask;
      while (slots_[i].position >= 0) i = (i + 1) & mask;
      slots_[i] = Slot{distinct[k], static_cast<int64_t>(k)};
    }
  }
  std::vector<Slot> slots_;
};

// to[d] += from[d], four floats per vector add (GCC left the plain loop scalar). Element by
// element, so the sums are the plain loop's.
inline void AddRow(const float* from, int dim, float* to) {
  typedef float Float4 __attribute__((vector_size(16)));
  int d = 0;
  for (; d + 4 <= dim; d += 4) {
    Float4 a, b;
    std::memcpy(&a, to + d, sizeof a);
    std::memcpy(&b, from + d, sizeof b);
    a += b;
    std::memcpy(to + d, &a, sizeof a);
  }
  for (; d < dim; ++d) to[d] += from[d];
}

// Starts loading the cache lines of row[0..dim), for rows that lie too far apart for the hardware
// prefetcher (a column window of a wide gradient).
inline void PrefetchRow(const float* row, int dim) { PrefetchBytes(row, sizeof(float) * dim); }
constexpr int64_t kRowsAhead = 16;

// The distinct keys of key_at(0..n-1) in order of first occurrence (*distinct), and each key's
// position among them (slots[i]). Slot: an integer type that holds n - 1.
template <typename Key, typename KeyAt, typename Slot>
void IndexDistinctKeys(int64_t n, KeyAt&& key_at, std::vector<Key>* distinct, Slot* slots) {
  DistinctKeys<Key> index(n);
  distinct->clear();
  for (int64_t i = 0; i < n; ++i) slots[i] = static_cast<Slot>(index.SlotOf(key_at(i), distinct));
}

// IndexDistinctKeys' *distinct from its slots for the same keys, without hashing: a key whose slot
// is the next one is new. False, with the reason, where a slot is out of order or its key is not
// key_at(i). (It cannot tell two equal keys given two slots; slots made for these keys never do.)
template <typename Key, typename KeyAt, typename Slot>
bool DistinctKeysOfSlots(int64_t n, KeyAt&& key_at, const Slot* slots, std::vector<Key>* distinct,
                         std::string* error) {
  distinct->clear();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = static_cast<int64_t>(slots[i]);
    const int64_t known = static_cast<int64_t>(distinct->size());
    if (slot == known) {
      distinct->push_back(Key(key_at(i)));
    } else if (slot < 0 || slot > known || !((*distinct)[slot] == key_at(i))) {
      *error = "slot " + std::to_string(slot) + " of id " + std::to_string(i) +
               (slot < 0 || slot > known ? " is out of order" : " belongs to another id");
      return false;
    }
  }
  return true;
}

// The merged distinct keys of several key lists given as their own distinct keys (`parts`, in
// order), as IndexDistinctKeys of the lists' concatenation gives them (*distinct); to_merged[k][j]
// is parts[k][j]'s position there. The cost follows the distinct keys, not the keys.
template <typename Key>
void MergeDistinctKeys(const std::vector<const std::vector<Key>*>& parts,
                       std::vector<Key>* distinct, std::vector<std::vector<int64_t>>* to_merged) {
  int64_t total = 0;
  for (const std::vector<Key>* part : parts) total += static_cast<int64_t>(part->size());
  DistinctKeys<Key> index(total);
  distinct->clear();
  to_merged->assign(parts.size(), {});
  for (size_t k = 0; k < parts.size(); ++k) {
    for (const Key& key : *parts[k]) (*to_merged)[k].push_back(index.SlotOf(key, distinct));
  }
}

// Adds each key's row gradient to its slot's row of sums (at least as many rows as slots), in
// input order (as UnsortedSegmentSum does). The gradient of row i is
// output_gradients[segment_ids[i]] / scale (nothing for a negative segment id), or with kNone
// output_gradients[i]; output gradient row r starts at output_gradients + r * gradient_stride (dim
// for a [rows, dim] matrix; wider for a column window of one).
template <typename Slot>
void AddGradientsBySlot(Combiner combiner, const float* output_gradients, int64_t gradient_stride,
                        const int64_t* segment_ids, int64_t n, int64_t num_segments, int dim,
                        const Slot* slots, std::vector<float>* sums) {
  if (combiner == Combiner::kNone) {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kRowsAhead < n) {
        PrefetchRow(output_gradients + (i + kRowsAhead) * gradient_stride, dim);
      }
      AddRow(output_gradients + i * gradient_stride, dim, sums->data() + slots[i] * dim);
    }
    return;
  }
  // Each segment's quotient once, rounded to float before the sums as in the unfused graph's two
  // ops (its division, then the gather of UnsortedSegmentSum's gradient): a row's ids share it.
  const std::vector<float> scales = SegmentScales(combiner, segment_ids, n, num_segments);
  std::vector<float> quotients(static_cast<size_t>(num_segments) * dim);
  for (int64_t s = 0; s < num_segments; ++s) {
    if (s + kRowsAhead < num_segments) {
      PrefetchRow(output_gradients + (s + kRowsAhead) * gradient_stride, dim);
    }
    for (int d = 0; d < dim; ++d) {
      quotients[s * dim + d] = output_gradients[s * gradient_stride + d] / scales[s];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = segment_ids[i];
    if (s < 0) continue;  // its row's gradient is zero; the key still gets its (zero) update
    AddRow(quotients.data() + s * dim, dim, sums->data() + slots[i] * dim);
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COMBINERS_H_
