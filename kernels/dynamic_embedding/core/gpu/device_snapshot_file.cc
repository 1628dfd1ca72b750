#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace tf_ext {
namespace de {

std::string WriteDeviceSnapshot(DeviceTable& table, cudaStream_t stream, SnapshotHeader* header,
                                ByteSink* sink, int64_t chunk_rows, int64_t since_version,
                                bool track, int64_t* version) {
  const bool full = since_version < 0;
  DeviceSnapshotPlan plan;
  std::string error = table.BeginSnapshot(stream, since_version, track, &plan);
  if (version != nullptr) *version = plan.version;
  if (!error.empty()) return error;
  if (plan.version == DeviceSnapshotPlan::kNoDeltaBase) {
    return NoDeltaBase(since_version);
  }
  const int dim = table.dim();
  header->kind = full ? SnapshotKind::kFull : SnapshotKind::kDelta;
  header->key_type = SnapshotKeyType::kInt64;
  header->dim = static_cast<uint32_t>(dim);
  header->num_slots = static_cast<uint32_t>(table.num_slots());
  header->slot_initial_values = table.slot_initial_values();
  header->rows = static_cast<uint64_t>(plan.rows);
  header->tombstones = static_cast<uint64_t>(plan.tombstones);
  DescribeAdmission(table.options().admission, header);
  SnapshotWriter writer(sink);
  if (!writer.Begin(*header)) return "writing the snapshot header failed";
  bool written = true;
  if (!full) {
    error =
        table.ExportRemoved(stream, since_version, chunk_rows, [&](int64_t n, const int64_t* keys) {
          for (int64_t i = 0; i < n && written; ++i) {
            written = writer.Tombstone(keys[i]);
          }
          return written;
        });
    if (!written) return "writing a removed id failed";
    if (!error.empty()) return error;
  }
  const int stride = dim * (1 + table.num_slots());
  error = table.Export(
      stream, chunk_rows,
      [&](const HostRows& rows) {
        for (int64_t i = 0; i < rows.n && written; ++i) {
          const float* values = rows.values + i * stride;
          written = writer.Row(rows.keys[i], rows.update_counts[i], rows.last_steps[i], values,
                               values + dim);
        }
        return written;
      },
      full ? -1 : since_version);
  if (!written) return "writing a snapshot row failed";
  if (!error.empty()) return error;
  if (header->admission == SnapshotAdmission::kSketch) {
    std::vector<uint32_t> counters(kSnapshotChunkBytes / sizeof(uint32_t));
    const uint64_t total = table.SketchCounters();
    for (uint64_t first = 0; first < total; first += counters.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(counters.size(), total - first));
      const std::string problem = table.ReadSketch(stream, first, n, counters.data());
      if (!problem.empty()) return problem;
      if (!writer.SketchCounters(counters.data(), n)) return "writing the admission sketch failed";
    }
  }
  return writer.Finish() ? "" : "finishing the snapshot failed (row count changed?)";
}

TableError DeviceTableSink::EnsureSlots(int num_slots, const std::vector<float>& slot_init) {
  TableError error = Flush();  // staged rows have the slots of before
  if (!error.ok()) return error;
  error = TableError::FromMessage(table_->EnsureSlots(stream_, num_slots, slot_init));
  slot_init_ = table_->slot_initial_values();
  return error;
}

TableError DeviceTableSink::PutRow(int64_t key, uint32_t update_count, int64_t last_step,
                                   const float* values, int file_slots) {
  // Removed ids come first in a file: apply them before any row.
  const TableError error = FlushRemoved();
  if (!error.ok()) return error;
  const int dim = table_->dim();
  const int file_stride = dim * (1 + file_slots);
  const int stride = dim * (1 + table_->num_slots());
  keys_.push_back(key);
  counts_.push_back(update_count);
  steps_.push_back(last_step);
  values_.insert(values_.end(), values, values + file_stride);
  for (int j = file_stride; j < stride; ++j) values_.push_back(slot_init_[j / dim - 1]);
  return keys_.size() < kChunkRows ? TableError::Ok() : FlushRows();
}

TableError DeviceTableSink::Remove(int64_t key) {
  // The next file of a chain removes ids that earlier files' rows may hold.
  const TableError error = FlushRows();
  if (!error.ok()) return error;
  removed_.push_back(key);
  return removed_.size() < kChunkRows ? TableError::Ok() : FlushRemoved();
}

TableError DeviceTableSink::ClearAdmission() {
  const uint64_t total = table_->SketchCounters();
  const std::vector<uint32_t> zeros(std::min<uint64_t>(total, kChunkRows), 0);
  for (uint64_t first = 0; first < total; first += zeros.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), total - first));
    const std::string problem =
        table_->WriteSketch(stream_, first, n, zeros.data(), /*keep_larger=*/false);
    if (!problem.empty()) return TableError::FromMessage(problem);
  }
  return TableError::Ok();
}

TableError DeviceTableSink::RestoreSketch(uint64_t width, int depth, uint64_t first, size_t n,
                                          const uint32_t* counters) {
  const AdmissionSpec& spec = table_->options().admission;
  const bool same_shape = table_->SketchCounters() > 0 &&
                          width == static_cast<uint64_t>(SketchWidth(spec.sketch_width)) &&
                          depth == spec.sketch_depth;
  if (!same_shape) return TableError::Ok();  // cannot be re-hashed: dropped
  return TableError::FromMessage(
      table_->WriteSketch(stream_, first, n, counters, /*keep_larger=*/true));
}

TableError DeviceTableSink::Flush() {
  const TableError error = FlushRemoved();
  return error.ok() ? FlushRows() : error;
}

TableError DeviceTableSink::FlushRows() {
  if (keys_.empty()) return TableError::Ok();
  HostRows rows;
  rows.n = static_cast<int64_t>(keys_.size());
  rows.keys = keys_.data();
  rows.update_counts = counts_.data();
  rows.last_steps = steps_.data();
  rows.values = values_.data();
  const std::string problem = table_->Import(stream_, rows);
  keys_.clear();
  counts_.clear();
  steps_.clear();
  values_.clear();
  return TableError::FromMessage(problem);
}

TableError DeviceTableSink::FlushRemoved() {
  if (removed_.empty()) return TableError::Ok();
  const std::string problem =
      table_->RemoveHostKeys(stream_, static_cast<int64_t>(removed_.size()), removed_.data());
  removed_.clear();
  return TableError::FromMessage(problem);
}

namespace {
// A source the caller owns, lent to a restore.
class LentSource : public ByteSource {
 public:
  explicit LentSource(ByteSource* source) : source_(source) {}
  bool Read(char* out, size_t n) override { return source_->Read(out, n); }

 private:
  ByteSource* source_;
};
}  // namespace

std::string ReadDeviceSnapshot(ByteSource* source, DeviceTable& table, cudaStream_t stream,
                               SnapshotHeader* header, bool merge_admission) {
  RestoreOptions options;
  options.table_name = table.options().name;
  options.dim = table.dim();
  options.initializer_version = table.options().initializer.version;
  options.max_rows = table.options().max_rows;
  options.merge_into_sink = merge_admission;
  options.check_chain_order = false;  // one file, onto a table that holds its base
  DeviceTableSink sink(&table, stream);
  int64_t step = 0;
  const TableError error = RestoreChains<int64_t>(
      options, {{"snapshot"}},
      [&](const std::string&, OpenedSnapshot* opened) {
        opened->source = std::make_unique<LentSource>(source);
        return TableError::Ok();
      },
      &sink, &step, header);
  return error.message();
}

}  // namespace de
}  // namespace tf_ext
