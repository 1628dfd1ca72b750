// Kernels of the fused embedding subgraph (ops/dynamic_embedding_fusion_ops.cc): the markers pass
// their first input through; TfExtFusedEmbeddingLookup and TfExtFusedEmbeddingApply do every
// field's lookup or update in one op, with the combiner arithmetic of core/combiners.h.
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
#include "tensorflow/core/framework/resource_mgr.h"

namespace tf_ext {
namespace {

using ::tensorflow::DT_INT64;
using ::tensorflow::DT_STRING;
using ::tensorflow::OpInputList;

class ForwardFirstInputOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingField").Device(DEVICE_CPU), ForwardFirstInputOp);
REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingRowsGradient").Device(DEVICE_CPU), ForwardFirstInputOp);

// One field of a fused op: its table, keys, segments and combiner, checked.
struct Field {
  RefCountPtr<DynamicTable> table;
  const Tensor* keys = nullptr;
  const int64_t* segment_ids = nullptr;
  int64_t num_keys = 0;
  int64_t num_segments = 0;
  int dim = 0;
  de::Combiner combiner = de::Combiner::kNone;
};

// Reads the N fields of a fused op (inputs: tables, keys, segment_ids, num_segments).
class FusedFieldsKernel : public OpKernel {
 public:
  explicit FusedFieldsKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkeys", &key_dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    std::vector<std::string> combiners;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &combiners));
    OP_REQUIRES(ctx,
                static_cast<int>(key_dtypes_.size()) == n_ &&
                    static_cast<int>(dims_.size()) == n_ &&
                    static_cast<int>(combiners.size()) == n_,
                ::tensorflow::errors::InvalidArgument("Tkeys, dims and combiners need N = ", n_,
                                                      " entries"));
    combiners_.resize(n_);
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(ctx, de::ParseCombiner(combiners[i], &combiners_[i]),
                  ::tensorflow::errors::InvalidArgument("unknown combiner '", combiners[i], "'"));
    }
  }

 protected:
  Status ReadFields(OpKernelContext* ctx, std::vector<Field>* fields) const {
    fields->resize(n_);
    for (int i = 0; i < n_; ++i) {
      Field& field = (*fields)[i];
      const ::tensorflow::ResourceHandle* handle;
      TF_RETURN_IF_ERROR(ScalarHandle(ctx, i, &handle));
      TF_RETURN_IF_ERROR(::tensorflow::LookupResource(ctx, *handle, &field.table));
      const DynamicTable& table = *field.table;
      TF_RETURN_IF_ERROR(CheckPlacement(*this, /*kernel_on_gpu=*/false, table));
      if (table.key_dtype() != key_dtypes_[i] || table.dim() != dims_[i]) {
        return table.Invalid("fused field ", i, " expects ", DataTypeString(key_dtypes_[i]),
                             " keys and dim ", dims_[i]);
      }
      field.keys = &ctx->input(n_ + i);
      field.num_keys = field.keys->NumElements();
      TF_RETURN_IF_ERROR(CheckCallIds(table, *field.keys));
      field.dim = dims_[i];
      field.combiner = combiners_[i];
      if (field.combiner == de::Combiner::kNone) continue;
      const Tensor& segment_ids = ctx->input(2 * n_ + i);
      const Tensor& num_segments = ctx->input(3 * n_ + i);
      if (field.keys->dims() != 1 || segment_ids.dims() != 1 ||
          segment_ids.NumElements() != field.num_keys || num_segments.NumElements() != 1) {
        return table.Invalid("fused field ", i, ": keys and segment_ids must be 1-D of one length",
                             " and num_segments a scalar, got ", field.keys->shape().DebugString(),
                             ", ", segment_ids.shape().DebugString(), ", ",
                             num_segments.shape().DebugString());
      }
      field.segment_ids = segment_ids.flat<int64_t>().data();
      field.num_segments = num_segments.flat<int64_t>()(0);
      if (field.num_segments < 0) {
        return table.Invalid("fused field ", i, ": num_segments is ", field.num_segments);
      }
      for (int64_t k = 0; k < field.num_keys; ++k) {
        if (field.segment_ids[k] >= field.num_segments) {
          return table.Invalid("fused field ", i, ": segment_ids[", k, "] = ", field.segment_ids[k],
                               " is not below num_segments ", field.num_segments);
        }
      }
    }
    return ::tensorflow::OkStatus();
  }

  // Runs fn(i) for every field on the intra-op pool, one field per task, largest first (so that
  // the small ones fill in at the end); the first error wins.
  template <typename Fn>
  Status ForEachField(OpKernelContext* ctx, const std::vector<Field>& fields, Fn&& fn) const {
    std::vector<int64_t> weights;
    for (const Field& field : fields) weights.push_back(field.num_keys * field.dim);
    return ForEachTask(ctx, weights, fn);
  }

  // Runs fn(k) for every task k (of weights.size()) on the intra-op pool, heaviest first; the
  // first error wins.
  template <typename Fn>
  Status ForEachTask(OpKernelContext* ctx, const std::vector<int64_t>& weights, Fn&& fn) const {
    std::vector<int64_t> order(weights.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    std::vector<Status> statuses(weights.size());
    using ThreadPool = ::tsl::thread::ThreadPool;
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        static_cast<int64_t>(weights.size()),
        ThreadPool::SchedulingParams(ThreadPool::SchedulingStrategy::kFixedBlockSize, std::nullopt,
                                     1),
        [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) statuses[order[k]] = fn(order[k]);
        });
    for (const Status& status : statuses) TF_RETURN_IF_ERROR(status);
    return ::tensorflow::OkStatus();
  }

  int n_ = 0;
  std::vector<DataType> key_dtypes_;
  std::vector<int64_t> dims_;
  std::vector<de::Combiner> combiners_;
};

// Calls fn(key_at) with the field's key accessor for its key type.
template <typename Fn>
void WithKeys(const Field& field, Fn&& fn) {
  if (field.keys->dtype() == DT_INT64) {
    const auto keys = field.keys->flat<int64_t>();
    fn(static_cast<int64_t*>(nullptr), [keys](int64_t i) { return keys(i); });
  } else {
    const auto keys = field.keys->flat<tstring>();
    fn(static_cast<std::string*>(nullptr),
       [keys](int64_t i) { return KeyTensor<std::string>::View(keys(i)); });
  }
}

std::vector<int64_t> DimsOf(const TensorShape& shape) {
  const auto dims = shape.dim_sizes();
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Looks a combiner field's keys up block by block and combines them into out (rows out_stride
// floats apart): the rows of one block at a time, not of all keys, are held.
template <typename Key, typename KeyAt>
void FindAndCombine(const de::EmbeddingTable<Key>& core, const Field& field, KeyAt&& key_at,
                    float* out, int64_t out_stride) {
  const int64_t block_keys = std::min(kLookupBlock, field.num_keys);
  std::unique_ptr<float[]> rows(new float[block_keys * field.dim]);
  de::ZeroSegments(field.num_segments, field.dim, out, out_stride);
  for (int64_t block = 0; block < field.num_keys; block += block_keys) {
    const int64_t count = std::min(block_keys, field.num_keys - block);
    core.FindBatch(
        count, [&](int64_t i) { return key_at(block + i); }, rows.get());
    de::AddRowsToSegments(rows.get(), field.segment_ids + block, count, field.dim, out, out_stride);
  }
  de::DivideSegments(field.combiner, field.segment_ids, field.num_keys, field.num_segments,
                     field.dim, out, out_stride);
}

// A field's int64 keys: each distinct key is looked up once (FindDistinctRows, kLookupBlock at a
// time), and its row copied to each of its keys' output rows (kNone) or added to their segments in
// input order (combiners), into out (rows out_stride floats apart). A batch's ids repeat (in the
// fusion benchmark a tenth are distinct): a probe of the small index of the field's ids costs less
// than one of the table. slots[i] gets key i's position among the distinct keys, which the fused
// apply reuses. The table's statistics count every key, as a lookup per key would.
template <typename KeyAt, typename Slot>
void FindDistinctAndPlace(const de::EmbeddingTable<int64_t>& core, const Field& field,
                          KeyAt&& key_at, float* out, int64_t out_stride, Slot* slots) {
  const bool combine = field.combiner != de::Combiner::kNone;
  const int dim = static_cast<int>(field.dim);
  const de::DistinctRows found = de::FindDistinctRows(core, field.num_keys, key_at, slots,
                                                      kLookupBlock, de::InCallingThread());
  const std::vector<float>& rows = found.rows;
  if (!combine) {
    de::PlaceRows(rows.data(), dim, slots, 0, field.num_keys, out, out_stride);
    return;
  }
  // A combiner field whose rows go to a column window of a wider matrix sums into a contiguous
  // buffer and writes the window once: the window's rows lie far apart, and zeroing, adding and
  // dividing there took cache misses.
  std::vector<float> window_sums;
  float* sums = out;
  int64_t sums_stride = out_stride;
  if (out_stride != dim) {
    window_sums.assign(field.num_segments * dim, 0.0f);
    sums = window_sums.data();
    sums_stride = dim;
  } else {
    de::ZeroSegments(field.num_segments, dim, out, out_stride);
  }
  for (int64_t i = 0; i < field.num_keys; ++i) {
    if (field.segment_ids[i] < 0) continue;
    de::AddRow(rows.data() + slots[i] * dim, dim, sums + field.segment_ids[i] * sums_stride);
  }
  de::DivideSegments(field.combiner, field.segment_ids, field.num_keys, field.num_segments, dim,
                     sums, sums_stride);
  if (window_sums.empty()) return;
  for (int64_t s = 0; s < field.num_segments; ++s) {
    if (s + de::kRowsAhead < field.num_segments) {
      de::PrefetchRow(out + (s + de::kRowsAhead) * out_stride, dim);
    }
    std::memcpy(out + s * out_stride, sums + s * dim, sizeof(float) * dim);
  }
}

class FusedLookupOp : public FusedFieldsKernel {
 public:
  explicit FusedLookupOp(OpKernelConstruction* ctx) : FusedFieldsKernel(ctx) {
    int num_extras;
    std::vector<int64_t> unread;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_concat_extras", &num_extras));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("concat_layout", &concat_layout_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("concat_axis", &concat_axis_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("unread_fields", &unread));
    for (int64_t entry : concat_layout_) {
      OP_REQUIRES(ctx, entry < n_ && entry >= -num_extras,
                  ::tensorflow::errors::InvalidArgument(
                      "concat_layout entry ", entry, " names neither one of the N = ", n_,
                      " fields nor one of the ", num_extras, " concat_extras"));
    }
    unread_.assign(n_, false);
    for (int64_t i : unread) {
      OP_REQUIRES(ctx, i >= 0 && i < n_,
                  ::tensorflow::errors::InvalidArgument("unread_fields entry ", i,
                                                        " is not a field index below N = ", n_));
      unread_[i] = true;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<Field> fields;
    OP_REQUIRES_OK(ctx, ReadFields(ctx, &fields));
    std::vector<float*> outputs(n_);
    std::vector<std::vector<int64_t>> field_dims(n_);
    for (int i = 0; i < n_; ++i) {
      const Field& field = fields[i];
      TensorShape shape;
      if (field.combiner == de::Combiner::kNone) {
        shape = field.keys->shape();
      } else {
        shape.AddDim(field.num_segments);
      }
      shape.AddDim(field.dim);
      field_dims[i] = DimsOf(shape);
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &out));
      outputs[i] = out->flat<float>().data();
    }
    float* concatenated = nullptr;
    std::vector<std::vector<de::ColumnWindow>> field_windows(n_);
    OP_REQUIRES_OK(ctx, Concatenate(ctx, field_dims, &concatenated, &field_windows));
    // Output N + 1 + i: each int64 key's distinct slot, for the fused apply (empty for string keys,
    // and for a field of more keys than int32 counts, which the apply then indexes itself).
    std::vector<int32_t*> slot_outputs(n_, nullptr);
    for (int i = 0; i < n_; ++i) {
      const bool int32_slots = fields[i].keys->dtype() == DT_INT64 &&
                               fields[i].num_keys <= std::numeric_limits<int32_t>::max();
      Tensor* slots;
      OP_REQUIRES_OK(
          ctx, ctx->allocate_output(n_ + 1 + i, TensorShape({int32_slots ? fields[i].num_keys : 0}),
                                    &slots));
      if (int32_slots) slot_outputs[i] = slots->flat<int32_t>().data();
    }

    OP_REQUIRES_OK(
        ctx, ForEachField(ctx, fields, [&](int64_t i) {
          const Field& field = fields[i];
          const std::vector<de::ColumnWindow>& windows = field_windows[i];
          // Where nobody reads the field's own output and its one piece of the
          // concatenation has its rows, the rows go straight there.
          const bool in_place = unread_[i] && windows.size() == 1 && windows[0].width == field.dim;
          float* out = in_place ? concatenated + windows[0].column : outputs[i];
          const int64_t out_stride = in_place ? windows[0].row_width : field.dim;
          WithKeys(field, [&](auto* key_type, auto key_at) {
            using Key = std::remove_pointer_t<decltype(key_type)>;
            const auto& core = *field.table->template table<Key>();
            if constexpr (std::is_same_v<Key, int64_t>) {
              if (slot_outputs[i] != nullptr) {
                FindDistinctAndPlace(core, field, key_at, out, out_stride, slot_outputs[i]);
              } else {
                std::vector<int64_t> slots(field.num_keys);
                FindDistinctAndPlace(core, field, key_at, out, out_stride, slots.data());
              }
            } else if (field.combiner == de::Combiner::kNone) {
              FindRows(core, 0, field.num_keys, key_at, out, out_stride);
            } else {
              FindAndCombine(core, field, key_at, out, out_stride);
            }
          });
          if (!in_place) {
            for (const de::ColumnWindow& window : windows) {
              de::CopyToWindow(outputs[i], window, concatenated);
            }
          }
          return ::tensorflow::OkStatus();
        }));
  }

 private:
  // Allocates output N: the concatenation of concat_layout (empty without one), with the extras
  // copied in and each field's windows in *field_windows.
  Status Concatenate(OpKernelContext* ctx, const std::vector<std::vector<int64_t>>& field_dims,
                     float** concatenated,
                     std::vector<std::vector<de::ColumnWindow>>* field_windows) const {
    Tensor* out;
    if (concat_layout_.empty()) return ctx->allocate_output(n_, TensorShape({0}), &out);
    OpInputList extras;
    TF_RETURN_IF_ERROR(ctx->input_list("concat_extras", &extras));
    std::vector<std::vector<int64_t>> pieces;
    for (int64_t entry : concat_layout_) {
      pieces.push_back(entry >= 0 ? field_dims[entry] : DimsOf(extras[-1 - entry].shape()));
    }
    std::vector<int64_t> dims;
    std::vector<de::ColumnWindow> windows;
    std::string error;
    if (!de::ConcatWindows(pieces, concat_axis_, &dims, &windows, &error)) {
      return ::tensorflow::errors::InvalidArgument(
          "the concatenation of the fused embedding lookups (", name(), "): ", error);
    }
    TensorShape shape;
    TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(dims, &shape));
    TF_RETURN_IF_ERROR(ctx->allocate_output(n_, shape, &out));
    *concatenated = out->flat<float>().data();
    for (size_t k = 0; k < concat_layout_.size(); ++k) {
      const int64_t entry = concat_layout_[k];
      if (entry >= 0) {
        (*field_windows)[entry].push_back(windows[k]);
      } else {
        de::CopyToWindow(extras[-1 - entry].flat<float>().data(), windows[k], *concatenated);
      }
    }
    return ::tensorflow::OkStatus();
  }

  std::vector<int64_t> concat_layout_;
  int64_t concat_axis_ = 0;
  std::vector<bool> unread_;
};

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

REGISTER_KERNEL_BUILDER(Name("TfExtFusedEmbeddingLookup").Device(DEVICE_CPU), FusedLookupOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFusedEmbeddingApply").Device(DEVICE_CPU), FusedApplyOp);

}  // namespace
}  // namespace tf_ext
