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
  for (int i = 1; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
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
    .Output("next_state: float64")
    .Output("apply: bool")
    .TF_EXT_AMP_POLICY_ATTRS.SetShapeFn(StepShape)
    .Doc(R"doc(
Decides one training step of the loss-aware precision policy.

Outputs whether the step's update is applied, and the state (precision, loss scale, counters,
loss statistics) for the next step.

probe_error: the step's precision-probe relative loss error, or a negative value when no probe
ran. A pure function of its inputs; the caller keeps the state in a variable.
)doc");

#undef TF_EXT_AMP_POLICY_ATTRS

}  // namespace tf_ext
