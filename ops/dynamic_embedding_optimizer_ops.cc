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
    .Input("hyperparameters: num_hyperparameters * float")
    .Attr("Tkey: {int64, string}")
    .Attr("dim: int")
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
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle unused;
      return c->WithRank(c->input(0), 0, &unused);
    })
    .Doc(R"doc(
Applies one optimizer step to the rows of `keys` and their co-located slots.

Missing rows are created first, from the initializer, when the table's admission policy admits
them (the gradient of an id not admitted yet is dropped). Each updated row records its update count
and the step; Adam, AMSGrad, Adamax and Nadam bias-correct (and Nadam schedules its momentum) with
the row's own update count (`bias_correction_step`). Only the rows of `keys` change (lazy updates): the slots of other rows
do not decay.

keys: 1-D, expected unique (the Python caller sums the gradients of duplicates).
gradients: Shape [len(keys), dim].
learning_rate: Every optimizer's.
beta1: Adam's, AMSGrad's, Adamax's and Nadam's; ignored by the others.
beta2: Adam's, AMSGrad's, Adamax's and Nadam's; ignored by the others.
epsilon: Adagrad's, Adam's, AMSGrad's, RMSprop's, Adadelta's, Adamax's and Nadam's; ignored by the
  others.
global_step: Recorded as each updated row's last step; the optimizer's step before this update
  (bias_correction_step).
hyperparameters: By optimizer: momentum and keras_momentum [momentum]; ftrl [l1, l2, l2_shrinkage,
  learning_rate_power], l2 including FTRL's beta / (2 * learning_rate); rmsprop, centered_rmsprop
  and adadelta [rho]; rmsprop_momentum and centered_rmsprop_momentum [rho, momentum]; proximal_sgd
  and proximal_adagrad [l1, l2]; adagrad_da [l1, l2, global step as TensorFlow's AdagradDA passes
  it (its global_step + 1)]; nadam [schedule decay: 1 for Keras 2.11+, legacy Keras' decay]; none
  for the others.
optimizer: Slots per row in brackets. sgd []; adagrad [accumulator]; adam [m, v]; amsgrad [m, v,
  max v]; momentum, tf.compat.v1.train.MomentumOptimizer [accum = momentum * accum + g];
  keras_momentum, Keras SGD [accum = momentum * accum - learning_rate * g]; ftrl [accumulator,
  linear], TensorFlow's FTRL-Proximal; rmsprop [ms] and centered_rmsprop [ms, mg], RMSprop without
  momentum (Keras'); rmsprop_momentum [ms, mom] and centered_rmsprop_momentum [ms, mom, mg],
  TensorFlow's (Sparse)ApplyRMSProp and ApplyCenteredRMSProp; adadelta [accum, accum_update];
  proximal_sgd [], tf.compat.v1.train.ProximalGradientDescentOptimizer; proximal_adagrad
  [accumulator]; adagrad_da [gradient accumulator, squared gradient accumulator]; adamax [m, u];
  nadam [m, v].
epsilon_inside_sqrt: Adagrad and RMSprop without momentum divide by sqrt(acc + epsilon) if true,
  else sqrt(acc) + epsilon.
bias_correction: How adam, amsgrad, adamax and nadam compute beta^t (t: the row's update number)
  and the step size: exact, in double; tf1, as tf.compat.v1.train.AdamOptimizer (float32 running
  products of beta); keras_legacy, as legacy Keras (float32 pow, its sparse update's
  lr * (sqrt(1 - beta2^t) / (1 - beta1^t))); keras, as Keras 2.11+ (float32 pow).
bias_correction_step: The t of those bias corrections (and of nadam's momentum schedule): row, the
  row's update number; optimizer, global_step + 1 for every row, as TensorFlow's dense optimizers
  (and TFRA's tables) compute it.
initial_accumulator_value: The initial accumulator of adagrad, ftrl and proximal_adagrad, ms of the
  RMSprop kinds (TF1's RMSProp starts it at 1), the squared accumulator of adagrad_da.
use_nesterov: Nesterov momentum, for momentum and keras_momentum.
num_hyperparameters: The length of `hyperparameters`.
)doc");

}  // namespace tf_ext
