#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"

#include <algorithm>
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

std::string ReadDeviceSnapshot(ByteSource* source, DeviceTable& table, cudaStream_t stream,
                               SnapshotHeader* header_out, bool merge_admission) {
  SnapshotReader reader(source);
  SnapshotHeader header;
  std::string problem = reader.ReadHeader(&header);
  if (!problem.empty()) return problem;
  if (header.key_type != SnapshotKeyType::kInt64) {
    return "the snapshot has string keys; GPU tables hold int64 keys";
  }
  if (static_cast<int>(header.dim) != table.dim()) {
    return "the snapshot's dim is " + std::to_string(header.dim) + ", the table's " +
           std::to_string(table.dim());
  }
  if (static_cast<int>(header.initializer_version) != table.options().initializer.version) {
    return "the snapshot was saved from a table of initializer version " +
           std::to_string(header.initializer_version) + ", the table has version " +
           std::to_string(table.options().initializer.version) +
           " (a table keeps its initializer version for life)";
  }
  if (header.num_slots > static_cast<uint32_t>(kMaxSlots)) {
    return "the snapshot has " + std::to_string(header.num_slots) + " optimizer slots (at most " +
           std::to_string(kMaxSlots) + ")";
  }
  if (static_cast<int>(header.num_slots) > table.num_slots()) {
    problem =
        table.EnsureSlots(stream, static_cast<int>(header.num_slots), header.slot_initial_values);
    if (!problem.empty()) return problem;
  }
  const int dim = table.dim();
  const int file_stride = dim * (1 + static_cast<int>(header.num_slots));
  const int stride = dim * (1 + table.num_slots());
  const std::vector<float> slot_init = table.slot_initial_values();
  constexpr size_t kChunkRows = size_t{1} << 16;
  std::vector<int64_t> keys, steps, removed;
  std::vector<uint32_t> counts;
  std::vector<float> values;
  std::string failure;
  auto flush_rows = [&] {
    if (keys.empty() || !failure.empty()) return failure.empty();
    HostRows rows;
    rows.n = static_cast<int64_t>(keys.size());
    rows.keys = keys.data();
    rows.update_counts = counts.data();
    rows.last_steps = steps.data();
    rows.values = values.data();
    failure = table.Import(stream, rows);
    keys.clear();
    counts.clear();
    steps.clear();
    values.clear();
    return failure.empty();
  };
  auto flush_removed = [&] {
    if (!removed.empty() && failure.empty()) {
      failure = table.RemoveHostKeys(stream, static_cast<int64_t>(removed.size()), removed.data());
    }
    removed.clear();
    return failure.empty();
  };
  auto tombstone = [&](int64_t key) {
    removed.push_back(key);
    return removed.size() < kChunkRows || flush_removed();
  };
  auto row = [&](int64_t key, uint32_t count, int64_t step, const float* row_values) {
    if (!flush_removed()) return false;  // tombstones come first: apply them before any row
    keys.push_back(key);
    counts.push_back(count);
    steps.push_back(step);
    values.insert(values.end(), row_values, row_values + file_stride);
    for (int j = file_stride; j < stride; ++j) values.push_back(slot_init[j / dim - 1]);
    return keys.size() < kChunkRows || flush_rows();
  };
  // The file's sketch, if the table's has its width and depth (else it cannot be re-hashed).
  const AdmissionSpec& spec = table.options().admission;
  SnapshotReader::AdmissionRecords admission;
  admission.sketch = [&](uint64_t first, const uint32_t* counters, size_t n) {
    if (!flush_removed() || !flush_rows()) return false;
    failure = table.WriteSketch(stream, first, n, counters, merge_admission);
    return failure.empty();
  };
  const bool same_sketch =
      header.admission == SnapshotAdmission::kSketch && table.SketchCounters() > 0 &&
      header.sketch_width == static_cast<uint64_t>(SketchWidth(spec.sketch_width)) &&
      header.sketch_depth == static_cast<uint32_t>(spec.sketch_depth);
  problem =
      reader.ReadRecords(tombstone, row, nullptr, nullptr, same_sketch ? &admission : nullptr);
  if (problem.empty() && !(flush_removed() && flush_rows())) return failure;
  if (!failure.empty()) return failure;
  if (!problem.empty()) return problem;
  if (header_out != nullptr) *header_out = header;
  return "";
}

}  // namespace de
}  // namespace tf_ext
