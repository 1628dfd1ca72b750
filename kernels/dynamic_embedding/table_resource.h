// The TensorFlow resource holding one dynamic embedding table: a thin owner of the core table
// (the CPU table with int64 or string keys, or the GPU table with int64 keys), its backend for
// the table kernels (table_backend.h), and the name used in every error message.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESOURCE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESOURCE_H_

#include <memory>
#include <mutex>
#include <string>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/limits.h"
#include "kernels/dynamic_embedding/table_backend.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tf_ext {

class DynamicTable : public ::tensorflow::ResourceBase {
 public:
  DynamicTable(std::string name, ::tensorflow::DataType key_dtype, int dim,
               const de::InitializerSpec& init, const de::AdmissionSpec& admission,
               int64_t max_rows = de::kMaxTableRows)
      : name_(std::move(name)), key_dtype_(key_dtype), dim_(dim), init_(init), max_rows_(max_rows) {
    if (key_dtype == ::tensorflow::DT_STRING) {
      string_table_ =
          std::make_unique<de::EmbeddingTable<std::string>>(dim, init, kShardBits, admission);
    } else {
      int64_table_ =
          std::make_unique<de::EmbeddingTable<int64_t>>(dim, init, kShardBits, admission);
    }
    MakeBackends();
  }
  // A table in GPU memory.
  DynamicTable(std::string name, std::unique_ptr<de::DeviceTable> device_table,
               int64_t max_rows = de::kMaxTableRows)
      : name_(std::move(name)),
        key_dtype_(::tensorflow::DT_INT64),
        dim_(device_table->dim()),
        init_(device_table->options().initializer),
        max_rows_(max_rows),
        device_table_(std::move(device_table)) {
    MakeBackends();
  }

  std::string DebugString() const override { return "DynamicEmbeddingTable(" + name_ + ")"; }
  int64_t MemoryUsed() const override { return static_cast<int64_t>(BytesInUse()); }

  const std::string& name() const { return name_; }
  ::tensorflow::DataType key_dtype() const { return key_dtype_; }
  int dim() const { return dim_; }
  const de::InitializerSpec& initializer() const { return init_; }
  // The rows the table may hold (TfExtDynamicTable's max_rows; at most de::kMaxTableRows).
  int64_t max_rows() const { return max_rows_; }
  // Before a call of keys key_at(0..n-1) that may add rows to the CPU table: a ResourceExhausted
  // error naming the table when they could take it past max_rows (near the limit only the
  // distinct keys it lacks count; calls running at once are each checked alone).
  template <typename Key, typename KeyAt>
  ::tensorflow::Status CheckRowsFit(int64_t n, KeyAt&& key_at) {
    const de::EmbeddingTable<Key>& core = *table<Key>();
    const std::string problem = de::CheckRowsFit(
        name_, core.Size(), n, [&](const auto& key) { return core.Contains(key); }, key_at,
        max_rows_);
    if (problem.empty()) return ::tensorflow::OkStatus();
    return ::tensorflow::errors::ResourceExhausted(problem);
  }
  const de::AdmissionSpec& admission() const { return backend_->admission(); }
  // Whether the table is the GPU table core, in GPU memory (or on host threads with
  // TF_EXT_GPU_TABLES=emulate): then table<Key>() is null, and only the kernels of the ops with a
  // GPU registration serve it (CheckPlacement; the kernels themselves never ask).
  bool on_gpu() const { return device_table_ != nullptr; }
  // Whether that core keeps its rows in host memory (TF_EXT_GPU_TABLES=emulate); fixed for life.
  bool core_in_host_memory() const { return device_table_ && device_table_->InHostMemory(); }

  // The GPU table core, locked while the handle lives: the core is used from one host thread at
  // a time, and TensorFlow runs independent ops of one table at once (two lookups of a shared
  // table, a lookup beside an insert that grows the table).
  class LockedCore {
   public:
    LockedCore(std::mutex& mutex, de::DeviceTable* core) : lock_(mutex), core_(core) {}
    de::DeviceTable* operator->() const { return core_; }
    de::DeviceTable& operator*() const { return *core_; }

   private:
    std::unique_lock<std::mutex> lock_;
    de::DeviceTable* core_;
  };
  LockedCore device_table() const { return LockedCore(device_mutex_, device_table_.get()); }

  // The CPU table core (null for a GPU table), for the ops only CPU tables serve.
  template <typename Key>
  de::EmbeddingTable<Key>* table();
  // The verbs that take keys of type Key (a GPU table has int64 keys only).
  template <typename Key>
  KeyedBackend<Key>* backend();

  // The table's verbs, wherever it lives (table_backend.h); on a GPU table they run on `stream`
  // and wait for it.
  TableBackend* backend() const { return backend_; }
  int64_t Size(cudaStream_t stream = nullptr) const { return backend_->Size(stream); }
  size_t BytesInUse() const { return backend_->BytesInUse(); }
  ::tensorflow::Status Clear(cudaStream_t stream = nullptr) { return backend_->Clear(stream); }
  de::TableCounters Counters(cudaStream_t stream = nullptr) const {
    return backend_->Counters(stream);
  }
  int64_t LatestStep(cudaStream_t stream = nullptr) const { return backend_->LatestStep(stream); }
  ::tensorflow::Status Evict(const de::EvictionCriteria& criteria, int64_t* evicted,
                             cudaStream_t stream = nullptr) {
    return backend_->Evict(stream, criteria, evicted);
  }

  // An InvalidArgument error that names this table.
  template <typename... Args>
  ::tensorflow::Status Invalid(Args&&... args) const {
    return ::tensorflow::errors::InvalidArgument("dynamic embedding table '", name_,
                                                 "': ", std::forward<Args>(args)...);
  }

 private:
  static constexpr int kShardBits = 6;
  const std::string name_;
  const ::tensorflow::DataType key_dtype_;
  const int dim_;
  const de::InitializerSpec init_;
  const int64_t max_rows_;
  std::unique_ptr<de::EmbeddingTable<int64_t>> int64_table_;
  std::unique_ptr<de::EmbeddingTable<std::string>> string_table_;
  std::unique_ptr<de::DeviceTable> device_table_;
  mutable std::mutex device_mutex_;  // LockedCore
  std::unique_ptr<KeyedBackend<int64_t>> int64_backend_;
  std::unique_ptr<KeyedBackend<std::string>> string_backend_;
  TableBackend* backend_ = nullptr;  // the one of the two above the table has

  void MakeBackends();  // table_backend.cc
};

template <>
inline de::EmbeddingTable<int64_t>* DynamicTable::table<int64_t>() {
  return int64_table_.get();
}
template <>
inline de::EmbeddingTable<std::string>* DynamicTable::table<std::string>() {
  return string_table_.get();
}
template <>
inline KeyedBackend<int64_t>* DynamicTable::backend<int64_t>() {
  return int64_backend_.get();
}
template <>
inline KeyedBackend<std::string>* DynamicTable::backend<std::string>() {
  return string_backend_.get();
}

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_RESOURCE_H_
