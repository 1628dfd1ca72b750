// The optimizer step on table rows, shared by TfExtTableApplyGradient and
// TfExtFusedEmbeddingApply: their attributes, their hyperparameter inputs, and the update itself.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_APPLY_ROWS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_APPLY_ROWS_H_

#include <string>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "kernels/dynamic_embedding/table_kernel.h"

namespace tf_ext {

// The optimizer attributes: optimizer, epsilon_inside_sqrt, bias_correction,
// bias_correction_step, initial_accumulator_value, use_nesterov.
struct OptimizerAttrs {
  de::OptimizerParams params;
  std::string optimizer;
  // bias_correction_step 'optimizer': every row's bias corrections use the global_step input.
  bool shared_bias_correction_step = false;

  Status Read(OpKernelConstruction* ctx);
  // params with the inputs learning_rate, beta1, beta2, epsilon, global_step and hyperparameters,
  // of which learning_rate is input `first_input`.
  Status ReadInputs(OpKernelContext* ctx, int first_input, const DynamicTable& table,
                    de::OptimizerParams* step_params, int64_t* step) const;
};

// Gives the table the slots the optimizer needs (before any update of this step).
template <typename Key>
void EnsureSlots(DynamicTable* table, const de::OptimizerParams& params) {
  de::EmbeddingTable<Key>* core = table->template table<Key>();
  const int slots_needed = de::NumSlots(params.kind);
  if (core->num_slots() < slots_needed) {
    core->EnsureSlots(slots_needed, de::SlotInitialValues(params));
  }
}

// One optimizer step on the rows of the n distinct keys key_at(0..n-1), gradients[n, dim], in the
// calling thread. EnsureSlots first.
template <typename Key, typename KeyAt>
void UpdateRows(DynamicTable* table, const de::OptimizerParams& params, int64_t step, int64_t n,
                KeyAt&& key_at, const float* gradients) {
  const int dim = table->dim();
  // UpdateBatch applies admission, then counts each update and records the step.
  table->template table<Key>()->UpdateBatch(n, key_at, step, [&](int64_t j, de::RowRef& row) {
    de::ApplyGradient(params, *row.update_count, gradients + j * dim, dim, row.embedding,
                      row.slots);
  });
}

// UpdateRows on the intra-op pool, parallel over the keys.
template <typename Key, typename KeyAt>
void ApplyRows(OpKernelContext* ctx, DynamicTable* table, const de::OptimizerParams& params,
               int64_t step, int64_t n, KeyAt&& key_at, const float* gradients) {
  EnsureSlots<Key>(table, params);
  ParallelFor(ctx, n, 300 + 10 * table->dim(), [&](int64_t begin, int64_t end) {
    UpdateRows<Key>(
        table, params, step, end - begin, [&](int64_t j) { return key_at(begin + j); },
        gradients + begin * table->dim());
  });
}

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_APPLY_ROWS_H_
