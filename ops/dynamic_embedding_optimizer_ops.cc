// Op interface of the fused optimizer step on table rows. Kernel:
// kernels/dynamic_embedding/optimizer_kernels.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

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
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle unused;
      return c->WithRank(c->input(0), 0, &unused);
    })
    .Doc(R"doc(
Applies one optimizer step to the rows of `keys` and their co-located slots.

Missing rows are created first, from the initializer. Each updated row records its update count
and the step; Adam bias-corrects with the row's own update count.

keys: 1-D, expected unique (the Python caller sums the gradients of duplicates).
gradients: Shape [len(keys), dim].
optimizer: One of sgd, adagrad, adam.
epsilon_inside_sqrt: Adagrad divides by sqrt(acc + epsilon) if true, else sqrt(acc) + epsilon.
initial_accumulator_value: Adagrad's initial accumulator.
)doc");

}  // namespace tf_ext
