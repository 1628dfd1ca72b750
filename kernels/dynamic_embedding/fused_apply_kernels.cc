// TfExtFusedEmbeddingApply (ops/dynamic_embedding_fusion_ops.cc): every field's optimizer update
// in one op, each table's distinct ids updated once with their summed gradients.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/dynamic_embedding/apply_rows.h"
#include "kernels/dynamic_embedding/core/column_windows.h"
#include "kernels/dynamic_embedding/core/combiners.h"
#include "kernels/dynamic_embedding/core/distinct_lookup.h"
#include "kernels/dynamic_embedding/fused_fields.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tf_ext {
namespace {

// A field's output gradient that is a piece of a SplitV's input (the fused apply reads it there).
struct SplitGradient {
  bool split = false;
  de::ColumnWindow window;
};

// A field's distinct keys (ints or strings, by key type) and each key's slot among them: the fused
// lookup's (given) or the apply's own.
struct DistinctIndex {
  std::vector<int64_t> ints;
  std::vector<std::string_view> strings;
  const int32_t* given = nullptr;
  std::vector<int64_t> own;
  // The distinct keys of a table of key type TableKey.
  template <typename TableKey>
  std::vector<typename KeyTensor<TableKey>::KeyView>* distinct() {
    if constexpr (std::is_same_v<TableKey, int64_t>) {
      return &ints;
    } else {
      return &strings;
    }
  }
  template <typename TableKey>
  const std::vector<typename KeyTensor<TableKey>::KeyView>& distinct() const {
    return *const_cast<DistinctIndex*>(this)->distinct<TableKey>();
  }
  int64_t slot(int64_t i) const { return given != nullptr ? given[i] : own[i]; }
};

// The fields of each table update, as [begin, end) ranges: field_updates[i] is field i's update,
// counting up from 0 in field order over consecutive fields (the lookups of one table, whose
// gradients TensorFlow concatenates into one update); empty: one update per field.
Status UpdateRanges(const std::vector<int64_t>& field_updates, int n,
                    std::vector<std::pair<int, int>>* ranges) {
  ranges->clear();
  if (field_updates.empty()) {
    for (int i = 0; i < n; ++i) ranges->emplace_back(i, i + 1);
    return ::tensorflow::OkStatus();
  }
  if (static_cast<int>(field_updates.size()) != n) {
    return ::tensorflow::errors::InvalidArgument("field_updates has ", field_updates.size(),
                                                 " entries for N = ", n, " fields");
  }
  for (int i = 0; i < n; ++i) {
    const int64_t next = static_cast<int64_t>(ranges->size());
    if (field_updates[i] == next) {
      ranges->emplace_back(i, i + 1);
    } else if (i > 0 && field_updates[i] == next - 1) {
      ranges->back().second = i + 1;
    } else {
      return ::tensorflow::errors::InvalidArgument(
          "field_updates[", i, "] is ", field_updates[i],
          ": updates count up from 0 in field order, each over consecutive fields");
    }
  }
  return ::tensorflow::OkStatus();
}

Status IndexField(const Field& field, const Tensor& given_slots, DistinctIndex* index) {
  const int64_t given = given_slots.NumElements();
  if (given != 0 && given != field.num_keys) {
    return field.table->Invalid("fused apply: distinct_slots has ", given, " entries for ",
                                field.num_keys, " keys (it must have one per key, or none)");
  }
  std::string error;
  bool consistent = true;
  WithKeys(field, [&](auto* key_type, auto key_at) {
    using TableKey = std::remove_pointer_t<decltype(key_type)>;
    auto* distinct = index->template distinct<TableKey>();
    if (given == 0) {
      index->own.resize(field.num_keys);
      de::IndexDistinctKeys(field.num_keys, key_at, distinct, index->own.data());
      return;
    }
    index->given = given_slots.flat<int32_t>().data();
    consistent = de::DistinctKeysOfSlots(field.num_keys, key_at, index->given, distinct, &error);
  });
  if (!consistent) {
    return field.table->Invalid("fused apply: distinct_slots are not those of the keys: ", error);
  }
  return ::tensorflow::OkStatus();
}

class FusedApplyOp : public FusedFieldsKernel {
 public:
  explicit FusedApplyOp(OpKernelConstruction* ctx) : FusedFieldsKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("gradient_splits", &gradient_splits_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("gradient_split_axes", &gradient_split_axes_));
    std::vector<int64_t> field_updates;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("field_updates", &field_updates));
    OP_REQUIRES_OK(ctx, UpdateRanges(field_updates, n_, &updates_));
    if (gradient_splits_.empty()) gradient_splits_.assign(n_, -1);
    if (gradient_split_axes_.empty()) gradient_split_axes_.assign(n_, 0);
    OP_REQUIRES(ctx,
                static_cast<int>(gradient_splits_.size()) == n_ &&
                    static_cast<int>(gradient_split_axes_.size()) == n_,
                ::tensorflow::errors::InvalidArgument(
                    "gradient_splits and gradient_split_axes need N = ", n_, " entries"));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<Field> fields;
    OP_REQUIRES_OK(ctx, ReadFields(ctx, &fields));
    OP_REQUIRES_OK(ctx, CheckUpdates(fields));
    for (Field& field : fields) {
      OP_REQUIRES_OK(ctx, field.table->key_dtype() == DT_STRING
                              ? CheckRowsFit<std::string>(*field.table, *field.keys)
                              : CheckRowsFit<int64_t>(*field.table, *field.keys));
    }
    std::vector<SplitGradient> splits;
    OP_REQUIRES_OK(ctx, ReadSplits(ctx, fields, &splits));
    de::OptimizerParams params;
    int64_t step;
    OP_REQUIRES_OK(ctx, attrs_.ReadInputs(ctx, 5 * n_, *fields[0].table, &params, &step));

    // The optimizer's slots first, table by table.
    for (const Field& field : fields) {
      if (field.keys->dtype() == DT_INT64) {
        EnsureSlots<int64_t>(field.table.get(), params);
      } else {
        EnsureSlots<std::string>(field.table.get(), params);
      }
    }
    // First, one task per field: the field's distinct keys and each key's slot among them, from
    // the fused lookup's distinct_slots where it gave them (checked against the keys), else by
    // hashing the keys; all of them before any table changes, so bad slots change nothing.
    OpInputList given_slots;
    OP_REQUIRES_OK(ctx, ctx->input_list("distinct_slots", &given_slots));
    std::vector<DistinctIndex> indexes(n_);
    OP_REQUIRES_OK(ctx, ForEachField(ctx, fields, [&](int64_t i) {
                     return IndexField(fields[i], given_slots[i], &indexes[i]);
                   }));
    // Then per table update (one field, or the consecutive fields of one table): the gradients of
    // its distinct keys, summed, and their update (tables lock their shards, so updates of one
    // table may overlap).
    std::vector<int64_t> weights;
    for (const auto& [begin, end] : updates_) {
      int64_t weight = 0;
      for (int i = begin; i < end; ++i) weight += fields[i].num_keys * fields[i].dim;
      weights.push_back(weight);
    }
    OP_REQUIRES_OK(
        ctx, ForEachTask(ctx, weights, [&](int64_t u) {
          const auto [begin, end] = updates_[u];
          if (fields[begin].keys->dtype() == DT_INT64) {
            return SumAndUpdate<int64_t>(ctx, fields, splits, indexes, begin, end, params, step);
          }
          return SumAndUpdate<std::string>(ctx, fields, splits, indexes, begin, end, params, step);
        }));
  }

 private:
  // Fields of one update share their table, key type and dim.
  Status CheckUpdates(const std::vector<Field>& fields) const {
    for (const auto& [begin, end] : updates_) {
      for (int i = begin + 1; i < end; ++i) {
        if (fields[i].table.get() != fields[begin].table.get() ||
            fields[i].keys->dtype() != fields[begin].keys->dtype() ||
            fields[i].dim != fields[begin].dim) {
          return fields[i].table->Invalid("fused apply field ", i, " is in one update with field ",
                                          begin, " but not of its table, key type and dim");
        }
      }
    }
    return ::tensorflow::OkStatus();
  }

  // Field i's output gradient rows and their stride: its own tensor, or a piece of a split's input,
  // read in place where the piece's rows are the field's gradient rows (the sums read the rows in
  // order, prefetched), else copied out into *piece.
  const float* GradientRows(OpKernelContext* ctx, int i, const Field& field,
                            const SplitGradient& split, int64_t* stride,
                            std::vector<float>* piece) const {
    const float* rows = ctx->input(4 * n_ + i).flat<float>().data();
    *stride = field.dim;
    if (!split.split) return rows;
    if (split.window.width == field.dim) {
      *stride = split.window.row_width;
      return rows + split.window.column;
    }
    piece->resize(split.window.rows * split.window.width);
    de::CopyFromWindow(rows, split.window, piece->data());
    return piece->data();
  }

  // One table update over fields [begin, end): their keys' gradients summed per distinct key in
  // field order, as the unfused update sums TensorFlow's concatenation of them, then applied.
  // TableKey: the table's key type.
  template <typename TableKey>
  Status SumAndUpdate(OpKernelContext* ctx, const std::vector<Field>& fields,
                      const std::vector<SplitGradient>& splits,
                      const std::vector<DistinctIndex>& indexes, int begin, int end,
                      const de::OptimizerParams& params, int64_t step) const {
    using Key = typename KeyTensor<TableKey>::KeyView;
    const std::vector<Key>* distinct = &indexes[begin].template distinct<TableKey>();
    std::vector<Key> merged;
    std::vector<std::vector<int64_t>> to_merged;
    if (end - begin > 1) {
      std::vector<const std::vector<Key>*> parts;
      for (int i = begin; i < end; ++i) parts.push_back(&indexes[i].template distinct<TableKey>());
      de::MergeDistinctKeys(parts, &merged, &to_merged);
      distinct = &merged;
    }
    const Field& first = fields[begin];
    const int64_t num_distinct = static_cast<int64_t>(distinct->size());
    TF_RETURN_IF_ERROR(first.table->template CheckRowsFit<TableKey>(
        num_distinct, [&](int64_t k) { return (*distinct)[k]; }));
    std::vector<float> sums(num_distinct * first.dim, 0.0f);
    for (int i = begin; i < end; ++i) {
      const Field& field = fields[i];
      const DistinctIndex& index = indexes[i];
      int64_t stride;
      std::vector<float> piece;
      const float* rows = GradientRows(ctx, i, field, splits[i], &stride, &piece);
      const auto add = [&](const auto* slots) {
        de::AddGradientsBySlot(field.combiner, rows, stride, field.segment_ids, field.num_keys,
                               field.num_segments, field.dim, slots, &sums);
      };
      if (end - begin == 1) {
        index.given != nullptr ? add(index.given) : add(index.own.data());
        continue;
      }
      const std::vector<int64_t>& merged_slot = to_merged[i - begin];
      std::vector<int64_t> slots(field.num_keys);
      for (int64_t k = 0; k < field.num_keys; ++k) slots[k] = merged_slot[index.slot(k)];
      add(slots.data());
    }
    UpdateRows<TableKey>(
        first.table.get(), params, step, num_distinct, [&](int64_t k) { return (*distinct)[k]; },
        sums.data());
    return ::tensorflow::OkStatus();
  }

  // Checks each field's output gradient: [rows, dim] elements, in its own tensor or in the piece
  // gradient_splits[i] of the split of output_gradients[i] by the next split_sizes entry.
  Status ReadSplits(OpKernelContext* ctx, const std::vector<Field>& fields,
                    std::vector<SplitGradient>* splits) const {
    OpInputList split_sizes;
    TF_RETURN_IF_ERROR(ctx->input_list("split_sizes", &split_sizes));
    splits->assign(n_, SplitGradient());
    int next_sizes = 0;
    for (int i = 0; i < n_; ++i) {
      const Field& field = fields[i];
      const Tensor& gradient = ctx->input(4 * n_ + i);
      const int64_t rows =
          field.combiner == de::Combiner::kNone ? field.num_keys : field.num_segments;
      int64_t elements = gradient.NumElements();
      if (gradient_splits_[i] >= 0) {
        if (next_sizes >= split_sizes.size()) {
          return field.table->Invalid("fused apply field ", i, ": no split_sizes entry left");
        }
        const Tensor& sizes_tensor = split_sizes[next_sizes++];
        std::vector<int64_t> sizes;
        for (int64_t k = 0; k < sizes_tensor.NumElements(); ++k) {
          sizes.push_back(sizes_tensor.dtype() == DT_INT64 ? sizes_tensor.flat<int64_t>()(k)
                                                           : sizes_tensor.flat<int32_t>()(k));
        }
        std::vector<int64_t> dims;
        for (int d = 0; d < gradient.dims(); ++d) dims.push_back(gradient.dim_size(d));
        std::string error;
        SplitGradient& split = (*splits)[i];
        split.split = true;
        if (!de::SplitWindow(dims, gradient_split_axes_[i], sizes, gradient_splits_[i],
                             &split.window, &error)) {
          return field.table->Invalid("fused apply field ", i, ": ", error);
        }
        elements = split.window.rows * split.window.width;
      }
      if (elements != rows * field.dim) {
        return field.table->Invalid("fused apply field ", i, ": the output gradient has ", elements,
                                    " elements (", gradient_splits_[i] >= 0 ? "a split of " : "",
                                    gradient.shape().DebugString(), "), expected ", rows,
                                    " rows of ", field.dim);
      }
    }
    return ::tensorflow::OkStatus();
  }

  OptimizerAttrs attrs_;
  std::vector<int64_t> gradient_splits_, gradient_split_axes_;
  std::vector<std::pair<int, int>> updates_;  // each update's fields, [begin, end)
};

REGISTER_KERNEL_BUILDER(Name("TfExtFusedEmbeddingApply").Device(DEVICE_CPU), FusedApplyOp);

}  // namespace
}  // namespace tf_ext
