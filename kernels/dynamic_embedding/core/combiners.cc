#include "kernels/dynamic_embedding/core/combiners.h"

#include <algorithm>

namespace tf_ext {
namespace de {

bool ParseCombiner(const std::string& name, Combiner* combiner) {
  if (name == "none") {
    *combiner = Combiner::kNone;
  } else if (name == "sum") {
    *combiner = Combiner::kSum;
  } else if (name == "mean") {
    *combiner = Combiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = Combiner::kSqrtn;
  } else {
    return false;
  }
  return true;
}

std::vector<float> SegmentScales(Combiner combiner, const int64_t* segment_ids, int64_t n,
                                 int64_t num_segments) {
  std::vector<float> scales(static_cast<size_t>(num_segments), 1.0f);
  if (combiner != Combiner::kMean && combiner != Combiner::kSqrtn) return scales;
  std::vector<float> counts(static_cast<size_t>(num_segments), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (segment_ids[i] >= 0) counts[segment_ids[i]] += 1.0f;
  }
  for (int64_t s = 0; s < num_segments; ++s) {
    const float scale = combiner == Combiner::kMean ? counts[s] : std::sqrt(counts[s]);
    scales[s] = std::max(scale, 1.0f);
  }
  return scales;
}

void ZeroSegments(int64_t num_segments, int dim, float* out, int64_t out_stride) {
  if (out_stride == dim) {
    std::fill(out, out + num_segments * dim, 0.0f);
    return;
  }
  for (int64_t s = 0; s < num_segments; ++s)
    std::fill(out + s * out_stride, out + s * out_stride + dim, 0.0f);
}

void AddRowsToSegments(const float* rows, const int64_t* segment_ids, int64_t n, int dim,
                       float* out, int64_t out_stride) {
  for (int64_t i = 0; i < n; ++i) {
    if (segment_ids[i] < 0) continue;
    AddRow(rows + i * dim, dim, out + segment_ids[i] * out_stride);
  }
}

void DivideSegments(Combiner combiner, const int64_t* segment_ids, int64_t n, int64_t num_segments,
                    int dim, float* out, int64_t out_stride) {
  if (combiner == Combiner::kSum || combiner == Combiner::kNone) return;
  const std::vector<float> scales = SegmentScales(combiner, segment_ids, n, num_segments);
  for (int64_t s = 0; s < num_segments; ++s) {
    float* sum = out + s * out_stride;
    for (int d = 0; d < dim; ++d) sum[d] = sum[d] / scales[s];
  }
}

void CombineRows(Combiner combiner, const float* rows, const int64_t* segment_ids, int64_t n,
                 int64_t num_segments, int dim, float* out) {
  ZeroSegments(num_segments, dim, out, dim);
  AddRowsToSegments(rows, segment_ids, n, dim, out, dim);
  DivideSegments(combiner, segment_ids, n, num_segments, dim, out, dim);
}

}  // namespace de
}  // namespace tf_ext
