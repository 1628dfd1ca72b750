// Kernels of the fused embedding subgraph's forward pass (ops/dynamic_embedding_fusion_ops.cc):
// the markers pass their first input through; TfExtFusedEmbeddingLookup does every field's
// lookup in one op, with the combiner arithmetic of core/combiners.h.
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

class ForwardFirstInputOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingField").Device(DEVICE_CPU), ForwardFirstInputOp);
REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingRowsGradient").Device(DEVICE_CPU), ForwardFirstInputOp);

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

REGISTER_KERNEL_BUILDER(Name("TfExtFusedEmbeddingLookup").Device(DEVICE_CPU), FusedLookupOp);

}  // namespace
}  // namespace tf_ext
