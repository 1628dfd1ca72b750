// Kernels of the dynamic embedding table ops: validate, then hand the work to the table's backend
// (table_backend.h). Registered for the CPU, and those over the backend also for the GPU when
// TF_EXT_GPU_TABLES=1 (RegisterGpuKernel, table_kernel.h).
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/dynamic_embedding/core/distinct_lookup.h"
#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/table_backend.h"
#include "kernels/dynamic_embedding/table_kernel.h"
#include "kernels/dynamic_embedding/table_resource.h"
#include "kernels/dynamic_embedding/table_restore.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_ext {
namespace {

// The most counters (4 bytes each) an admission sketch may have: 1 GiB.
constexpr int64_t kMaxSketchCounters = int64_t{1} << 28;
// Host threads of a GPU table core in host memory (TF_EXT_GPU_TABLES=emulate): more than one, so
// its bodies race as on a GPU.
constexpr int kEmulatedGpuTableThreads = 2;

class DynamicTableOp : public OpKernel {
 public:
  explicit DynamicTableOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), on_gpu_(ctx->device_type() == ::tensorflow::DEVICE_GPU) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_dtype", &key_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    std::string initializer;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &initializer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_a", &init_.a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_b", &init_.b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &init_.seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer_version", &init_.version));
    int64_t sketch_width = 0, sketch_depth = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_min_count", &admission_.min_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_exact", &admission_.exact));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_sketch_width", &sketch_width));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_sketch_depth", &sketch_depth));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &max_rows_));
    const std::string max_rows_problem = de::CheckMaxRows(table_name_, max_rows_);
    OP_REQUIRES(ctx, max_rows_problem.empty(),
                ::tensorflow::errors::InvalidArgument(max_rows_problem));
    const std::string prefix = "dynamic embedding table '" + table_name_ + "': ";
    const std::string dim_problem = de::CheckDim(table_name_, dim_);
    OP_REQUIRES(ctx, dim_problem.empty(), ::tensorflow::errors::InvalidArgument(dim_problem));
    OP_REQUIRES(ctx, de::ParseInitializerKind(initializer, &init_.kind),
                ::tensorflow::errors::InvalidArgument(prefix, "unknown initializer '", initializer,
                                                      "'; known: ", de::InitializerKindNames()));
    OP_REQUIRES(ctx,
                init_.version >= de::kOldestInitializerVersion &&
                    init_.version <= de::kNewestInitializerVersion,
                ::tensorflow::errors::InvalidArgument(
                    prefix, "initializer version must be in [", de::kOldestInitializerVersion, ", ",
                    de::kNewestInitializerVersion, "], got ", init_.version));
    OP_REQUIRES(ctx, admission_.min_count >= 0,
                ::tensorflow::errors::InvalidArgument(
                    prefix, "admission min_count must be >= 1, got ", admission_.min_count));
    OP_REQUIRES(ctx, sketch_width >= 0 && sketch_width <= (int64_t{1} << 32),
                ::tensorflow::errors::InvalidArgument(
                    prefix, "admission sketch width must be in [0, 2^32], got ", sketch_width));
    OP_REQUIRES(ctx, sketch_depth >= 1 && sketch_depth <= 16,
                ::tensorflow::errors::InvalidArgument(
                    prefix, "admission sketch depth must be in [1, 16], got ", sketch_depth));
    // A sketch (min_count above 1, not exact) is allocated whole when the table is created: a
    // width past this bound failed its allocation there, taking the process down.
    const bool sketch = admission_.min_count > 1 && !admission_.exact;
    OP_REQUIRES(ctx, !sketch || sketch_width * sketch_depth <= kMaxSketchCounters,
                ::tensorflow::errors::InvalidArgument(
                    prefix, "admission sketch of ", sketch_width, " x ", sketch_depth,
                    " counters is over the limit of ", kMaxSketchCounters, " counters (",
                    kMaxSketchCounters * 4 >> 20, " MiB)"));
    admission_.sketch_width = sketch_width;
    admission_.sketch_depth = static_cast<int>(sketch_depth);
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::ContainerInfo cinfo;
    OP_REQUIRES_OK(ctx,
                   cinfo.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
    DynamicTable* table = nullptr;
    const bool on_gpu = on_gpu_;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<DynamicTable>(
                            cinfo.container(), cinfo.name(), &table,
                            [this, on_gpu](DynamicTable** out) { return Create(on_gpu, out); }));
    RefCountPtr<DynamicTable> owned(table);
    OP_REQUIRES(ctx, table->key_dtype() == key_dtype_ && table->dim() == dim_,
                table->Invalid("already exists with key dtype ", DataTypeString(table->key_dtype()),
                               " and dim ", table->dim(), "; asked for ",
                               DataTypeString(key_dtype_), " and dim ", dim_));
    OP_REQUIRES(
        ctx, table->initializer().version == init_.version,
        table->Invalid("already exists with initializer version ", table->initializer().version,
                       "; asked for version ", init_.version));
    const de::AdmissionSpec& admission = table->admission();
    OP_REQUIRES(
        ctx,
        admission.min_count == admission_.min_count && admission.exact == admission_.exact &&
            admission.sketch_width == admission_.sketch_width &&
            admission.sketch_depth == admission_.sketch_depth,
        table->Invalid("already exists with another admission policy (min_count ",
                       admission.min_count, "); asked for min_count ", admission_.min_count));
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<::tensorflow::ResourceHandle>()() =
        ::tensorflow::MakeResourceHandle<DynamicTable>(ctx, cinfo.container(), cinfo.name());
  }

  // A table in host memory, or under a GPU placement in GPU memory; with
  // TF_EXT_GPU_TABLES=emulate an int64 table on the CPU is the GPU table core on host threads.
  Status Create(bool on_gpu, DynamicTable** out) const {
    const bool emulated = !on_gpu && key_dtype_ == ::tensorflow::DT_INT64 &&
                          GpuTablesSetting() == GpuTables::kEmulate;
    if (!on_gpu && !emulated) {
      *out = new DynamicTable(table_name_, key_dtype_, dim_, init_, admission_, max_rows_);
      return ::tensorflow::OkStatus();
    }
    const std::string prefix = "dynamic embedding table '" + table_name_ + "': ";
    if (key_dtype_ != ::tensorflow::DT_INT64) {
      return ::tensorflow::errors::InvalidArgument(
          prefix,
          "string keys stay on the CPU: GPU tables hold int64 keys; place this table "
          "under tf.device('/CPU:0')");
    }
    de::DeviceTableOptions options;
    options.name = table_name_;
    options.dim = dim_;
    options.initializer = init_;
    options.admission = admission_;
    options.max_rows = max_rows_;
    std::string error;
    std::unique_ptr<de::DeviceTable> device_table =
        emulated ? de::MakeEmulatedGpuTable(options, &error, kEmulatedGpuTableThreads)
                 : de::MakeCudaTable(options, &error);
    if (!device_table) return ::tensorflow::errors::FailedPrecondition(error);
    *out = new DynamicTable(table_name_, std::move(device_table), max_rows_);
    return ::tensorflow::OkStatus();
  }

 private:
  const bool on_gpu_;
  std::string table_name_;
  DataType key_dtype_;
  int dim_;
  de::InitializerSpec init_;
  de::AdmissionSpec admission_;
  int64_t max_rows_;
};

// TfExtTableFind, and with kReportsPresence TfExtTableFindWithPresence (which also outputs
// whether each key had a row).
template <typename Key, bool kReportsPresence = false>
class FindOp : public TableKernel {
 public:
  explicit FindOp(OpKernelConstruction* ctx) : TableKernel(ctx), dedup_(FindDedupSetting()) {}
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckCallIds(*table, keys));
    TensorShape out_shape = keys.shape();
    out_shape.AddDim(dim_);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    float* rows = out->flat<float>().data();
    bool* present = nullptr;
    if constexpr (kReportsPresence) {
      Tensor* present_out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &present_out));
      present = present_out->flat<bool>().data();
    }
    OP_REQUIRES_OK(ctx, table->template backend<Key>()->Find(ctx, keys, rows, present, dedup_));
  }

 private:
  const FindDedup dedup_;
};

template <typename Key>
using FindWithPresenceOp = FindOp<Key, true>;

template <typename Key>
class InsertOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    TensorShape expected = keys.shape();
    expected.AddDim(dim_);
    OP_REQUIRES(ctx, values.shape() == expected,
                table->Invalid("insert: values must have shape keys.shape + [dim] = ",
                               expected.DebugString(), ", got ", values.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckCallIds(*table, keys));  // the backend checks the row limit
    OP_REQUIRES_OK(ctx,
                   table->template backend<Key>()->Insert(ctx, keys, values.flat<float>().data()));
  }
};

template <typename Key>
class RemoveOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx, CheckCallIds(*table, ctx->input(1)));
    OP_REQUIRES_OK(ctx, table->template backend<Key>()->Remove(ctx, ctx->input(1)));
  }
};

class SizeOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = table->Size(StreamOf(ctx));
  }
};

class MemoryBytesOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = static_cast<int64_t>(table->BytesInUse());
  }
};

class ClearOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx, table->Clear(StreamOf(ctx)));
  }
};

template <typename Key>
class ExportOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    de::EmbeddingTable<Key>* core = table->template table<Key>();
    const int dim = dim_;
    Tensor *keys = nullptr, *values = nullptr, *slots = nullptr, *counts = nullptr,
           *steps = nullptr, *slot_init = nullptr;
    Status status;
    int num_slots = 0;
    core->Export(
        [&](int64_t n) {
          num_slots = core->num_slots();  // stable: every shard is read-locked
          status.Update(ctx->allocate_output(0, TensorShape({n}), &keys));
          status.Update(ctx->allocate_output(1, TensorShape({n, dim}), &values));
          status.Update(ctx->allocate_output(2, TensorShape({n, num_slots * dim}), &slots));
          status.Update(ctx->allocate_output(3, TensorShape({n}), &counts));
          status.Update(ctx->allocate_output(4, TensorShape({n}), &steps));
          return status.ok();
        },
        [&](int64_t i, const Key& key, const de::RowRef& row) {
          KeyTensor<Key>::Store(key, &keys->flat<typename KeyTensor<Key>::Element>()(i));
          std::copy(row.embedding, row.embedding + dim, values->flat<float>().data() + i * dim);
          std::copy(row.slots, row.slots + num_slots * dim,
                    slots->flat<float>().data() + i * num_slots * dim);
          counts->flat<int64_t>()(i) = *row.update_count;
          steps->flat<int64_t>()(i) = *row.last_step;
        });
    OP_REQUIRES_OK(ctx, status);
    const std::vector<float> init = core->slot_initial_values();
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(5, TensorShape({static_cast<int64_t>(init.size())}), &slot_init));
    std::copy(init.begin(), init.end(), slot_init->flat<float>().data());
  }
};

template <typename Key>
class ImportOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx,
                   ImportTensors<Key>(ctx, table.get(), ctx->input(1), ctx->input(2), ctx->input(3),
                                      ctx->input(4), ctx->input(5), ctx->input(6)));
  }
};

template <typename Split>
class RaggedSegmentIdsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& splits_tensor = ctx->input(0);
    OP_REQUIRES(ctx, splits_tensor.dims() == 1 && splits_tensor.NumElements() >= 1,
                ::tensorflow::errors::InvalidArgument(
                    "row_splits must be a vector of at least one entry, got shape ",
                    splits_tensor.shape().DebugString()));
    const auto splits = splits_tensor.flat<Split>();
    const int64_t rows = splits.size() - 1;
    OP_REQUIRES(ctx, splits(0) == 0,
                ::tensorflow::errors::InvalidArgument("row_splits must start at 0, got ",
                                                      static_cast<int64_t>(splits(0))));
    for (int64_t r = 0; r < rows; ++r) {
      OP_REQUIRES(ctx, splits(r) <= splits(r + 1),
                  ::tensorflow::errors::InvalidArgument(
                      "row_splits must not decrease, got ", static_cast<int64_t>(splits(r)),
                      " then ", static_cast<int64_t>(splits(r + 1)), " at ", r));
    }
    Tensor* out;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(splits(rows))}), &out));
    int64_t* segment_ids = out->flat<int64_t>().data();
    for (int64_t r = 0; r < rows; ++r)
      std::fill(segment_ids + splits(r), segment_ids + splits(r + 1), r);
  }
};

REGISTER_KERNEL_BUILDER(
    Name("TfExtRaggedSegmentIds").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tsplits"),
    RaggedSegmentIdsOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("TfExtRaggedSegmentIds").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tsplits"),
    RaggedSegmentIdsOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("TfExtDynamicTable").Device(DEVICE_CPU), DynamicTableOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableSize").Device(DEVICE_CPU), SizeOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableMemoryBytes").Device(DEVICE_CPU), MemoryBytesOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableClear").Device(DEVICE_CPU), ClearOp);

#define TF_EXT_REGISTER_KEYED(Key, TfType)                                                        \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableFind").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), FindOp<Key>);     \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableFindWithPresence").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"),       \
      FindWithPresenceOp<Key>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableInsert").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), InsertOp<Key>); \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableRemove").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), RemoveOp<Key>); \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableExport").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), ExportOp<Key>); \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("TfExtTableImport").Device(DEVICE_CPU).TypeConstraint<TfType>("Tkey"), ImportOp<Key>);

TF_EXT_REGISTER_KEYED(int64_t, int64_t)
TF_EXT_REGISTER_KEYED(std::string, tstring)

// The GPU kernels: int64 keys, the size in host memory (RegisterGpuKernel: table_kernel.h).
using ::tensorflow::KernelDefBuilder;
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtDynamicTable"), DynamicTableOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableSize").HostMemory("size"), SizeOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableClear"), ClearOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableFind").TypeConstraint<int64_t>("Tkey"),
                           FindOp<int64_t>)
TF_EXT_REGISTER_GPU_KERNEL(
    KernelDefBuilder("TfExtTableFindWithPresence").TypeConstraint<int64_t>("Tkey"),
    FindWithPresenceOp<int64_t>)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableInsert").TypeConstraint<int64_t>("Tkey"),
                           InsertOp<int64_t>)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableRemove").TypeConstraint<int64_t>("Tkey"),
                           RemoveOp<int64_t>)

}  // namespace
}  // namespace tf_ext
