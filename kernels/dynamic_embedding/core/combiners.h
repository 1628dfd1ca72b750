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
#include <string>
#include <unordered_map>
#include <vector>

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
  explicit DistinctKeys(int64_t n) {
    size_t capacity = 16;
    while (capacity < static_cast<size_t>(2 * n)) capacity *= 2;
    mask_ = capacity - 1;
    slots_.assign(capacity, -1);
  }
  int64_t SlotOf(int64_t key, std::vector<int64_t>* distinct) {
    uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    for (size_t i = (h ^ (h >> 29)) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i] < 0) {
        slots_[i] = static_cast<int64_t>(distinct->size());
        distinct->push_back(key);
        return slots_[i];
      }
      if ((*distinct)[slots_[i]] == key) return slots_[i];
    }
  }

 private:
  size_t mask_;
  std::vector<int64_t> slots_;  // position in `distinct`, or -1
};

// The distinct keys of key_at(0..n-1) in order of first occurrence, and for each the sum of its
// rows' gradients, added in input order onto zeros (as tf.unique then UnsortedSegmentSum do). The
// gradient of row i is output_gradients[segment_ids[i]] / scale (nothing for a negative segment
// id), or with kNone output_gradients[i]. Key: int64_t or std::string_view.
template <typename Key, typename KeyAt>
void SumGradientsByDistinctKey(Combiner combiner, const float* output_gradients,
                               const int64_t* segment_ids, int64_t n, int64_t num_segments, int dim,
                               KeyAt&& key_at, std::vector<Key>* distinct,
                               std::vector<float>* sums) {
  const bool direct = combiner == Combiner::kNone;
  const std::vector<float> scales =
      direct ? std::vector<float>() : SegmentScales(combiner, segment_ids, n, num_segments);
  // Slots first, so that the sums are allocated once: growing them key by key moved them again
  // and again.
  std::vector<int64_t> slots(static_cast<size_t>(n));
  {
    DistinctKeys<Key> index(n);
    distinct->clear();
    for (int64_t i = 0; i < n; ++i) slots[i] = index.SlotOf(key_at(i), distinct);
  }
  sums->assign(distinct->size() * dim, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* sum = sums->data() + slots[i] * dim;
    if (direct) {
      const float* gradient = output_gradients + i * dim;
      for (int d = 0; d < dim; ++d) sum[d] += gradient[d];
      continue;
    }
    const int64_t s = segment_ids[i];
    if (s < 0) continue;  // its row's gradient is zero; the key still gets its (zero) update
    const float* gradient = output_gradients + s * dim;
    const float scale = scales[s];
    // The quotient is rounded to float before the sum, as in the unfused graph's two ops.
    for (int d = 0; d < dim; ++d) sum[d] += gradient[d] / scale;
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COMBINERS_H_
