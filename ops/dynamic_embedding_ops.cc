// Op interfaces of the dynamic embedding table. Kernels: kernels/dynamic_embedding/.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

Status ScalarHandle(InferenceContext* c) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  return ::tensorflow::OkStatus();
}

Status KeysThenDimShape(InferenceContext* c) {  // keys.shape + [dim]
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(dim), &out));
  c->set_output(0, out);
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfExtDynamicTable")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("table_name: string")
    .Attr("key_dtype: {int64, string}")
    .Attr("dim: int")
    .Attr("initializer: string = 'zeros'")
    .Attr("init_a: float = 0.0")
    .Attr("init_b: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("initializer_version: int = 1")
    .Attr("admission_min_count: int = 0")
    .Attr("admission_exact: bool = false")
    .Attr("admission_sketch_width: int = 0")
    .Attr("admission_sketch_depth: int = 4")
    .Attr("max_rows: int = 2147483648")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Gets or creates a dynamic embedding table, by shared_name.

The table is an exact hash map from int64 or string keys to rows of `dim` floats, growing with
the number of keys. A missing key reads its initial row, a function of the key and the initializer
alone (kernels/dynamic_embedding/core/initializers.h), so the same key reads the same row in any
process and whatever the table holds.

table: The table's resource handle.
table_name: The table's name in error messages.
key_dtype: The key type: int64 or string.
dim: The row width, 1 to 4096.
initializer: One of zeros, constant (init_a), uniform in [init_a, init_b), normal or
truncated_normal (mean init_a, standard deviation init_b, redrawn beyond two standard deviations).
seed: The seed of the random initializers.
initializer_version: The generator of normal and truncated_normal rows: 1 (the first, the default)
or 2 (float math, several times faster); the other kinds are the same in both.
admission_min_count: Above 1, an id gets a row only at its admission_min_count-th training update;
until then its updates are counted and dropped (kernels/dynamic_embedding/core/admission.h).
admission_exact: Count with exact per-id counters instead of a count-min sketch.
admission_sketch_width: Counters per sketch row (rounded down to a power of two, at least 1024).
admission_sketch_depth: Sketch rows, 1 to 16.
)doc");

REGISTER_OP("TfExtTableFind")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("gradient_anchor: float")
    .Output("values: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .SetShapeFn(KeysThenDimShape)
    .Doc(R"doc(
Looks up the rows of `keys`, never changing the table.

A missing key reads its initial row.

keys: Any shape.
gradient_anchor: Unused by the kernel; the Python gradient routes the gradient of `values`
through it to the table's optimizer.
values: Shape keys.shape + [dim].
)doc");

REGISTER_OP("TfExtTableFindWithPresence")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("gradient_anchor: float")
    .Output("values: float")
    .Output("present: bool")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(KeysThenDimShape(c));
      c->set_output(1, c->input(1));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
TfExtTableFind, also telling which keys had a row.

keys: Any shape.
gradient_anchor: As TfExtTableFind's.
values: Shape keys.shape + [dim]; a missing key's initial row.
present: Shape keys.shape: whether each key had a row.
)doc");

REGISTER_OP("TfExtRaggedSegmentIds")
    .Input("row_splits: Tsplits")
    .Output("segment_ids: int64")
    .Attr("Tsplits: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The row of each value of a RaggedTensor, as RaggedTensor.value_rowids() gives it.

One op for lookups of ragged ids, where TensorFlow's value_rowids() is a chain of them (about
0.2 ms for 20,000 values).

row_splits: The RaggedTensor's row_splits: 1-D, starting at 0, never decreasing.
segment_ids: row_splits[-1] entries: r for each value of row r.
)doc");

REGISTER_OP("TfExtTableInsert")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("values: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Sets the rows of `keys` to `values`.

A new key's optimizer slots start at their initial values; an existing key keeps its slots,
update count and last step. Of duplicate keys, the last row wins.

keys: Any shape.
values: Shape keys.shape + [dim].
)doc");

REGISTER_OP("TfExtTableRemove")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Attr("Tkey: {int64, string}")
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Removes `keys` from the table; keys it does not hold are ignored.

A removed key reads its initial row again. Its memory is reused by later keys.
)doc");

REGISTER_OP("TfExtTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The number of keys in the table.");

REGISTER_OP("TfExtTableMemoryBytes")
    .Input("table: resource")
    .Output("bytes: int64")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The bytes the table holds for its entries and index.");

REGISTER_OP("TfExtTableClear")
    .Input("table: resource")
    .SetShapeFn(ScalarHandle)
    .Doc("Removes every key from the table.");

REGISTER_OP("TfExtTableExport")
    .Input("table: resource")
    .Output("keys: Tkey")
    .Output("values: float")
    .Output("slots: float")
    .Output("update_counts: int64")
    .Output("last_steps: int64")
    .Output("slot_initial_values: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      c->set_output(2, c->Matrix(n, c->UnknownDim()));
      c->set_output(3, c->Vector(n));
      c->set_output(4, c->Vector(n));
      c->set_output(5, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Exports every entry of the table, a consistent snapshot.

Row i of every output belongs to keys[i]. The outputs are TfExtTableImport's inputs and, in this
order and with these names, the tensors of a checkpoint (tf_ext/dynamic_embedding/variable.py).

values: The rows, [n, dim].
slots: The optimizer slots of each row, [n, num_slots * dim].
update_counts: How many optimizer steps updated each row.
last_steps: The global step of each row's last update.
slot_initial_values: The initial value of each slot, [num_slots].
)doc");

REGISTER_OP("TfExtTableImport")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("values: float")
    .Input("slots: float")
    .Input("update_counts: int64")
    .Input("last_steps: int64")
    .Input("slot_initial_values: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Replaces the whole content of the table with a snapshot, atomically.

The inputs are TfExtTableExport's outputs. On any validation error nothing changes. Slots the
table already has beyond the snapshot's are kept, at their initial values.
)doc");

}  // namespace tf_ext
