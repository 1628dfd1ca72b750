// Op interfaces of LightCC's TOPK compressed exchange. Kernels: kernels/lightcc/.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

int64_t PayloadWords(int64_t num_selected, bool half_values) {
  return num_selected + (half_values ? (num_selected + 1) / 2 : num_selected);
}

Status CompressShape(InferenceContext* c) {
  std::vector<int64_t> lengths, counts;
  bool half_values;
  TF_RETURN_IF_ERROR(c->GetAttr("segment_lengths", &lengths));
  TF_RETURN_IF_ERROR(c->GetAttr("segment_counts", &counts));
  TF_RETURN_IF_ERROR(c->GetAttr("half_values", &half_values));
  int64_t total_length = 0, total_selected = 0;
  for (int64_t v : lengths) total_length += v;
  for (int64_t v : counts) total_selected += v;
  ShapeHandle gradient;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &gradient));
  TF_RETURN_IF_ERROR(c->Merge(gradient, c->Vector(total_length), &gradient));
  c->set_output(0, c->Vector(PayloadWords(total_selected, half_values)));
  return ::tensorflow::OkStatus();
}

Status DecompressShape(InferenceContext* c) {
  int64_t length;
  TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
  ShapeHandle payloads;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &payloads));
  c->set_output(0, c->Vector(length));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfExtTopKCompress")
    .Input("gradient: float")
    .Input("residual: resource")
    .Output("payload: int32")
    .Attr("segment_lengths: list(int)")
    .Attr("segment_counts: list(int)")
    .Attr("half_values: bool = false")
    .Attr("residual_offset: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(CompressShape)
    .Doc(R"doc(
TOPK compression with error feedback of a flat float buffer cut into segments.

The float32 variable `residual` holds the buffer's residual at [residual_offset, residual_offset
+ len(gradient)); that part becomes gradient + residual; from
segment s the segment_counts[s] entries of largest magnitude are written to `payload` (their
int32 indices into the buffer, then their values: float32, or fp16 two per word when
half_values) and taken out of the residual, so that the residual keeps what was not sent,
fp16 rounding included.
)doc");

REGISTER_OP("TfExtTopKDecompress")
    .Input("payloads: int32")
    .Output("dense: float")
    .Attr("num_selected: int >= 0")
    .Attr("half_values: bool = false")
    .Attr("length: int >= 0")
    .Attr("scale: float = 1.0")
    .SetShapeFn(DecompressShape)
    .Doc(R"doc(
Sums TOPK payloads into a dense float32 vector.

The payloads are made by TfExtTopKCompress with num_selected entries each and put back to back
by an allgather. The result has `length` entries; every value is multiplied by `scale` and added
in payload order.
)doc");

}  // namespace tf_ext
