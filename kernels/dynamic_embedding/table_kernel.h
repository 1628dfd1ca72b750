// What every dynamic embedding kernel shares: the key type <-> tensor element mapping, the
// intra-op ParallelFor, and TableKernel, the base of the kernels whose input 0 is a table.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_KERNEL_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_KERNEL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/dynamic_embedding/core/limits.h"
#include "kernels/dynamic_embedding/table_resource.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_ext {

using ::tensorflow::DataType;
using ::tensorflow::DataTypeString;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::tstring;
using ::tensorflow::core::RefCountPtr;

// Key type <-> TensorFlow element type.
template <typename Key>
struct KeyTensor;
template <>
struct KeyTensor<int64_t> {
  using Element = int64_t;
  using KeyView = int64_t;  // what View gives: the key as the table core takes it
  static KeyView View(const int64_t& k) { return k; }
  static void Store(const int64_t& key, int64_t* out) { *out = key; }
};
template <>
struct KeyTensor<std::string> {
  using Element = tstring;
  using KeyView = std::string_view;
  static KeyView View(const tstring& k) { return KeyView(k.data(), k.size()); }
  static void Store(const std::string& key, tstring* out) { out->assign(key.data(), key.size()); }
};

// Runs fn(begin, end) over [0, n) on the intra-op pool; `cost` is per item, in cycles.
template <typename Fn>
void ParallelFor(OpKernelContext* ctx, int64_t n, int64_t cost, Fn&& fn) {
  if (n <= 0) return;
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(n, cost, [&fn](int64_t begin, int64_t end) { fn(begin, end); });
}

// TF_EXT_GPU_TABLES (tf_ext/settings.py), read when the op library loads: "0" (or unset), "1",
// or "emulate" (int64 tables on the CPU are the GPU table core on host threads, for tests; "host",
// its older name, still works).
enum class GpuTables { kOff, kOn, kEmulate };
GpuTables GpuTablesSetting();

// Whether op `op` has a kernel that serves GPU tables (RegisterGpuKernel), registered or not.
bool ServesGpuTables(const std::string& op);

// A table in GPU memory is served only by the kernels registered for the GPU (those over the
// backend, RegisterGpuKernel), a table in host memory only by CPU kernels: never a host kernel
// reading device memory, or the reverse. The GPU table core in host memory (TF_EXT_GPU_TABLES=
// emulate) is served by the CPU kernels of the ops that serve GPU tables, and refused by the others
// as a GPU table is.
inline Status CheckPlacement(const OpKernel& kernel, bool kernel_on_gpu,
                             const DynamicTable& table) {
  const bool served_on_host =
      table.core_in_host_memory() && !kernel_on_gpu && ServesGpuTables(kernel.type_string());
  if (table.on_gpu() && !kernel_on_gpu && !served_on_host) {
    return table.Invalid(
        "the table lives in GPU memory, and this op (", kernel.type_string(),
        ") has no GPU kernel yet: GPU tables serve find, insert, remove, size, clear, the "
        "optimizer step, eviction, statistics and checkpoints (docs/dynamic_embedding.md, "
        "GPU tables)");
  }
  if (!table.on_gpu() && kernel_on_gpu) {
    return table.Invalid("the table lives in host memory: run its ops on the CPU");
  }
  return ::tensorflow::OkStatus();
}

// The table handle of input `input`, which must be a scalar: TensorFlow's HandleFromInput reads
// element 0 unchecked, past the end of an empty handle tensor (which a graph can feed).
inline Status ScalarHandle(OpKernelContext* ctx, int input,
                           const ::tensorflow::ResourceHandle** handle) {
  const Tensor& tensor = ctx->input(input);
  if (!::tensorflow::TensorShapeUtils::IsScalar(tensor.shape())) {
    return ::tensorflow::errors::InvalidArgument(
        ctx->op_kernel().type_string(), ": input ", input,
        " must be one table (a scalar resource handle), got shape ", tensor.shape().DebugString());
  }
  *handle = &tensor.scalar<::tensorflow::ResourceHandle>()();
  return ::tensorflow::OkStatus();
}

// String keys against kMaxKeyBytes (core/limits.h). A longer key could be stored, but then no
// checkpoint of the table would restore, so every call that takes keys refuses it.
inline Status CheckKeyLengths(const DynamicTable& table, const Tensor& keys) {
  if (keys.dtype() != ::tensorflow::DT_STRING) return ::tensorflow::OkStatus();
  const auto flat = keys.flat<tstring>();
  for (int64_t i = 0; i < flat.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(flat(i).size());
    if (bytes > de::kMaxKeyBytes) {
      return ::tensorflow::errors::InvalidArgument(de::CheckKeyBytes(table.name(), i, bytes));
    }
  }
  return ::tensorflow::OkStatus();
}

// The ids of one lookup or update call against the limits: how many, and their lengths.
inline Status CheckCallIds(const DynamicTable& table, const Tensor& keys) {
  const std::string problem = de::CheckIdsPerCall(table.name(), keys.NumElements());
  if (!problem.empty()) return ::tensorflow::errors::InvalidArgument(problem);
  return CheckKeyLengths(table, keys);
}

// Whether the table has room for the rows a call of these keys may add (de::CheckRowsFit), for
// the fused ops, which serve CPU tables only (the backends check their own calls: the GPU table
// keeps its own capacity, and asking its size would wait for its stream on every call).
template <typename Key>
Status CheckRowsFit(DynamicTable& table, const Tensor& keys) {
  const de::EmbeddingTable<Key>* core = table.template table<Key>();
  if (core == nullptr) return ::tensorflow::OkStatus();
  const auto flat = keys.flat<typename KeyTensor<Key>::Element>();
  const std::string problem = de::CheckRowsFit(
      table.name(), core->Size(), flat.size(),
      [core](typename KeyTensor<Key>::KeyView key) { return core->Contains(key); },
      [&flat](int64_t i) { return KeyTensor<Key>::View(flat(i)); });
  if (problem.empty()) return ::tensorflow::OkStatus();
  return ::tensorflow::errors::ResourceExhausted(problem);
}

// Base of the kernels that take a table as input 0: looks it up and checks key dtype and dim.
class TableKernel : public OpKernel {
 public:
  explicit TableKernel(OpKernelConstruction* ctx)
      : OpKernel(ctx), on_gpu_(ctx->device_type() == ::tensorflow::DEVICE_GPU) {
    if (ctx->HasAttr("dim")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
      has_dim_ = true;
    }
    if (ctx->HasAttr("Tkey")) OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkey", &key_dtype_));
  }

 protected:
  Status GetTable(OpKernelContext* ctx, RefCountPtr<DynamicTable>* table) {
    const ::tensorflow::ResourceHandle* handle;
    TF_RETURN_IF_ERROR(ScalarHandle(ctx, 0, &handle));
    TF_RETURN_IF_ERROR(::tensorflow::LookupResource(ctx, *handle, table));
    if (key_dtype_ != ::tensorflow::DT_INVALID && key_dtype_ != (*table)->key_dtype()) {
      return (*table)->Invalid("keys must be ", DataTypeString((*table)->key_dtype()), ", got ",
                               DataTypeString(key_dtype_));
    }
    // Every dim is checked, 0 included: the kernels size their outputs and strides by dim_.
    if (has_dim_ && dim_ != (*table)->dim()) {
      return (*table)->Invalid("dim is ", (*table)->dim(), ", the op expects ", dim_);
    }
    return CheckPlacement(*this, on_gpu_, **table);
  }

  const bool on_gpu_;  // registered for, and running on, a GPU
  bool has_dim_ = false;
  int dim_ = 0;
  DataType key_dtype_ = ::tensorflow::DT_INVALID;
};

#define TF_EXT_GET_TABLE(ctx, table) \
  RefCountPtr<DynamicTable> table;   \
  OP_REQUIRES_OK(ctx, GetTable(ctx, &table));

// Registers a kernel for the GPU if TF_EXT_GPU_TABLES=1 when the op library loads (settings:
// dynamic_embedding), and records that its op serves GPU tables; returns whether it registered.
// Opt-in because TensorFlow places an op on a GPU whenever a GPU kernel exists: registered always,
// every table of a GPU machine would move into GPU memory, where the ops without a GPU kernel
// (fused lookups, exports) cannot serve it.
bool RegisterGpuKernel(::tensorflow::KernelDefBuilder& builder, const char* kernel_class,
                       OpKernel* (*create)(OpKernelConstruction*));
inline bool RegisterGpuKernel(::tensorflow::KernelDefBuilder&& builder, const char* kernel_class,
                              OpKernel* (*create)(OpKernelConstruction*)) {
  return RegisterGpuKernel(builder, kernel_class, create);
}
#define TF_EXT_GPU_KERNEL_NAME(line) tf_ext_gpu_kernel_##line
#define TF_EXT_GPU_KERNEL_AT(line, builder, ...)                                \
  static const bool TF_EXT_GPU_KERNEL_NAME(line) = ::tf_ext::RegisterGpuKernel( \
      builder, #__VA_ARGS__,                                                    \
      [](::tensorflow::OpKernelConstruction* ctx) -> ::tensorflow::OpKernel* {  \
        return new __VA_ARGS__(ctx);                                            \
      });
#define TF_EXT_REGISTER_GPU_KERNEL(builder, ...) \
  TF_EXT_GPU_KERNEL_AT(__LINE__, builder, __VA_ARGS__)

// Keys per FindBatch call: amortizes the shard locks while keeping writers' waits short.
constexpr int64_t kLookupBlock = 4096;

// The rows of keys key_at(begin..end-1) into out (row i of the range at out + (i - begin) *
// out_stride; out_stride 0: dim), kLookupBlock keys per FindBatch; present (optional): whether
// each key of the range had a row, at present[i - begin].
template <typename Key, typename KeyAt>
void FindRows(const de::EmbeddingTable<Key>& core, int64_t begin, int64_t end, KeyAt&& key_at,
              float* out, int64_t out_stride = 0, bool* present = nullptr) {
  if (out_stride == 0) out_stride = core.dim();
  for (int64_t block = begin; block < end; block += kLookupBlock) {
    const int64_t count = std::min(kLookupBlock, end - block);
    core.FindBatch(
        count, [&](int64_t i) { return key_at(block + i); }, out + (block - begin) * out_stride,
        out_stride, present == nullptr ? nullptr : present + (block - begin));
  }
}

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_KERNEL_H_
