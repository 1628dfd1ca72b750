// Op interfaces of a table's lifecycle: eviction and statistics. Kernels:
// kernels/dynamic_embedding/lifecycle_kernels.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfExtTableEvict")
    .Input("table: resource")
    .Input("now_step: int64")
    .Output("evicted: int64")
    .Attr("ttl_steps: int = 0")
    .Attr("min_frequency: int = 0")
    .Attr("frequency_window_steps: int = 0")
    .Attr("min_l2_norm: float = 0.0")
    .Attr("max_size: int = 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Removes the rows an eviction policy condemns, with their slots, and returns how many.

It runs inside the table, shard by shard: a shard is scanned under its read lock and its victims
are removed under its write lock in short batches, so lookups and updates go on meanwhile. A
criterion is off when its attr is 0. A row goes when any criterion holds; then, while the table
holds more than max_size rows, the least recently updated rows go.

now_step: The current global step; negative: the largest step a training update of this table had.
evicted: The number of rows removed.
ttl_steps: Remove rows whose last update is at least ttl_steps steps before now_step.
min_frequency: Remove rows updated fewer than min_frequency times, once their last update is at
least frequency_window_steps steps old.
frequency_window_steps: See min_frequency.
min_l2_norm: Remove rows whose embedding has an L2 norm below min_l2_norm.
max_size: Then remove the least recently updated rows until the table holds max_size rows.
)doc");

REGISTER_OP("TfExtTableStatistics")
    .Input("table: resource")
    .Output("statistics: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Vector(7));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Returns a table's statistics as an int64 vector.

In order: size (rows), bytes in use, admitted (rows created by training updates), rejected
(training updates of ids not admitted yet, dropped), evicted (rows removed by eviction), lookups
(ids looked up), lookup_hits (of which had a row). Counts run from the table's creation in this
process; they are not checkpointed.
)doc");

}  // namespace tf_ext
