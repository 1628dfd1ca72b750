// Op interfaces of the fused embedding subgraph: the markers that tf_ext's lookups leave in a
// graph, and the fused ops that kernels/graph/embedding_fusion_pass.cc puts in their place.
// Kernels: kernels/dynamic_embedding/fused_lookup_kernels.cc and fused_apply_kernels.cc; combiner
// arithmetic: kernels/dynamic_embedding/core/combiners.h.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfExtEmbeddingField")
    .Input("embeddings: float")
    .Input("rows: float")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("segment_ids: int64")
    .Input("num_segments: int64")
    .Output("output: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .Attr("combiner: {'none', 'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Marks one embedding lookup: outputs `embeddings` unchanged.

`embeddings` is the lookup's result, computed by the graph before it from `rows` (TfExtTableFind
of `keys` in `table`); the other inputs say how, so that the graph pass can compute it in one
fused op for all lookups of a step: combiner none gives rows (shape keys.shape + [dim]); sum, mean
and sqrtn combine the rows of 1-D `keys` by `segment_ids` into `num_segments` rows.
)doc");

REGISTER_OP("TfExtEmbeddingRowsGradient")
    .Input("row_gradients: float")
    .Input("output_gradients: float")
    .Input("keys: Tkey")
    .Input("segment_ids: int64")
    .Input("num_segments: int64")
    .Output("output: float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
    .Attr("combiner: {'none', 'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Marks the gradient of one embedding lookup's rows: outputs `row_gradients` unchanged.

`row_gradients` ([len(keys), dim], keys flattened) is computed by the graph before it from
`output_gradients`, the gradient of the lookup's output; the graph pass computes it in the fused
apply instead.
)doc");

namespace {

// The per-field attrs, one entry per field. Tkeys too: the shape function finds field i's inputs
// by position (keys at N + i, num_segments at 3N + i), past the end of the inputs unless there
// are N keys tensors.
Status FieldLists(InferenceContext* c, int* n, std::vector<int64_t>* dims,
                  std::vector<std::string>* combiners) {
  std::vector<::tensorflow::DataType> key_types;
  TF_RETURN_IF_ERROR(c->GetAttr("N", n));
  TF_RETURN_IF_ERROR(c->GetAttr("Tkeys", &key_types));
  TF_RETURN_IF_ERROR(c->GetAttr("dims", dims));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", combiners));
  if (static_cast<int>(key_types.size()) != *n || static_cast<int>(dims->size()) != *n ||
      static_cast<int>(combiners->size()) != *n) {
    return ::tensorflow::errors::InvalidArgument("keys, dims and combiners must have N = ", *n,
                                                 " entries, got ", key_types.size(), ", ",
                                                 dims->size(), " and ", combiners->size());
  }
  for (int64_t dim : *dims) {
    if (dim < 0) return ::tensorflow::errors::InvalidArgument("dims must be >= 0, got ", dim);
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfExtFusedEmbeddingLookup")
    .Input("tables: N * resource")
    .Input("keys: Tkeys")
    .Input("segment_ids: N * int64")
    .Input("num_segments: N * int64")
    .Input("concat_extras: num_concat_extras * float")
    .Output("embeddings: N * float")
    .Output("concatenated: float")
    .Output("distinct_slots: N * int32")
    .Attr("N: int >= 1")
    .Attr("Tkeys: list({int64, string})")
    .Attr("dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr("num_concat_extras: int >= 0 = 0")
    .Attr("concat_layout: list(int) = []")
    .Attr("concat_axis: int = 0")
    .Attr("unread_fields: list(int) = []")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      std::vector<int64_t> dims;
      std::vector<std::string> combiners;
      TF_RETURN_IF_ERROR(FieldLists(c, &n, &dims, &combiners));
      for (int i = 0; i < n; ++i) {
        ShapeHandle out;
        if (combiners[i] == "none") {
          TF_RETURN_IF_ERROR(c->Concatenate(c->input(n + i), c->Vector(dims[i]), &out));
        } else {
          DimensionHandle rows;
          TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3 * n + i, &rows));
          out = c->Matrix(rows, dims[i]);
        }
        c->set_output(i, out);
      }
      std::vector<int64_t> layout;
      TF_RETURN_IF_ERROR(c->GetAttr("concat_layout", &layout));
      c->set_output(n, layout.empty() ? c->Vector(0) : c->UnknownShape());
      for (int i = 0; i < n; ++i) c->set_output(n + 1 + i, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
All embedding lookups of a step in one op.

Field i looks keys[i] up in tables[i] and combines the rows as combiners[i] says (see
TfExtEmbeddingField). Equal, to the bit, to the unfused lookups.

With a concat_layout, `concatenated` is ConcatV2 along concat_axis of the pieces that the
layout names (entry i >= 0 is embeddings[i], entry -1 - k is concat_extras[k]), and the fields
are written into it directly. The fields listed in unread_fields (only shapes of them are read) keep their
shapes but not their values. Without a layout, `concatenated` is empty.

distinct_slots[i] gives each of the int64 keys[i] its position among the field's distinct keys,
in order of first occurrence, for TfExtFusedEmbeddingApply; it is empty for string keys.
)doc");

REGISTER_OP("TfExtFusedEmbeddingApply")
    .Input("tables: N * resource")
    .Input("keys: Tkeys")
    .Input("segment_ids: N * int64")
    .Input("num_segments: N * int64")
    .Input("output_gradients: N * float")
    .Input("learning_rate: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("global_step: int64")
    .Input("hyperparameters: num_hyperparameters * float")
    .Input("split_sizes: Tsplit_sizes")
    .Input("distinct_slots: N * int32")
    .Attr("N: int >= 1")
    .Attr("Tkeys: list({int64, string})")
    .Attr("dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr(
        "optimizer: {'sgd', 'adagrad', 'adam', 'amsgrad', 'momentum', 'keras_momentum', 'ftrl', "
        "'rmsprop', 'centered_rmsprop', 'rmsprop_momentum', 'centered_rmsprop_momentum', "
        "'adadelta', 'proximal_sgd', 'proximal_adagrad', 'adagrad_da', 'adamax', 'nadam'}")
    .Attr("epsilon_inside_sqrt: bool = false")
    .Attr("bias_correction: {'exact', 'tf1', 'keras_legacy', 'keras'} = 'exact'")
    .Attr("bias_correction_step: {'row', 'optimizer'} = 'row'")
    .Attr("initial_accumulator_value: float = 0.0")
    .Attr("use_nesterov: bool = false")
    .Attr("num_hyperparameters: int >= 0 = 0")
    .Attr("Tsplit_sizes: list({int32, int64}) >= 0 = []")
    .Attr("gradient_splits: list(int) = []")
    .Attr("gradient_split_axes: list(int) = []")
    .Attr("field_updates: list(int) = []")
    .SetShapeFn([](InferenceContext* c) { return ::tensorflow::OkStatus(); })
    .Doc(R"doc(
The optimizer steps of all lookups of a step in one op.

For field i, the gradient of each key's row follows from output_gradients[i] through
combiners[i], the gradients of equal keys are summed, and tables[i] applies them as
TfExtTableApplyGradient does (same attributes and inputs).

Where gradient_splits[i] = k >= 0, output_gradients[i] is the input of a SplitV and field i's
gradient its output k: the split of it along gradient_split_axes[i] by the next entry of
split_sizes (one per such field, in field order), read from there instead of from a copy.

A non-empty distinct_slots[i] is TfExtFusedEmbeddingLookup's for the same keys: the distinct
keys follow from it without hashing them again. Each key is checked against its slot's key.

field_updates[i] is the table update field i belongs to, counting up from 0 in field order: the
fields of one update (several lookups of one table, whose gradients TensorFlow concatenates in
that order) are consecutive and share table, key type and dim, and their keys' gradients are
summed together, in field order, into one update. Empty: one update per field.
)doc");

}  // namespace tf_ext
