// The kernel of TfExtTableApplyGradient: one fused optimizer step per table row and its slots.
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/apply_rows.h"

namespace tf_ext {

Status OptimizerAttrs::Read(OpKernelConstruction* ctx) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("optimizer", &optimizer));
  TF_RETURN_IF_ERROR(ctx->GetAttr("epsilon_inside_sqrt", &params.epsilon_inside_sqrt));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initial_accumulator_value", &params.initial_accumulator_value));
  TF_RETURN_IF_ERROR(ctx->GetAttr("use_nesterov", &params.use_nesterov));
  if (!de::ParseOptimizerKind(optimizer, &params.kind)) {
    return ::tensorflow::errors::InvalidArgument("the table update has no optimizer '", optimizer,
                                                 "'");
  }
  std::string bias_correction;
  TF_RETURN_IF_ERROR(ctx->GetAttr("bias_correction", &bias_correction));
  if (!de::ParseBiasCorrection(bias_correction, &params.bias_correction)) {
    return ::tensorflow::errors::InvalidArgument("the table update has no bias_correction '",
                                                 bias_correction, "'");
  }
  std::string bias_correction_step;
  TF_RETURN_IF_ERROR(ctx->GetAttr("bias_correction_step", &bias_correction_step));
  shared_bias_correction_step = bias_correction_step == "optimizer";
  return ::tensorflow::OkStatus();
}

Status OptimizerAttrs::ReadInputs(OpKernelContext* ctx, int first_input, const DynamicTable& table,
                                  de::OptimizerParams* step_params, int64_t* step) const {
  for (int i = first_input; i < first_input + 5; ++i) {
    if (ctx->input(i).NumElements() != 1) {
      return table.Invalid("apply: hyperparameter input ", i, " must be a scalar");
    }
  }
  ::tensorflow::OpInputList hyperparameters;
  TF_RETURN_IF_ERROR(ctx->input_list("hyperparameters", &hyperparameters));
  const int num_hyperparameters = de::NumHyperparameters(params.kind);
  if (hyperparameters.size() != num_hyperparameters) {
    return table.Invalid("apply: optimizer '", optimizer, "' takes ", num_hyperparameters,
                         " hyperparameters, got ", hyperparameters.size());
  }
  std::vector<float> extra(num_hyperparameters);
  for (int i = 0; i < num_hyperparameters; ++i) {
    if (hyperparameters[i].NumElements() != 1) {
      return table.Invalid("apply: hyperparameters[", i, "] must be a scalar");
    }
    extra[i] = hyperparameters[i].flat<float>()(0);
  }
  *step_params = params;
  step_params->learning_rate = ctx->input(first_input).flat<float>()(0);
  step_params->beta1 = ctx->input(first_input + 1).flat<float>()(0);
  step_params->beta2 = ctx->input(first_input + 2).flat<float>()(0);
  step_params->epsilon = ctx->input(first_input + 3).flat<float>()(0);
  de::SetHyperparameters(extra.data(), step_params);
  *step = ctx->input(first_input + 4).flat<int64_t>()(0);
  if (shared_bias_correction_step) {
    if (*step < 0) return table.Invalid("apply: the optimizer's step is negative: ", *step);
    step_params->shared_prior_updates = *step;
  }
  return ::tensorflow::OkStatus();
}

namespace {

template <typename Key>
class ApplyGradientOp : public TableKernel {
 public:
  explicit ApplyGradientOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    OP_REQUIRES(ctx, keys.dims() == 1,
                table->Invalid("apply: keys must be 1-D, got ", keys.shape().DebugString()));
    OP_REQUIRES(
        ctx,
        grads.dims() == 2 && grads.dim_size(0) == keys.dim_size(0) && grads.dim_size(1) == dim_,
        table->Invalid("apply: gradients must have shape [", keys.dim_size(0), ", ", dim_,
                       "], got ", grads.shape().DebugString()));
    de::OptimizerParams params;
    int64_t step;
    OP_REQUIRES_OK(ctx, attrs_.ReadInputs(ctx, 3, *table, &params, &step));
    OP_REQUIRES_OK(ctx, CheckCallIds(*table, keys));  // the backend checks the row limit
    OP_REQUIRES_OK(ctx, table->template backend<Key>()->Apply(ctx, params, step, keys,
                                                              grads.flat<float>().data()));
  }

 private:
  OptimizerAttrs attrs_;
};

#define TF_EXT_REGISTER_APPLY_GRADIENT(Key, TfType)                                      \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("TfExtTableApplyGradient").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), \
      ApplyGradientOp<Key>);

TF_EXT_REGISTER_APPLY_GRADIENT(int64_t, int64_t)
TF_EXT_REGISTER_APPLY_GRADIENT(std::string, tstring)

// On the GPU the hyperparameters are read on the host (OptimizerAttrs::ReadInputs).
TF_EXT_REGISTER_GPU_KERNEL(::tensorflow::KernelDefBuilder("TfExtTableApplyGradient")
                               .TypeConstraint<int64_t>("Tkey")
                               .HostMemory("learning_rate")
                               .HostMemory("beta1")
                               .HostMemory("beta2")
                               .HostMemory("epsilon")
                               .HostMemory("global_step")
                               .HostMemory("hyperparameters"),
                           ApplyGradientOp<int64_t>)

}  // namespace
}  // namespace tf_ext
