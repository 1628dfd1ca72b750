// CPU kernels of LightCC's TOPK exchange: validate, then hand the buffers to the core
// (kernels/lightcc/core), compressing segments in parallel on the intra-op thread pool.
#include <string>
#include <vector>

#include "kernels/lightcc/core/topk_compression.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_ext {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using ::tensorflow::errors::FailedPrecondition;
using ::tensorflow::errors::InvalidArgument;

class TopKCompressOp : public OpKernel {
 public:
  explicit TopKCompressOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<int64_t> lengths, counts;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_lengths", &lengths));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_counts", &counts));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("half_values", &layout_.half_values));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("residual_offset", &residual_offset_));
    std::string error;
    OP_REQUIRES(ctx, lightcc::MakeSegmentPlan(lengths, counts, &plan_, &error),
                InvalidArgument("TOPK compression '", name(), "': ", error));
    layout_.num_selected = plan_.total_selected;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& gradient = ctx->input(0);
    OP_REQUIRES(
        ctx, gradient.dims() == 1 && gradient.NumElements() == plan_.total_length,
        InvalidArgument("TOPK compression '", name(), "': gradient must be a vector of ",
                        plan_.total_length, " floats, got shape ", gradient.shape().DebugString()));
    // One handle: TensorFlow's HandleFromInput reads element 0 unchecked (past the end of an
    // empty handle tensor, which a graph can feed).
    const Tensor& handle = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(handle.shape()),
                InvalidArgument("TOPK compression '", name(),
                                "': residual must be one variable (a scalar resource handle), "
                                "got shape ",
                                handle.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, handle.scalar<::tensorflow::ResourceHandle>()(), &var));
    ::tensorflow::mutex_lock lock(*var->mu());
    OP_REQUIRES(ctx, var->is_initialized,
                FailedPrecondition("TOPK compression '", name(), "': residual not initialized"));
    Tensor* residual = var->tensor();
    // Written so that a huge residual_offset cannot overflow into a pass (it did: 2^63 - 1
    // wrapped to a pointer before the residual's buffer, which was then read and written).
    OP_REQUIRES(
        ctx,
        residual->dtype() == ::tensorflow::DT_FLOAT && residual->dims() == 1 &&
            residual->NumElements() >= plan_.total_length &&
            residual_offset_ <= residual->NumElements() - plan_.total_length,
        InvalidArgument(
            "TOPK compression '", name(),
            "': residual must be a float32 "
            "vector of at least ",
            // Both are >= 0: their sum is exact in 64 unsigned bits.
            static_cast<uint64_t>(residual_offset_) + static_cast<uint64_t>(plan_.total_length),
            " entries (offset ", residual_offset_, " + ", plan_.total_length, "), got ",
            ::tensorflow::DataTypeString(residual->dtype()), " ", residual->shape().DebugString()));
    if (!residual->RefCountIsOne()) {  // someone still reads the old value: update a copy
      Tensor copy;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, residual->shape(), &copy));
      copy.flat<float>() = residual->flat<float>();
      *residual = copy;
    }
    Tensor* payload = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({layout_.words()}), &payload));
    const float* g = gradient.flat<float>().data();
    float* r = residual->flat<float>().data() + residual_offset_;
    int32_t* out = payload->flat<int32_t>().data();
    const int64_t segments = static_cast<int64_t>(plan_.lengths.size());
    const int64_t cost = segments ? 20 * (plan_.total_length / segments + 1) : 0;
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    pool->ParallelFor(segments, cost, [&](int64_t begin, int64_t end) {
      std::vector<uint32_t> scratch;
      for (int64_t s = begin; s < end; ++s) {
        lightcc::CompressPlannedSegment(g, r, plan_, layout_, s, out, &scratch);
      }
    });
  }

 private:
  lightcc::SegmentPlan plan_;
  lightcc::PayloadLayout layout_;
  int64_t residual_offset_ = 0;
};

class TopKDecompressOp : public OpKernel {
 public:
  explicit TopKDecompressOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_selected", &layout_.num_selected));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("half_values", &layout_.half_values));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("length", &length_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& payloads = ctx->input(0);
    const int64_t words = layout_.words();
    OP_REQUIRES(ctx,
                payloads.dims() == 1 && (words == 0 ? payloads.NumElements() == 0
                                                    : payloads.NumElements() % words == 0),
                InvalidArgument("TOPK decompression '", name(),
                                "': payloads must be a vector of "
                                "whole payloads of ",
                                words, " words, got shape ", payloads.shape().DebugString()));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({length_}), &dense));
    const int64_t num_payloads = words ? payloads.NumElements() / words : 0;
    OP_REQUIRES(ctx,
                lightcc::DecompressSum(payloads.flat<int32_t>().data(), num_payloads, layout_,
                                       length_, scale_, dense->flat<float>().data()),
                InvalidArgument("TOPK decompression '", name(), "': an index is outside [0, ",
                                length_, ") (payloads from a different exchange?)"));
  }

 private:
  lightcc::PayloadLayout layout_;
  int64_t length_ = 0;
  float scale_ = 1.0f;
};

REGISTER_KERNEL_BUILDER(Name("TfExtTopKCompress").Device(DEVICE_CPU), TopKCompressOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTopKDecompress").Device(DEVICE_CPU), TopKDecompressOp);

}  // namespace
}  // namespace tf_ext
