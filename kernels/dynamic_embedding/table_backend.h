// Every verb the table kernels call, written against one interface for each place a table lives:
//   CpuTableBackend  the CPU table core (embedding_table.h): host tensors, work split over the
//                    intra-op thread pool;
//   GpuTableBackend  the GPU table core (core/gpu/device_table.h), in GPU memory on the op's CUDA
//                    stream, or on host threads (TF_EXT_GPU_TABLES=emulate); int64 keys.
// The kernels validate their inputs, allocate their outputs and call the backend of the table's
// resource: they hold no table logic and never ask where the table lives, so the CPU
// registration runs every line of a kernel that the GPU registration runs; the GPU one adds only
// the stream and the placement. A new storage (a tier) is one more backend.
//
// TableBackend holds the verbs that take no keys; KeyedBackend<Key> adds those that do. A core's
// error (de::TableError) becomes a Status in one place, FromCore.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "kernels/dynamic_embedding/core/snapshot_restore.h"
#include "kernels/dynamic_embedding/core/table_error.h"
#include "kernels/dynamic_embedding/core/table_policies.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ext {

// A core's error as TensorFlow raises it (OK for an ok one).
::tensorflow::Status FromCore(const de::TableError& error);

// TF_EXT_FIND_DEDUP (tf_ext/settings.py), read when a find kernel is made: "auto" (or unset), "1"
// or "0": whether a lookup of int64 ids finds each distinct id once (core/distinct_lookup.h).
enum class FindDedup { kAuto, kAlways, kNever };
FindDedup FindDedupSetting();

class TableBackend {
 public:
  virtual ~TableBackend() = default;
  virtual const de::AdmissionSpec& admission() const = 0;
  // On a GPU table these run on `stream` and wait for it.
  virtual int64_t Size(cudaStream_t stream) const = 0;
  virtual size_t BytesInUse() const = 0;
  // The largest step a training update has had (0 before the first).
  virtual int64_t LatestStep(cudaStream_t stream) const = 0;
  virtual de::TableCounters Counters(cudaStream_t stream) const = 0;
  virtual ::tensorflow::Status Clear(cudaStream_t stream) = 0;
  // Removes the rows `criteria` condemns (then, over max_size, the least recently updated);
  // *evicted: how many.
  virtual ::tensorflow::Status Evict(cudaStream_t stream, const de::EvictionCriteria& criteria,
                                     int64_t* evicted) = 0;

  // Snapshots (snapshot_file.h), full (since < 0) or a delta of what changed after the snapshot
  // of version `since`, by the rules of embedding_table_snapshot.h. Of *header it keeps chain_id,
  // sequence, step, table_name and initializer_version and fills in the rest. *version: the
  // snapshot's version, or de::DeviceSnapshotPlan::kNoDeltaBase when no delta since `since` can
  // be taken (then nothing is written). `path` is for messages. With track, deltas can follow it
  // once CommitSnapshot says it is stored.
  virtual ::tensorflow::Status WriteSnapshot(cudaStream_t stream, const std::string& path,
                                             int64_t since, bool track, de::SnapshotHeader* header,
                                             de::ByteSink* sink, int64_t* version) = 0;
  virtual ::tensorflow::Status CommitSnapshot(cudaStream_t stream, int64_t version) = 0;
  // After a restore: tracks changes from the content as it is; returns the version a delta can
  // be taken since.
  virtual int64_t MarkSnapshotBase(cudaStream_t stream) = 0;
};

// Rows given whole, as TfExtTableExport gives them (in host memory): n rows of dim embedding
// values, slot_initial_values.size() * dim slot values, an update count and a last step each.
struct ImportedRows {
  int64_t n = 0;
  const float* values = nullptr;
  const float* slots = nullptr;
  const int64_t* update_counts = nullptr;
  const int64_t* last_steps = nullptr;
  std::vector<float> slot_initial_values;
};

template <typename Key>
class KeyedBackend : public TableBackend {
 public:
  // `keys` is a tensor of the table's key type (any shape), in the memory of the op's device.
  // rows[keys.NumElements(), dim]: the rows; a missing key's initial row. present (null, or one
  // per key in the same memory as rows): whether each key had a row.
  virtual ::tensorflow::Status Find(::tensorflow::OpKernelContext* ctx,
                                    const ::tensorflow::Tensor& keys, float* rows, bool* present,
                                    FindDedup dedup) = 0;
  // Sets the rows of keys to rows[n, dim]; of a key given twice, the last row wins.
  virtual ::tensorflow::Status Insert(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys, const float* rows) = 0;
  virtual ::tensorflow::Status Remove(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys) = 0;
  // One optimizer step for distinct keys with gradients[n, dim] (the table's admission first).
  virtual ::tensorflow::Status Apply(::tensorflow::OpKernelContext* ctx,
                                     const de::OptimizerParams& params, int64_t step,
                                     const ::tensorflow::Tensor& keys, const float* gradients) = 0;
  // Replaces the content with `rows` of keys[rows.n] (host memory; checked by ImportTensors):
  // a new core table is filled, then swapped in; the data's duplicate keys are refused.
  virtual ::tensorflow::Status Import(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys,
                                      const ImportedRows& rows) = 0;
  // Reads snapshot chains into a new core table by the rules of core/snapshot_restore.h, and
  // swaps it in only once every file read cleanly (with options.verify_only, never).
  virtual ::tensorflow::Status Restore(::tensorflow::OpKernelContext* ctx,
                                       const de::RestoreOptions& options,
                                       const std::vector<std::vector<std::string>>& chains,
                                       const de::OpenSnapshot& open, int64_t* step) = 0;
};

// The op's CUDA stream (null on a CPU device), from TensorFlow's stream executor: no CUDA header.
cudaStream_t StreamOf(::tensorflow::OpKernelContext* ctx);

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_
