// Kernels of sharded tables (ops/dynamic_embedding_sharding_ops.cc): thin adapters over
// core/sharding.h.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/sharding.h"
#include "kernels/dynamic_embedding/table_kernel.h"

namespace tf_ext {
namespace {

// The num_shards attr of an op of this file, checked.
Status NumShardsAttr(OpKernelConstruction* ctx, int* num_shards) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_shards", num_shards));
  if (*num_shards >= 1 && *num_shards <= de::kMaxShards) return ::tensorflow::OkStatus();
  return ::tensorflow::errors::InvalidArgument(ctx->def().op(), ": num_shards must be in [1, ",
                                               de::kMaxShards, "], got ", *num_shards);
}

template <typename Key>
class ShardOfOp : public OpKernel {
 public:
  explicit ShardOfOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, NumShardsAttr(ctx, &num_shards_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &out));
    const auto flat_keys = keys.flat<typename KeyTensor<Key>::Element>();
    auto shards = out->flat<int32_t>();
    ParallelFor(ctx, flat_keys.size(), 20, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        shards(i) = de::ShardOf(KeyTensor<Key>::View(flat_keys(i)), num_shards_);
      }
    });
  }

 private:
  int num_shards_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtShardOf").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkey"),
                        ShardOfOp<int64_t>);
REGISTER_KERNEL_BUILDER(
    Name("TfExtShardOf").Device(DEVICE_CPU).TypeConstraint<::tensorflow::tstring>("Tkey"),
    ShardOfOp<std::string>);

template <typename Key>
class DistinctByShardOp : public OpKernel {
 public:
  explicit DistinctByShardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, NumShardsAttr(ctx, &num_shards_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(
        ctx, ::tensorflow::TensorShapeUtils::IsVector(keys.shape()),
        ::tensorflow::errors::InvalidArgument("TfExtDistinctByShard: keys must be 1-D, got shape ",
                                              keys.shape().DebugString()));
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                ::tensorflow::errors::InvalidArgument(
                    "TfExtDistinctByShard: at most 2^31 - 1 keys per call, got ", n));
    Tensor *positions, *counts;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &positions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {num_shards_}, &counts));
    const auto flat_keys = keys.flat<typename KeyTensor<Key>::Element>();
    std::vector<Key> distinct;
    de::GroupDistinctKeysByShard(
        n, num_shards_, [&flat_keys](int64_t i) { return Key(KeyTensor<Key>::View(flat_keys(i))); },
        &distinct, positions->flat<int32_t>().data(), counts->flat<int32_t>().data());
    Tensor* out;
    const int64_t num_distinct = static_cast<int64_t>(distinct.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {num_distinct}, &out));
    auto out_keys = out->flat<typename KeyTensor<Key>::Element>();
    for (int64_t k = 0; k < num_distinct; ++k) KeyTensor<Key>::Store(distinct[k], &out_keys(k));
  }

 private:
  int num_shards_;
};

REGISTER_KERNEL_BUILDER(
    Name("TfExtDistinctByShard").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkey"),
    DistinctByShardOp<int64_t>);
REGISTER_KERNEL_BUILDER(
    Name("TfExtDistinctByShard").Device(DEVICE_CPU).TypeConstraint<::tensorflow::tstring>("Tkey"),
    DistinctByShardOp<std::string>);

}  // namespace
}  // namespace tf_ext
