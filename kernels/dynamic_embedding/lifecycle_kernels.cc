// Kernels of a table's lifecycle ops: eviction and statistics
// (ops/dynamic_embedding_lifecycle_ops.cc), for tables in host and in GPU memory.
#include <cstdint>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/table_kernel.h"

namespace tf_ext {
namespace {

class EvictOp : public TableKernel {
 public:
  explicit EvictOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ttl_steps", &criteria_.ttl_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_frequency", &criteria_.min_frequency));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("frequency_window_steps", &criteria_.frequency_window_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_l2_norm", &criteria_.min_l2_norm));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_size", &criteria_.max_size));
    const bool valid = criteria_.ttl_steps >= 0 && criteria_.min_frequency >= 0 &&
                       criteria_.frequency_window_steps >= 0 && criteria_.min_l2_norm >= 0 &&
                       criteria_.max_size >= 0;
    OP_REQUIRES(ctx, valid,
                ::tensorflow::errors::InvalidArgument(
                    "TfExtTableEvict: ttl_steps, min_frequency, frequency_window_steps, "
                    "min_l2_norm and max_size must be >= 0 (0: off)"));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const Tensor& now = ctx->input(1);
    OP_REQUIRES(
        ctx, now.NumElements() == 1,
        table->Invalid("evict: now_step must be a scalar, got shape ", now.shape().DebugString()));
    de::EvictionCriteria criteria = criteria_;
    criteria.now_step = now.flat<int64_t>()(0);
    const cudaStream_t stream = StreamOf(ctx);
    if (criteria.now_step < 0) criteria.now_step = table->LatestStep(stream);
    int64_t evicted = 0;
    OP_REQUIRES_OK(ctx, table->Evict(criteria, &evicted, stream));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = evicted;
  }

 private:
  de::EvictionCriteria criteria_;
};

class StatisticsOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const cudaStream_t stream = StreamOf(ctx);
    const de::TableCounters counters = table->Counters(stream);
    const int64_t values[] = {table->Size(stream), static_cast<int64_t>(table->BytesInUse()),
                              counters.admitted,   counters.rejected,
                              counters.evicted,    counters.lookups,
                              counters.lookup_hits};
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({7}), &out));
    for (int i = 0; i < 7; ++i) out->flat<int64_t>()(i) = values[i];
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtTableEvict").Device(DEVICE_CPU), EvictOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableStatistics").Device(DEVICE_CPU), StatisticsOp);

// The GPU kernels (RegisterGpuKernel: table_kernel.h): scalars and statistics in host memory.
using ::tensorflow::KernelDefBuilder;
TF_EXT_REGISTER_GPU_KERNEL(
    KernelDefBuilder("TfExtTableEvict").HostMemory("now_step").HostMemory("evicted"), EvictOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableStatistics").HostMemory("statistics"),
                           StatisticsOp)

}  // namespace
}  // namespace tf_ext
