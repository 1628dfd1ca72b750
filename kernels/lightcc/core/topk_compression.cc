#include "kernels/lightcc/core/topk_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace tf_ext {
namespace lightcc {

namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Orders |x| like the float order of |x| (NaN above infinity), as an unsigned integer, so the
// selection can work on bits: one histogram pass instead of a comparison sort.
inline uint32_t MagnitudeKey(float value) { return FloatBits(value) & 0x7fffffffu; }

constexpr int kRadixBits = 16;
constexpr uint32_t kBuckets = 1u << kRadixBits;
constexpr uint32_t kLowMask = kBuckets - 1;
// Below this length a comparison select is cheaper than clearing a 64K-bucket histogram.
constexpr int64_t kSmallSegment = 1 << 14;
constexpr float kHalfMax = 65504.0f;

// Sends residual[i] as entry j of the selection and keeps in the residual what the wire lost.
struct Emitter {
  float* residual;
  int64_t index_base;
  int32_t* indices;
  float* values;
  uint16_t* half_values;

  void operator()(int64_t i, int64_t j) const {
    const float accumulated = residual[i];
    indices[j] = static_cast<int32_t>(index_base + i);
    if (values != nullptr) {
      values[j] = accumulated;
      residual[i] = 0.0f;
      return;
    }
    // Saturate instead of overflowing to inf: the excess stays in the residual for later steps.
    float sent = accumulated;
    if (std::isfinite(accumulated)) sent = std::max(-kHalfMax, std::min(kHalfMax, accumulated));
    const uint16_t bits = FloatToHalf(sent);
    half_values[j] = bits;
    residual[i] = accumulated - HalfToFloat(bits);
  }
};

// The `need` largest keys of `candidates` (ascending indices that share everything above the low
// 16 key bits), ties to the lower index.
void EmitFromBoundaryBucket(const std::vector<uint32_t>& candidates, int64_t need,
                            const float* residual, std::vector<uint32_t>* histogram,
                            const Emitter& emit, int64_t* next) {
  if (static_cast<int64_t>(candidates.size()) == need) {
    for (uint32_t i : candidates) emit(i, (*next)++);
    return;
  }
  histogram->assign(kBuckets, 0);
  for (uint32_t i : candidates) ++(*histogram)[MagnitudeKey(residual[i]) & kLowMask];
  int64_t above = 0;
  uint32_t boundary = kLowMask;
  while (above + (*histogram)[boundary] < need) above += (*histogram)[boundary--];
  int64_t ties = need - above;  // taken from the boundary key, lowest indices first
  for (uint32_t i : candidates) {
    const uint32_t low = MagnitudeKey(residual[i]) & kLowMask;
    if (low > boundary || (low == boundary && ties-- > 0)) emit(i, (*next)++);
  }
}

void SelectSmall(float* residual, int64_t length, int64_t k, const Emitter& emit,
                 std::vector<uint32_t>* order) {
  order->resize(length);
  for (int64_t i = 0; i < length; ++i) (*order)[i] = static_cast<uint32_t>(i);
  auto larger = [residual](uint32_t a, uint32_t b) {
    const uint32_t ka = MagnitudeKey(residual[a]), kb = MagnitudeKey(residual[b]);
    return ka != kb ? ka > kb : a < b;
  };
  std::nth_element(order->begin(), order->begin() + (k - 1), order->end(), larger);
  // Index order inside the payload: deterministic and kinder to the scatter that reads it.
  std::sort(order->begin(), order->begin() + k);
  for (int64_t j = 0; j < k; ++j) emit((*order)[j], j);
}

}  // namespace

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf, or NaN (kept a quiet NaN)
    return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (units of 2^-24) or zero
    const float scaled = BitsToFloat(magnitude) * 16777216.0f;    // exact: a power-of-two scale
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // ties to even
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even; a
  // carry out of the mantissa correctly bumps the exponent.
  uint32_t half = (magnitude - 0x38000000u) >> 13;
  const uint32_t dropped = magnitude & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -value : value;
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

bool MakeSegmentPlan(const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts,
                     SegmentPlan* plan, std::string* error) {
  if (lengths.size() != counts.size()) {
    *error = "segment_lengths and segment_counts differ in size (" +
             std::to_string(lengths.size()) + " vs " + std::to_string(counts.size()) + ")";
    return false;
  }
  *plan = SegmentPlan();
  plan->lengths = lengths;
  plan->counts = counts;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t length = lengths[s], count = counts[s];
    if (length < 0 || count < 0 || count > length || (length > 0 && count == 0)) {
      *error = "segment " + std::to_string(s) + ": count " + std::to_string(count) +
               " must be in [1, length " + std::to_string(length) + "] (0 for an empty segment)";
      return false;
    }
    plan->buffer_offsets.push_back(plan->total_length);
    plan->selected_offsets.push_back(plan->total_selected);
    plan->total_length += length;
    plan->total_selected += count;
  }
  if (plan->total_length > std::numeric_limits<int32_t>::max()) {
    *error = "buffer of " + std::to_string(plan->total_length) +
             " entries exceeds the int32 indices of the wire format";
    return false;
  }
  return true;
}

void CompressSegment(const float* gradient, float* residual, int64_t length, int64_t k,
                     int64_t index_base, int32_t* indices, float* values, uint16_t* half_values,
                     std::vector<uint32_t>* scratch) {
  const Emitter emit{residual, index_base, indices, values, half_values};
  if (k >= length) {  // everything goes
    for (int64_t i = 0; i < length; ++i) {
      residual[i] += gradient[i];
      emit(i, i);
    }
    return;
  }
  if (k <= 0 || length < kSmallSegment) {
    for (int64_t i = 0; i < length; ++i) residual[i] += gradient[i];
    if (k > 0) SelectSmall(residual, length, k, emit, scratch);
    return;
  }
  // Pass 1: accumulate and histogram the top 16 key bits (sign, exponent, 7 mantissa bits).
  std::vector<uint32_t>& histogram = *scratch;
  histogram.assign(kBuckets, 0);
  for (int64_t i = 0; i < length; ++i) {
    const float accumulated = residual[i] + gradient[i];
    residual[i] = accumulated;
    ++histogram[MagnitudeKey(accumulated) >> kRadixBits];
  }
  int64_t above = 0;
  uint32_t boundary = kBuckets - 1;
  while (above + histogram[boundary] < k) above += histogram[boundary--];
  // Pass 2: everything above the boundary bucket goes; the bucket itself is resolved on its
  // low bits (a few thousand entries for gradient-like data).
  std::vector<uint32_t> candidates;
  candidates.reserve(histogram[boundary]);
  int64_t next = 0;
  for (int64_t i = 0; i < length; ++i) {
    const uint32_t high = MagnitudeKey(residual[i]) >> kRadixBits;
    if (high > boundary) {
      emit(i, next++);
    } else if (high == boundary) {
      candidates.push_back(static_cast<uint32_t>(i));
    }
  }
  EmitFromBoundaryBucket(candidates, k - above, residual, &histogram, emit, &next);
}

void CompressPlannedSegment(const float* gradient, float* residual, const SegmentPlan& plan,
                            const PayloadLayout& layout, int64_t s, int32_t* payload,
                            std::vector<uint32_t>* scratch) {
  const int64_t offset = plan.buffer_offsets[s], selected = plan.selected_offsets[s];
  int32_t* value_words = payload + layout.num_selected;
  float* values = layout.half_values ? nullptr : reinterpret_cast<float*>(value_words) + selected;
  uint16_t* halves =
      layout.half_values ? reinterpret_cast<uint16_t*>(value_words) + selected : nullptr;
  CompressSegment(gradient + offset, residual + offset, plan.lengths[s], plan.counts[s], offset,
                  payload + selected, values, halves, scratch);
  if (layout.half_values && (layout.num_selected & 1) && s + 1 == (int64_t)plan.lengths.size()) {
    reinterpret_cast<uint16_t*>(value_words)[layout.num_selected] = 0;  // the padding half
  }
}

void Compress(const float* gradient, float* residual, const SegmentPlan& plan, bool half_values,
              int32_t* payload) {
  const PayloadLayout layout{plan.total_selected, half_values};
  std::vector<uint32_t> scratch;
  for (size_t s = 0; s < plan.lengths.size(); ++s) {
    CompressPlannedSegment(gradient, residual, plan, layout, s, payload, &scratch);
  }
}

bool DecompressSum(const int32_t* payloads, int64_t num_payloads, const PayloadLayout& layout,
                   int64_t length, float scale, float* dense) {
  std::fill(dense, dense + length, 0.0f);
  const int64_t k = layout.num_selected;
  for (int64_t p = 0; p < num_payloads; ++p) {
    const int32_t* indices = payloads + p * layout.words();
    const unsigned char* value_bytes = reinterpret_cast<const unsigned char*>(indices + k);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t i = indices[j];
      if (i < 0 || i >= length) return false;
      float value;
      if (layout.half_values) {
        uint16_t bits;
        std::memcpy(&bits, value_bytes + 2 * j, sizeof(bits));
        value = HalfToFloat(bits);
      } else {
        std::memcpy(&value, value_bytes + 4 * j, sizeof(value));
      }
      dense[i] += value * scale;  // scaling each value spares a pass over the whole buffer
    }
  }
  return true;
}

}  // namespace lightcc
}  // namespace tf_ext
