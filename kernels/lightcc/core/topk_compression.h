// TOPK gradient compression with error feedback: the math of LightCC's compressed exchange.
// Plain C++17, no TensorFlow types (kernels/lightcc/topk_kernels.cc adapts it; googletest
// covers it alone).
//
// A buffer of floats is cut into segments (one per gradient tensor, or the part of a tensor this
// rank holds after a reduce-scatter). Segment s sends its k_s entries of largest |g + r|, ties
// broken towards the lower index; k_s is the caller's (LightCC: ceil(ratio * length)). The
// residual r keeps what was not sent, fp16 rounding of sent values included, so nothing is lost
// in the long run.
//
// Wire format ("payload"), one per rank, in 32-bit words:
//   words [0, K)        int32 indices into the buffer (absolute, not per segment)
//   words [K, K + V)    the K values as sent: float32 (V = K) or IEEE fp16, two per word, the
//                       first in the low half (V = ceil(K / 2); a last odd half-word is zero)
// K = sum of k_s is the same on every rank of one exchange, so payloads allgather evenly.
#ifndef TF_EXT_KERNELS_LIGHTCC_CORE_TOPK_COMPRESSION_H_
#define TF_EXT_KERNELS_LIGHTCC_CORE_TOPK_COMPRESSION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tf_ext {
namespace lightcc {

// Round-to-nearest-even float -> IEEE binary16 bits (overflow to inf, NaN stays NaN), and back.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

struct PayloadLayout {
  int64_t num_selected = 0;  // K
  bool half_values = false;
  int64_t value_words() const { return half_values ? (num_selected + 1) / 2 : num_selected; }
  int64_t words() const { return num_selected + value_words(); }
};

// Where each segment starts in the buffer and in the payload's index list, and the totals.
struct SegmentPlan {
  std::vector<int64_t> lengths, counts;
  std::vector<int64_t> buffer_offsets, selected_offsets;
  int64_t total_length = 0;
  int64_t total_selected = 0;
};

// Checks 0 <= count <= length (count >= 1 for a non-empty segment) and that the buffer fits
// int32 indices; on failure returns false and says why in *error.
bool MakeSegmentPlan(const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts,
                     SegmentPlan* plan, std::string* error);

// One segment of `length` entries: residual += gradient, then the k selected entries' indices
// (plus `index_base`) go to indices[0, k) and their values, as sent, to `values` (float32) or
// `half_values` (fp16 bits, when values is null; entry j at half_values[j]); what was sent is
// taken out of the residual. `scratch` is reused between calls.
void CompressSegment(const float* gradient, float* residual, int64_t length, int64_t k,
                     int64_t index_base, int32_t* indices, float* values, uint16_t* half_values,
                     std::vector<uint32_t>* scratch);

// Segment `s` of the plan into `payload` (layout.words() words). Segments write disjoint parts of
// the payload and the residual, so they may run in parallel.
void CompressPlannedSegment(const float* gradient, float* residual, const SegmentPlan& plan,
                            const PayloadLayout& layout, int64_t s, int32_t* payload,
                            std::vector<uint32_t>* scratch);

// All segments, one after another.
void Compress(const float* gradient, float* residual, const SegmentPlan& plan, bool half_values,
              int32_t* payload);

// dense[0, length) = sum over the payloads of scale * value, scattered at its indices, summed in
// payload order (so every rank that decompresses the same allgather gets the same bits).
// `payloads` holds `num_payloads` payloads of `layout` back to back. Returns false (dense holds a
// partial result) when an index is outside [0, length).
bool DecompressSum(const int32_t* payloads, int64_t num_payloads, const PayloadLayout& layout,
                   int64_t length, float scale, float* dense);

}  // namespace lightcc
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_LIGHTCC_CORE_TOPK_COMPRESSION_H_
