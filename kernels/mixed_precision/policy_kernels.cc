// CPU kernels of the loss-aware precision policy: attributes and tensors in, the core
// (kernels/mixed_precision/core) decides.
#include <initializer_list>
#include <string>

#include "kernels/mixed_precision/core/loss_aware_policy.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_ext {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::errors::InvalidArgument;

Status ReadConfig(OpKernelConstruction* ctx, amp::PolicyConfig* config) {
  float initial_loss_scale, min_loss_scale, probe_tolerance, spike_sigmas, loss_decay;
  TF_RETURN_IF_ERROR(ctx->GetAttr("loss_scaling", &config->loss_scaling));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initial_loss_scale", &initial_loss_scale));
  TF_RETURN_IF_ERROR(ctx->GetAttr("growth_interval", &config->growth_interval));
  TF_RETURN_IF_ERROR(ctx->GetAttr("min_loss_scale", &min_loss_scale));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_nonfinite_streak", &config->max_nonfinite_streak));
  TF_RETURN_IF_ERROR(ctx->GetAttr("probe_tolerance", &probe_tolerance));
  TF_RETURN_IF_ERROR(ctx->GetAttr("spike_sigmas", &spike_sigmas));
  TF_RETURN_IF_ERROR(ctx->GetAttr("spike_warmup_steps", &config->spike_warmup_steps));
  TF_RETURN_IF_ERROR(ctx->GetAttr("loss_decay", &loss_decay));
  TF_RETURN_IF_ERROR(ctx->GetAttr("return_after_steps", &config->return_after_steps));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_return_after_steps", &config->max_return_after_steps));
  TF_RETURN_IF_ERROR(ctx->GetAttr("stable_half_steps", &config->stable_half_steps));
  config->initial_loss_scale = initial_loss_scale;
  config->min_loss_scale = min_loss_scale;
  config->probe_tolerance = probe_tolerance;
  config->spike_sigmas = spike_sigmas;
  config->loss_decay = loss_decay;
  std::string error;
  if (!config->Valid(&error)) {
    return InvalidArgument("loss-aware precision policy '", ctx->def().name(), "': ", error);
  }
  return ::tensorflow::OkStatus();
}

// Inputs first, first + 1, ... (named `names`) must be scalars: a graph's shape function checks
// that only where the shapes are known; eagerly, or fed from a placeholder, only the kernel can.
Status CheckScalars(OpKernelContext* ctx, int first, std::initializer_list<const char*> names,
                    const char* what) {
  int i = first;
  for (const char* name : names) {
    const TensorShape& shape = ctx->input(i++).shape();
    if (!TensorShapeUtils::IsScalar(shape)) {
      return InvalidArgument(what, ": ", name, " must be a scalar, got shape ",
                             shape.DebugString());
    }
  }
  return ::tensorflow::OkStatus();
}

class PolicyInitialStateOp : public OpKernel {
 public:
  explicit PolicyInitialStateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConfig(ctx, &config_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("start_in_half", &start_in_half_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* state = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({amp::PolicyState::kSize}), &state));
    amp::InitialState(config_, start_in_half_ ? amp::Precision::kHalf : amp::Precision::kFull)
        .ToArray(state->flat<double>().data());
  }

 private:
  amp::PolicyConfig config_;
  bool start_in_half_ = true;
};

class PolicyStepOp : public OpKernel {
 public:
  explicit PolicyStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConfig(ctx, &config_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& state_in = ctx->input(0);
    OP_REQUIRES(
        ctx,
        TensorShapeUtils::IsVector(state_in.shape()) &&
            state_in.NumElements() == amp::PolicyState::kSize,
        InvalidArgument("loss-aware precision policy: state must have shape [",
                        amp::PolicyState::kSize, "], got ", state_in.shape().DebugString()));
    OP_REQUIRES_OK(ctx,
                   CheckScalars(ctx, 1, {"loss", "gradients_finite", "probe_error", "ran_half"},
                                "loss-aware precision policy"));
    amp::PolicyState state = amp::PolicyState::FromArray(state_in.flat<double>().data());
    amp::Observation seen;
    seen.loss = ctx->input(1).scalar<float>()();
    seen.gradients_finite = ctx->input(2).scalar<bool>()();
    const float probe_error = ctx->input(3).scalar<float>()();
    seen.probed = !(probe_error < 0.0f);  // NaN counts as a probe that failed
    seen.probe_error = probe_error;
    seen.ran_half = ctx->input(4).scalar<bool>()();
    const amp::Decision decision = amp::Step(config_, seen, &state);

    Tensor* state_out = nullptr;
    Tensor* apply = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, state_in.shape(), &state_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &apply));
    state.ToArray(state_out->flat<double>().data());
    apply->scalar<bool>()() = decision.apply;
  }

 private:
  amp::PolicyConfig config_;
};

// Outputs its input; the rewrite pass uses its output as the precision predicate.
class HalfModeOp : public OpKernel {
 public:
  explicit HalfModeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
};

class ProbeOp : public OpKernel {
 public:
  explicit ProbeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckScalars(ctx, 0, {"loss", "reference", "probed"}, "precision probe"));
    Tensor* error = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &error));
    const bool probed = ctx->input(2).scalar<bool>()();
    error->scalar<float>()() =
        probed ? static_cast<float>(amp::RelativeLossError(ctx->input(0).scalar<float>()(),
                                                           ctx->input(1).scalar<float>()()))
               : -1.0f;
  }
};

REGISTER_KERNEL_BUILDER(
    Name("TfExtAmpHalfMode").Device(DEVICE_CPU).HostMemory("half").HostMemory("use_half"),
    HalfModeOp);
REGISTER_KERNEL_BUILDER(Name("TfExtAmpProbe").Device(DEVICE_CPU), ProbeOp);
REGISTER_KERNEL_BUILDER(Name("TfExtAmpPolicyInitialState").Device(DEVICE_CPU),
                        PolicyInitialStateOp);
REGISTER_KERNEL_BUILDER(Name("TfExtAmpPolicyStep").Device(DEVICE_CPU), PolicyStepOp);

}  // namespace
}  // namespace tf_ext
