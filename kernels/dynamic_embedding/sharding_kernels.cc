// Kernels of sharded tables (ops/dynamic_embedding_sharding_ops.cc): thin adapters over
// core/sharding.h.
#include <cstdint>
#include <string>

#include "kernels/dynamic_embedding/core/sharding.h"
#include "kernels/dynamic_embedding/table_kernel.h"

namespace tf_ext {
namespace {

template <typename Key>
class ShardOfOp : public OpKernel {
 public:
  explicit ShardOfOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES(ctx, num_shards_ >= 1 && num_shards_ <= de::kMaxShards,
                ::tensorflow::errors::InvalidArgument("TfExtShardOf: num_shards must be in [1, ",
                                                      de::kMaxShards, "], got ", num_shards_));
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

}  // namespace
}  // namespace tf_ext
