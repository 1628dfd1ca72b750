// Replacing a CPU table's whole content, shared by the import, restore and checkpoint ops: the
// new content is built aside in a fresh core table, checked, then swapped in, so a failure
// leaves the table as it was.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESTORE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESTORE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/table_kernel.h"
#include "kernels/dynamic_embedding/table_resource.h"

namespace tf_ext {

// An empty core table like the table's (dim, initializer, shards, admission), to build a
// restore in: SwapContents moves everything, admission counts included.
template <typename Key>
de::EmbeddingTable<Key> EmptyTableLike(DynamicTable* table) {
  const de::EmbeddingTable<Key>& live = *table->template table<Key>();
  return de::EmbeddingTable<Key>(live.dim(), live.initializer(), live.shard_bits(),
                                 live.admission());
}

// Swaps `fresh` in as the table's content. Slots the table already has beyond fresh's are kept
// at their initial values (an optimizer may have widened the table before the restore).
template <typename Key>
void SwapInRestored(DynamicTable* table, de::EmbeddingTable<Key>* fresh) {
  de::EmbeddingTable<Key>* live = table->template table<Key>();
  if (live->num_slots() > fresh->num_slots()) {
    fresh->EnsureSlots(live->num_slots(), live->slot_initial_values());
  }
  live->SwapContents(*fresh);
}

// Checks the tensors of TfExtTableExport (TfExtTableImport's inputs) against the table, then
// replaces the content with them (KeyedBackend::Import).
template <typename Key>
Status ImportTensors(OpKernelContext* ctx, DynamicTable* table, const Tensor& keys,
                     const Tensor& values, const Tensor& slots, const Tensor& counts,
                     const Tensor& steps, const Tensor& slot_init) {
  const int dim = table->dim();
  if (keys.dims() != 1) {
    return table->Invalid("import: keys must be 1-D, got shape ", keys.shape().DebugString());
  }
  const int64_t n = keys.dim_size(0);
  // The import replaces the content: its keys become the rows (refused past the limit).
  const std::string too_many_rows = de::CheckTableRows(table->name(), 0, n, table->max_rows());
  if (!too_many_rows.empty()) return ::tensorflow::errors::ResourceExhausted(too_many_rows);
  TF_RETURN_IF_ERROR(CheckKeyLengths(*table, keys));
  if (values.dims() != 2 || values.dim_size(0) != n) {
    return table->Invalid("import: values must have shape [", n, ", ", dim, "], got ",
                          values.shape().DebugString());
  }
  if (values.dim_size(1) != dim) {
    return table->Invalid("import: the data has dim ", values.dim_size(1),
                          " but the table has dim ", dim);
  }
  if (slot_init.dims() != 1 || slot_init.NumElements() > de::kMaxSlots) {
    return table->Invalid("import: slot_initial_values must be a vector of at most ", de::kMaxSlots,
                          " values, got shape ", slot_init.shape().DebugString());
  }
  const int num_slots = static_cast<int>(slot_init.NumElements());
  if (slots.dims() != 2 || slots.dim_size(0) != n || slots.dim_size(1) != num_slots * dim) {
    return table->Invalid("import: slots must have shape [", n, ", ", num_slots * dim, "], got ",
                          slots.shape().DebugString());
  }
  if (counts.shape() != keys.shape() || steps.shape() != keys.shape()) {
    return table->Invalid("import: update_counts and last_steps must have shape [", n, "]");
  }
  const auto init = slot_init.flat<float>();
  ImportedRows rows;
  rows.n = n;
  rows.values = values.flat<float>().data();
  rows.slots = slots.flat<float>().data();
  rows.update_counts = counts.flat<int64_t>().data();
  rows.last_steps = steps.flat<int64_t>().data();
  rows.slot_initial_values.assign(init.data(), init.data() + num_slots);
  return table->template backend<Key>()->Import(ctx, keys, rows);
}

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESTORE_H_
