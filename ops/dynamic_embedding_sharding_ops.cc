// Op interfaces of sharded tables (tf_ext/dynamic_embedding/sharded.py). Kernels:
// kernels/dynamic_embedding/sharding_kernels.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

REGISTER_OP("TfExtShardOf")
    .Input("keys: Tkey")
    .Output("shards: int32")
    .Attr("Tkey: {int64, string}")
    .Attr("num_shards: int >= 1")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The shard, in [0, num_shards), that owns each key of a table split into num_shards shards.

A fixed function of the key alone (kernels/dynamic_embedding/core/sharding.h), shared by lookups,
updates and the restore of sharded checkpoints, and independent of where a table stores the key.

keys: Keys of any shape.
shards: Each key's shard, the shape of keys.
num_shards: The number of shards, 1 to 65536.
)doc");

REGISTER_OP("TfExtDistinctByShard")
    .Input("keys: Tkey")
    .Output("distinct: Tkey")
    .Output("positions: int32")
    .Output("counts: int32")
    .Attr("Tkey: {int64, string}")
    .Attr("num_shards: int >= 1")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      int num_shards;
      TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &num_shards));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, keys);
      c->set_output(2, c->Vector(num_shards));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The distinct keys of a batch, grouped by the shard (TfExtShardOf) that owns them.

What a table split across ranks sends in one all-to-all (tf_ext/dynamic_embedding/alltoall.py):
distinct[positions] == keys, and distinct holds shard 0's counts[0] keys first, then shard 1's,
each shard's in order of first occurrence.

keys: 1-D keys.
distinct: The distinct keys, grouped by shard.
positions: Each key's index in distinct.
counts: The number of distinct keys of each shard.
num_shards: The number of shards, 1 to 65536.
)doc");

}  // namespace tf_ext
