// The fields of a fused embedding op (ops/dynamic_embedding_fusion_ops.cc), read and checked
// once for the fused lookup (fused_lookup_kernels.cc) and the fused apply
// (fused_apply_kernels.cc): each field's table, keys, segments and combiner.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_FUSED_FIELDS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_FUSED_FIELDS_H_

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

using ::tensorflow::DT_INT64;
using ::tensorflow::DT_STRING;
using ::tensorflow::OpInputList;

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

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_FUSED_FIELDS_H_
