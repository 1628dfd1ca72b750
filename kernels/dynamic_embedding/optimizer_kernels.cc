// The kernel of TfExtTableApplyGradient: one fused optimizer step per table row and its slots.
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "kernels/dynamic_embedding/table_kernel.h"

namespace tf_ext {
namespace {

template <typename Key>
class ApplyGradientOp : public TableKernel {
 public:
  explicit ApplyGradientOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    std::string optimizer;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &optimizer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon_inside_sqrt", &params_.epsilon_inside_sqrt));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr("initial_accumulator_value", &params_.initial_accumulator_value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &params_.use_nesterov));
    OP_REQUIRES(ctx, de::ParseOptimizerKind(optimizer, &params_.kind),
                ::tensorflow::errors::InvalidArgument("the table update has no optimizer '",
                                                      optimizer, "'"));
    optimizer_ = optimizer;
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    const int dim = dim_;
    OP_REQUIRES(ctx, keys.dims() == 1,
                table->Invalid("apply: keys must be 1-D, got ", keys.shape().DebugString()));
    OP_REQUIRES(
        ctx, grads.dims() == 2 && grads.dim_size(0) == keys.dim_size(0) && grads.dim_size(1) == dim,
        table->Invalid("apply: gradients must have shape [", keys.dim_size(0), ", ", dim, "], got ",
                       grads.shape().DebugString()));
    for (int i = 3; i <= 7; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).NumElements() == 1,
                  table->Invalid("apply: hyperparameter input ", i, " must be a scalar"));
    }
    ::tensorflow::OpInputList hyperparameters;
    OP_REQUIRES_OK(ctx, ctx->input_list("hyperparameters", &hyperparameters));
    const int num_hyperparameters = de::NumHyperparameters(params_.kind);
    OP_REQUIRES(ctx, hyperparameters.size() == num_hyperparameters,
                table->Invalid("apply: optimizer '", optimizer_, "' takes ", num_hyperparameters,
                               " hyperparameters, got ", hyperparameters.size()));
    std::vector<float> extra(num_hyperparameters);
    for (int i = 0; i < num_hyperparameters; ++i) {
      OP_REQUIRES(ctx, hyperparameters[i].NumElements() == 1,
                  table->Invalid("apply: hyperparameters[", i, "] must be a scalar"));
      extra[i] = hyperparameters[i].flat<float>()(0);
    }
    de::OptimizerParams params = params_;
    params.learning_rate = ctx->input(3).flat<float>()(0);
    params.beta1 = ctx->input(4).flat<float>()(0);
    params.beta2 = ctx->input(5).flat<float>()(0);
    params.epsilon = ctx->input(6).flat<float>()(0);
    de::SetHyperparameters(extra.data(), &params);
    const int64_t step = ctx->input(7).flat<int64_t>()(0);

    de::EmbeddingTable<Key>* core = table->template table<Key>();
    const int slots_needed = de::NumSlots(params.kind);
    if (core->num_slots() < slots_needed) {
      core->EnsureSlots(slots_needed, de::SlotInitialValues(params));
    }
    const auto flat_keys = keys.flat<typename KeyTensor<Key>::Element>();
    const float* grad_rows = grads.flat<float>().data();
    ParallelFor(ctx, flat_keys.size(), 300 + 10 * dim, [&](int64_t begin, int64_t end) {
      // UpdateBatch applies admission, then counts each update and records the step.
      core->UpdateBatch(
          end - begin, [&](int64_t j) { return KeyTensor<Key>::View(flat_keys(begin + j)); }, step,
          [&](int64_t j, de::RowRef& row) {
            de::ApplyGradient(params, *row.update_count, grad_rows + (begin + j) * dim, dim,
                              row.embedding, row.slots);
          });
    });
  }

 private:
  de::OptimizerParams params_;
  std::string optimizer_;
};

#define TF_EXT_REGISTER_APPLY_GRADIENT(Key, TfType)                                      \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("TfExtTableApplyGradient").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), \
      ApplyGradientOp<Key>);

TF_EXT_REGISTER_APPLY_GRADIENT(int64_t, int64_t)
TF_EXT_REGISTER_APPLY_GRADIENT(std::string, tstring)

}  // namespace
}  // namespace tf_ext
