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
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Gets or creates a dynamic embedding table: an exact hash map from keys to float rows of
`dim` values, growing with the number of keys. `initializer` (zeros, constant, uniform,
normal, truncated_normal with parameters init_a, init_b and seed) gives a missing key's row,
deterministically per key.
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
Looks keys up: values has shape keys.shape + [dim]. Never changes the table: a missing key
reads its initial row. `gradient_anchor` is unused by the kernel; the Python gradient routes
the gradient of `values` through it to the table's optimizer.
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
    });

REGISTER_OP("TfExtTableRemove")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Attr("Tkey: {int64, string}")
    .SetShapeFn(ScalarHandle);

REGISTER_OP("TfExtTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtTableMemoryBytes")
    .Input("table: resource")
    .Output("bytes: int64")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtTableClear").Input("table: resource").SetShapeFn(ScalarHandle);

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
    .Doc("A consistent snapshot of every entry: keys, embeddings, slots, metadata.");

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
    .Doc("Replaces the whole content, atomically: on any validation error nothing changes.");

REGISTER_OP("TfExtTableApplyGradient")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("gradients: float")
    .Input("learning_rate: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("global_step: int64")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam'}")
    .Attr("epsilon_inside_sqrt: bool = false")
    .Attr("initial_accumulator_value: float = 0.0")
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Applies one optimizer step to the rows of `keys` (expected unique) and their co-located
slots, creating missing rows from the initializer. Records the update count and the step.
)doc");

}  // namespace tf_ext
