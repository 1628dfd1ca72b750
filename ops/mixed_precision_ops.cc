// Op interfaces of loss-aware mixed precision's policy. Kernels: kernels/mixed_precision/.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

constexpr int kStateSize = 16;  // amp::PolicyState::kSize (the ops may not include the core)

// The policy's settings, as attributes of both ops (defaults: the core's PolicyConfig).
#define TF_EXT_AMP_POLICY_ATTRS                    \
  Attr("loss_scaling: bool = true")                \
      .Attr("initial_loss_scale: float = 32768.0") \
      .Attr("growth_interval: int = 2000")         \
      .Attr("min_loss_scale: float = 1.0")         \
      .Attr("max_nonfinite_streak: int = 8")       \
      .Attr("probe_tolerance: float = 0.02")       \
      .Attr("spike_sigmas: float = 6.0")           \
      .Attr("spike_warmup_steps: int = 50")        \
      .Attr("loss_decay: float = 0.99")            \
      .Attr("return_after_steps: int = 200")       \
      .Attr("max_return_after_steps: int = 12800") \
      .Attr("stable_half_steps: int = 2000")

Status StepShape(InferenceContext* c) {
  ShapeHandle state, scalar;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &state));
  TF_RETURN_IF_ERROR(c->Merge(state, c->Vector(kStateSize), &state));
  for (int i = 1; i < 5; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
  c->set_output(0, c->Vector(kStateSize));
  c->set_output(1, c->Scalar());
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfExtAmpPolicyInitialState")
    .Output("state: float64")
    .Attr("start_in_half: bool = true")
    .TF_EXT_AMP_POLICY_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(kStateSize));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The state a loss-aware precision policy starts in.

In half precision when `start_in_half`, else full; with the initial loss scale. The state's
layout and the rules: kernels/mixed_precision/core/loss_aware_policy.h.
)doc");

REGISTER_OP("TfExtAmpPolicyStep")
    .Input("state: float64")
    .Input("loss: float")
    .Input("gradients_finite: bool")
    .Input("probe_error: float")
    .Input("ran_half: bool")
    .Output("next_state: float64")
    .Output("apply: bool")
    .TF_EXT_AMP_POLICY_ATTRS.SetShapeFn(StepShape)
    .Doc(R"doc(
Decides one training step of the loss-aware precision policy.

Outputs whether the step's update is applied, and the state (precision, loss scale, counters,
loss statistics) for the next step.

probe_error: the step's precision-probe relative loss error, or a negative value when no probe
ran. ran_half: whether the step's compute ran in half precision (the output of the graph's
TfExtAmpHalfMode; false eagerly, where nothing is rewritten). A pure function of its inputs; the
caller keeps the state in a variable.
)doc");

#undef TF_EXT_AMP_POLICY_ATTRS

REGISTER_OP("TfExtAmpHalfMode")
    .Input("half: bool")
    .Output("use_half: bool")
    .Attr("half_dtype: {bfloat16, half}")
    .Attr("allow_ops: list(string) = []")
    .Attr("infer_ops: list(string) = []")
    .Attr("deny_ops: list(string) = []")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &scalar));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Marks a training step for the loss-aware mixed-precision rewrite; outputs its input.

A graph that holds this op gets a `half_dtype` version of its compute-heavy ops beside the fp32
one, and this op's output chooses per step which runs (kernels/mixed_precision/half_rewrite_pass.cc).
allow_ops, infer_ops, deny_ops: op types added to the rewrite's allow, infer and deny lists.
)doc");

REGISTER_OP("TfExtAmpProbe")
    .Input("loss: float")
    .Input("reference: float")
    .Input("probed: bool")
    .Output("error: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      for (int i = 0; i < 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Outputs the precision probe's relative loss error, or -1 when no probe ran this step.

|loss - reference| / max(|reference|, tiny) when `probed`. The mixed-precision rewrite connects
`reference` to the loss computed again in fp32 on the same batch; before the rewrite (or where
the loss does not depend on a half op) the reference is the loss itself.
)doc");

}  // namespace tf_ext
