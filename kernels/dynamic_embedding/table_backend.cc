// The two backends of the table kernels (table_backend.h).
#include "kernels/dynamic_embedding/table_backend.h"

#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "kernels/dynamic_embedding/apply_rows.h"
#include "kernels/dynamic_embedding/table_kernel.h"
#include "kernels/dynamic_embedding/table_resource.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/platform/stream_executor.h"

namespace tf_ext {
namespace {

// The CPU table core, its batches split over TensorFlow's intra-op thread pool.
template <typename Key>
class CpuTableBackend : public TableBackend<Key> {
 public:
  using Element = typename KeyTensor<Key>::Element;
  explicit CpuTableBackend(DynamicTable* table) : table_(table) {}

  Status Find(OpKernelContext* ctx, const Tensor& keys, float* rows, bool* present) override {
    const auto flat_keys = keys.flat<Element>();
    const de::EmbeddingTable<Key>& core = *table_->template table<Key>();
    const int dim = table_->dim();
    ParallelFor(ctx, flat_keys.size(), 50 + 2 * dim, [&](int64_t begin, int64_t end) {
      FindRows(
          core, begin, end, [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); },
          rows + begin * dim, 0, present == nullptr ? nullptr : present + begin);
    });
    return ::tensorflow::OkStatus();
  }

  Status Insert(OpKernelContext*, const Tensor& keys, const float* rows) override {
    const auto flat_keys = keys.flat<Element>();
    TF_RETURN_IF_ERROR(table_->template CheckRowsFit<Key>(
        flat_keys.size(), [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); }));
    // On this op's thread, as Remove: an insert spread over the intra-op pool would hold every
    // pool thread, and lookups, whose blocks queue behind it, would wait for all of it. Batched
    // by shard, so lookups wait at most one short batch for a shard's lock; a key given twice
    // is written in order, so the last row wins.
    table_->template table<Key>()->InsertOrAssignBatch(
        flat_keys.size(), [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); }, rows);
    return ::tensorflow::OkStatus();
  }

  Status Remove(OpKernelContext*, const Tensor& keys) override {
    const auto flat_keys = keys.flat<Element>();
    // On this op's thread, as Evict runs: a large remove spread over the intra-op pool would
    // hold every pool thread, and lookups, whose blocks queue behind it, would wait for all of
    // it. Batched by shard, so lookups wait at most one short batch for a shard's lock.
    table_->template table<Key>()->RemoveBatch(
        flat_keys.size(), [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); });
    return ::tensorflow::OkStatus();
  }

  Status Apply(OpKernelContext* ctx, const de::OptimizerParams& params, int64_t step,
               const Tensor& keys, const float* gradients) override {
    const auto flat_keys = keys.flat<Element>();
    TF_RETURN_IF_ERROR(table_->template CheckRowsFit<Key>(
        flat_keys.size(), [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); }));
    ApplyRows<Key>(
        ctx, table_, params, step, flat_keys.size(),
        [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); }, gradients);
    return ::tensorflow::OkStatus();
  }

 private:
  DynamicTable* table_;  // owns this backend
};

// The GPU table core, on the op's stream; keys and rows in device memory.
class GpuTableBackend : public TableBackend<int64_t> {
 public:
  explicit GpuTableBackend(DynamicTable* table) : table_(table) {}

  Status Find(OpKernelContext* ctx, const Tensor& keys, float* rows, bool* present) override {
    return DynamicTable::FromCore(table_->device_table()->Find(
        StreamOf(ctx), keys.NumElements(), keys.flat<int64_t>().data(), rows, present));
  }
  Status Insert(OpKernelContext* ctx, const Tensor& keys, const float* rows) override {
    return DynamicTable::FromCore(table_->device_table()->InsertOrAssign(
        StreamOf(ctx), keys.NumElements(), keys.flat<int64_t>().data(), rows));
  }
  Status Remove(OpKernelContext* ctx, const Tensor& keys) override {
    return DynamicTable::FromCore(table_->device_table()->Remove(
        StreamOf(ctx), keys.NumElements(), keys.flat<int64_t>().data(), nullptr));
  }
  Status Apply(OpKernelContext* ctx, const de::OptimizerParams& params, int64_t step,
               const Tensor& keys, const float* gradients) override {
    return DynamicTable::FromCore(table_->device_table()->ApplyGradients(
        StreamOf(ctx), params, step, keys.NumElements(), keys.flat<int64_t>().data(), gradients));
  }

 private:
  DynamicTable* table_;  // owns this backend
};

}  // namespace

GpuTables GpuTablesSetting() {
  static const GpuTables setting = [] {  // read once, as the library loads (and registers)
    const char* value = std::getenv("TF_EXT_GPU_TABLES");
    const std::string text = value == nullptr ? "0" : value;
    if (text == "1") return GpuTables::kOn;
    if (text == "host") return GpuTables::kHost;
    return GpuTables::kOff;  // tf_ext refuses other values before it loads the library
  }();
  return setting;
}

namespace {
// The ops with a kernel over the backend; filled while the library loads, read-only after.
std::set<std::string>& GpuServedOps() {
  static auto* ops = new std::set<std::string>();
  return *ops;
}
}  // namespace

bool ServesGpuTables(const std::string& op) { return GpuServedOps().count(op) > 0; }

bool RegisterGpuKernel(::tensorflow::KernelDefBuilder& builder, const char* kernel_class,
                       OpKernel* (*create)(OpKernelConstruction*)) {
  std::unique_ptr<const ::tensorflow::KernelDef> def(
      builder.Device(::tensorflow::DEVICE_GPU).Build());
  GpuServedOps().insert(def->op());
  if (GpuTablesSetting() != GpuTables::kOn) return false;
  // Registrars live as long as the library, as REGISTER_KERNEL_BUILDER's static ones do.
  new ::tensorflow::kernel_factory::OpKernelRegistrar(def.release(), kernel_class, create);
  return true;
}

cudaStream_t StreamOf(OpKernelContext* ctx) {
  const ::tensorflow::DeviceContext* context = ctx->op_device_context();
  if (context == nullptr || context->stream() == nullptr) return nullptr;
  return static_cast<cudaStream_t>(context->stream()->platform_specific_handle().stream);
}

void DynamicTable::MakeBackends() {
  if (device_table_) {
    int64_backend_ = std::make_unique<GpuTableBackend>(this);
  } else if (string_table_) {
    string_backend_ = std::make_unique<CpuTableBackend<std::string>>(this);
  } else {
    int64_backend_ = std::make_unique<CpuTableBackend<int64_t>>(this);
  }
}

}  // namespace tf_ext
