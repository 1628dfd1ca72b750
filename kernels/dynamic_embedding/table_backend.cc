// The two backends of the table kernels (table_backend.h).
#include "kernels/dynamic_embedding/table_backend.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/apply_rows.h"
#include "kernels/dynamic_embedding/core/distinct_lookup.h"
#include "kernels/dynamic_embedding/core/embedding_table_sink.h"
#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"
#include "kernels/dynamic_embedding/table_kernel.h"
#include "kernels/dynamic_embedding/table_resource.h"
#include "kernels/dynamic_embedding/table_restore.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/platform/stream_executor.h"

namespace tf_ext {

Status FromCore(const de::TableError& error) {
  using Code = de::TableError::Code;
  namespace errors = ::tensorflow::errors;
  switch (error.code()) {
    case Code::kOk:
      return ::tensorflow::OkStatus();
    case Code::kInvalidArgument:
      return errors::InvalidArgument(error.message());
    case Code::kNotFound:
      return errors::NotFound(error.message());
    case Code::kDataLoss:
      return errors::DataLoss(error.message());
    case Code::kResourceExhausted:
      return errors::ResourceExhausted(error.message());
    case Code::kFailedPrecondition:
      return errors::FailedPrecondition(error.message());
    case Code::kInternal:
      break;
  }
  return errors::Internal(error.message());
}

FindDedup FindDedupSetting() {
  const char* value = std::getenv("TF_EXT_FIND_DEDUP");
  const std::string setting = value == nullptr ? "auto" : value;
  if (setting == "1") return FindDedup::kAlways;
  if (setting == "0") return FindDedup::kNever;
  return FindDedup::kAuto;
}

namespace {

// A GPU table core's message ("" when it succeeded) as a Status.
Status FromDevice(const std::string& message) {
  return FromCore(de::TableError::FromMessage(message));
}

// An exported update count, clamped to the table's 32 bits.
uint32_t UpdateCount(int64_t count) {
  return static_cast<uint32_t>(std::clamp<int64_t>(count, 0, std::numeric_limits<uint32_t>::max()));
}

Status NoDeltaBase(const DynamicTable& table, int64_t since) {
  return ::tensorflow::errors::FailedPrecondition("dynamic embedding table '", table.name(),
                                                  "': ", de::NoDeltaBase(since));
}

// The CPU table core, its batches split over TensorFlow's intra-op thread pool.
template <typename Key>
class CpuTableBackend : public KeyedBackend<Key> {
 public:
  using Element = typename KeyTensor<Key>::Element;
  explicit CpuTableBackend(DynamicTable* table) : table_(table) {}

  const de::AdmissionSpec& admission() const override { return core().admission(); }
  int64_t Size(cudaStream_t) const override { return core().Size(); }
  size_t BytesInUse() const override { return core().BytesInUse(); }
  int64_t LatestStep(cudaStream_t) const override { return core().latest_step(); }
  de::TableCounters Counters(cudaStream_t) const override { return core().Counters(); }
  Status Clear(cudaStream_t) override {
    core().Clear();
    return ::tensorflow::OkStatus();
  }
  Status Evict(cudaStream_t, const de::EvictionCriteria& criteria, int64_t* evicted) override {
    *evicted = core().Evict(criteria);
    return ::tensorflow::OkStatus();
  }

  Status Find(OpKernelContext* ctx, const Tensor& keys, float* rows, bool* present,
              FindDedup dedup) override {
    if constexpr (std::is_same_v<Key, int64_t>) {
      if (present == nullptr && FindDistinctOnce(ctx, keys, rows, dedup)) {
        return ::tensorflow::OkStatus();
      }
    }
    const auto flat_keys = keys.flat<Element>();
    const de::EmbeddingTable<Key>& table = core();
    const int dim = table_->dim();
    ParallelFor(ctx, flat_keys.size(), 50 + 2 * dim, [&](int64_t begin, int64_t end) {
      FindRows(
          table, begin, end, [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); },
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
    core().InsertOrAssignBatch(
        flat_keys.size(), [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); }, rows);
    return ::tensorflow::OkStatus();
  }

  Status Remove(OpKernelContext*, const Tensor& keys) override {
    const auto flat_keys = keys.flat<Element>();
    // On this op's thread, as Evict runs: a large remove spread over the intra-op pool would
    // hold every pool thread, and lookups, whose blocks queue behind it, would wait for all of
    // it. Batched by shard, so lookups wait at most one short batch for a shard's lock.
    core().RemoveBatch(flat_keys.size(),
                       [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); });
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

  Status WriteSnapshot(cudaStream_t, const std::string& path, int64_t since, bool track,
                       de::SnapshotHeader* header, de::ByteSink* sink, int64_t* version) override {
    de::EmbeddingTable<Key>& table = core();
    header->kind = since < 0 ? de::SnapshotKind::kFull : de::SnapshotKind::kDelta;
    header->key_type = std::is_same_v<Key, std::string> ? de::SnapshotKeyType::kString
                                                        : de::SnapshotKeyType::kInt64;
    de::DescribeAdmission(table.admission(), header);
    de::SnapshotWriter writer(sink);
    bool written = false;
    *version = table.Snapshot(
        since < 0 ? de::EmbeddingTable<Key>::kFullSnapshot : since,
        [&](int64_t rows, int64_t tombstones) {
          // stable: EnsureSlots waits for a running snapshot
          header->num_slots = static_cast<uint32_t>(table.num_slots());
          header->slot_initial_values = table.slot_initial_values();
          header->rows = static_cast<uint64_t>(rows);
          header->tombstones = static_cast<uint64_t>(tombstones);
          return writer.Begin(*header);
        },
        [&](const Key& key, const de::RowRef& row) {
          return writer.Row(key, *row.update_count, *row.last_step, row.embedding, row.slots);
        },
        [&](const Key& key) { return writer.Tombstone(key); }, track,
        [&](const Key& key, uint32_t count) { return writer.Pending(key, count); },
        [&](const de::CountMinSketch& sketch) { return writer.SketchCounters(sketch); });
    if (*version == de::EmbeddingTable<Key>::kSnapshotNoBase) return NoDeltaBase(*table_, since);
    if (*version >= 0) written = writer.Finish();
    // Nothing of it is kept: the caller deletes what it wrote, and the path keeps what it held.
    if (writer.over_limit_bytes() != 0) {
      return ::tensorflow::errors::ResourceExhausted(
          de::CheckSnapshotFileBytes(table_->name(), writer.over_limit_bytes()), " ('", path,
          "' not written)");
    }
    if (!written) {
      return ::tensorflow::errors::Internal("dynamic embedding table '", table_->name(),
                                            "': the snapshot walk stopped while writing ", path);
    }
    return ::tensorflow::OkStatus();
  }
  Status CommitSnapshot(cudaStream_t, int64_t version) override {
    core().CommitSnapshot(version);
    return ::tensorflow::OkStatus();
  }
  int64_t MarkSnapshotBase(cudaStream_t) override { return core().MarkSnapshotBase(); }

  Status Import(OpKernelContext*, const Tensor& keys, const ImportedRows& rows) override {
    const int dim = table_->dim();
    const int num_slots = static_cast<int>(rows.slot_initial_values.size());
    // The tensors hold no admission state: the counts of ids waiting start at 0.
    de::EmbeddingTable<Key> fresh = EmptyTableLike<Key>(table_);
    fresh.EnsureSlots(num_slots, rows.slot_initial_values);
    const auto flat_keys = keys.flat<Element>();
    // On this op's thread, not the intra-op pool, whose every thread a large import would hold
    // while lookups of other tables (or of this one, until the swap) queue behind it.
    fresh.UpsertBatch(
        rows.n, [&](int64_t i) { return KeyTensor<Key>::View(flat_keys(i)); },
        [&](int64_t i, de::RowRef& row, bool) {
          std::copy(rows.values + i * dim, rows.values + (i + 1) * dim, row.embedding);
          std::copy(rows.slots + i * num_slots * dim, rows.slots + (i + 1) * num_slots * dim,
                    row.slots);
          *row.update_count = UpdateCount(rows.update_counts[i]);
          *row.last_step = rows.last_steps[i];
        });
    if (fresh.Size() != rows.n) {
      return table_->Invalid("import: the data holds ", rows.n - fresh.Size(), " duplicate keys");
    }
    SwapInRestored(table_, &fresh);
    return ::tensorflow::OkStatus();
  }

  Status Restore(OpKernelContext*, const de::RestoreOptions& options,
                 const std::vector<std::vector<std::string>>& chains, const de::OpenSnapshot& open,
                 int64_t* step) override {
    de::EmbeddingTable<Key> fresh = EmptyTableLike<Key>(table_);
    de::EmbeddingTableSink<Key> sink(table_->name(), &fresh, table_->max_rows());
    TF_RETURN_IF_ERROR(FromCore(de::RestoreChains<Key>(options, chains, open, &sink, step)));
    if (!options.verify_only) SwapInRestored(table_, &fresh);
    return ::tensorflow::OkStatus();
  }

 private:
  de::EmbeddingTable<Key>& core() const { return *table_->template table<Key>(); }

  // The lookup of int64 keys, each distinct key found once (core/distinct_lookup.h), where the
  // setting and the batch's repeats say it pays; false, doing nothing, where not.
  bool FindDistinctOnce(OpKernelContext* ctx, const Tensor& keys, float* rows,
                        FindDedup setting) const {
    const auto flat_keys = keys.flat<int64_t>();
    const int64_t n = flat_keys.size();
    auto key_at = [&](int64_t i) { return flat_keys(i); };
    const int dim = table_->dim();
    const bool dedup = setting == FindDedup::kAlways ||
                       (setting == FindDedup::kAuto && de::DuplicatesPay(n, dim, key_at));
    if (!dedup || n == 0) return false;
    std::vector<int32_t> slots(n);  // CheckCallIds: n < 2^31
    auto for_ranges = [ctx](int64_t count, int64_t cost_per_item, auto&& fn) {
      ParallelFor(ctx, count, cost_per_item, fn);
    };
    const de::DistinctRows found =
        de::FindDistinctRows(core(), n, key_at, slots.data(), kLookupBlock, for_ranges);
    ParallelFor(ctx, n, 4 + dim / 4, [&](int64_t begin, int64_t end) {
      de::PlaceRows(found.rows.data(), dim, slots.data(), begin, end, rows, dim);
    });
    return true;
  }

  DynamicTable* table_;  // owns this backend
};

// The GPU table core, on the op's stream; keys and rows in device memory.
class GpuTableBackend : public KeyedBackend<int64_t> {
 public:
  explicit GpuTableBackend(DynamicTable* table) : table_(table) {}

  const de::AdmissionSpec& admission() const override {
    return table_->device_table()->options().admission;
  }
  int64_t Size(cudaStream_t stream) const override { return table_->device_table()->Size(stream); }
  size_t BytesInUse() const override { return table_->device_table()->BytesInUse(); }
  int64_t LatestStep(cudaStream_t stream) const override {
    return table_->device_table()->LatestStep(stream);
  }
  de::TableCounters Counters(cudaStream_t stream) const override {
    return table_->device_table()->Counters(stream);
  }
  Status Clear(cudaStream_t stream) override {
    return FromDevice(table_->device_table()->Clear(stream));
  }
  Status Evict(cudaStream_t stream, const de::EvictionCriteria& criteria,
               int64_t* evicted) override {
    return FromDevice(table_->device_table()->Evict(stream, criteria, evicted));
  }

  Status Find(OpKernelContext* ctx, const Tensor& keys, float* rows, bool* present,
              FindDedup) override {
    return FromDevice(table_->device_table()->Find(StreamOf(ctx), keys.NumElements(),
                                                   keys.flat<int64_t>().data(), rows, present));
  }
  Status Insert(OpKernelContext* ctx, const Tensor& keys, const float* rows) override {
    return FromDevice(table_->device_table()->InsertOrAssign(StreamOf(ctx), keys.NumElements(),
                                                             keys.flat<int64_t>().data(), rows));
  }
  Status Remove(OpKernelContext* ctx, const Tensor& keys) override {
    return FromDevice(table_->device_table()->Remove(StreamOf(ctx), keys.NumElements(),
                                                     keys.flat<int64_t>().data(), nullptr));
  }
  Status Apply(OpKernelContext* ctx, const de::OptimizerParams& params, int64_t step,
               const Tensor& keys, const float* gradients) override {
    return FromDevice(table_->device_table()->ApplyGradients(
        StreamOf(ctx), params, step, keys.NumElements(), keys.flat<int64_t>().data(), gradients));
  }

  // Full and delta snapshots in the CPU table's file format, by the same rules
  // (core/gpu/device_snapshot_file.h); the rows stream through pinned memory.
  Status WriteSnapshot(cudaStream_t stream, const std::string&, int64_t since, bool track,
                       de::SnapshotHeader* header, de::ByteSink* sink, int64_t* version) override {
    const DynamicTable::LockedCore core = table_->device_table();  // for the whole save
    const std::string problem = de::WriteDeviceSnapshot(*core, stream, header, sink,
                                                        /*chunk_rows=*/0, since, track, version);
    if (*version == de::DeviceSnapshotPlan::kNoDeltaBase) return NoDeltaBase(*table_, since);
    return FromDevice(problem);
  }
  Status CommitSnapshot(cudaStream_t stream, int64_t version) override {
    return FromDevice(table_->device_table()->CommitSnapshot(stream, version));
  }
  int64_t MarkSnapshotBase(cudaStream_t stream) override {
    return table_->device_table()->MarkSnapshotBase(stream);
  }

  Status Import(OpKernelContext* ctx, const Tensor& keys, const ImportedRows& rows) override {
    const cudaStream_t stream = StreamOf(ctx);
    const DynamicTable::LockedCore live = table_->device_table();
    std::string error;
    std::unique_ptr<de::DeviceTable> fresh = live->NewEmpty(&error);
    if (fresh == nullptr) return FromDevice(error);
    // Slots the table already has beyond the data's keep their initial values, as on the CPU.
    const bool wider = live->num_slots() > static_cast<int>(rows.slot_initial_values.size());
    TF_RETURN_IF_ERROR(FromDevice(fresh->EnsureSlots(
        stream, wider ? live->num_slots() : static_cast<int>(rows.slot_initial_values.size()),
        wider ? live->slot_initial_values() : rows.slot_initial_values)));
    const int dim = table_->dim();
    const int data_slots = static_cast<int>(rows.slot_initial_values.size());
    const int num_slots = fresh->num_slots();
    const std::vector<float> slot_init = fresh->slot_initial_values();
    const int64_t* flat_keys = keys.flat<int64_t>().data();
    // Staged in chunks: a snapshot row is the embedding, then each slot.
    constexpr int64_t kChunkRows = int64_t{1} << 16;
    std::vector<float> values;
    std::vector<uint32_t> counts;
    for (int64_t first = 0; first < rows.n; first += kChunkRows) {
      const int64_t n = std::min(kChunkRows, rows.n - first);
      values.clear();
      counts.clear();
      for (int64_t i = first; i < first + n; ++i) {
        values.insert(values.end(), rows.values + i * dim, rows.values + (i + 1) * dim);
        values.insert(values.end(), rows.slots + i * data_slots * dim,
                      rows.slots + (i + 1) * data_slots * dim);
        for (int s = data_slots; s < num_slots; ++s) values.insert(values.end(), dim, slot_init[s]);
        counts.push_back(UpdateCount(rows.update_counts[i]));
      }
      de::HostRows chunk;
      chunk.n = n;
      chunk.keys = flat_keys + first;
      chunk.update_counts = counts.data();
      chunk.last_steps = rows.last_steps + first;
      chunk.values = values.data();
      TF_RETURN_IF_ERROR(FromDevice(fresh->Import(stream, chunk)));
    }
    const int64_t size = fresh->Size(stream);
    if (size != rows.n) {
      return table_->Invalid("import: the data holds ", rows.n - size, " duplicate keys");
    }
    return FromDevice(live->SwapContents(*fresh));
  }

  Status Restore(OpKernelContext* ctx, const de::RestoreOptions& options,
                 const std::vector<std::vector<std::string>>& chains, const de::OpenSnapshot& open,
                 int64_t* step) override {
    std::string error;
    std::unique_ptr<de::DeviceTable> fresh = table_->device_table()->NewEmpty(&error);
    if (fresh == nullptr) return FromDevice(error);
    de::DeviceTableSink sink(fresh.get(), StreamOf(ctx));
    TF_RETURN_IF_ERROR(FromCore(de::RestoreChains<int64_t>(options, chains, open, &sink, step)));
    if (options.verify_only) return ::tensorflow::OkStatus();
    return FromDevice(table_->device_table()->SwapContents(*fresh));
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
    if (text == "emulate" || text == "host") return GpuTables::kEmulate;  // "host": older name
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
  backend_ = string_backend_ ? static_cast<TableBackend*>(string_backend_.get())
                             : static_cast<TableBackend*>(int64_backend_.get());
}

}  // namespace tf_ext
