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

}  // namespace tf_ext
