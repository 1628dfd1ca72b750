// Kernels of streaming table checkpoints (ops/dynamic_embedding_checkpoint_ops.cc): adapters
// between TensorFlow's file systems and the snapshot file format of the core
// (core/snapshot_file.h), which walks the table (EmbeddingTable::Snapshot) or fills a new one.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"
#include "kernels/dynamic_embedding/core/sharding.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "kernels/dynamic_embedding/table_kernel.h"
#include "kernels/dynamic_embedding/table_resource.h"
#include "kernels/dynamic_embedding/table_restore.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace tf_ext {
namespace {

using ::tensorflow::Env;
using ::tensorflow::RandomAccessFile;
using ::tensorflow::WritableFile;
namespace errors = ::tensorflow::errors;

class FileSink : public de::ByteSink {
 public:
  explicit FileSink(WritableFile* file) : file_(file) {}
  bool Append(const char* data, size_t n) override {
    status_ = file_->Append(::tensorflow::StringPiece(data, n));
    if (status_.ok()) bytes_ += static_cast<int64_t>(n);
    return status_.ok();
  }
  const Status& status() const { return status_; }
  int64_t bytes() const { return bytes_; }

 private:
  WritableFile* file_;
  Status status_;
  int64_t bytes_ = 0;
};

// Reads are whole records blocks (about 1 MiB) or their 16-byte heads: no buffer of its own.
class FileSource : public de::ByteSource {
 public:
  explicit FileSource(RandomAccessFile* file) : file_(file) {}
  bool Read(char* out, size_t n) override {
    ::tensorflow::StringPiece result;
    status_ = file_->Read(offset_, n, &result, out);
    if (result.size() != n) {
      if (status_.ok() || ::tensorflow::errors::IsOutOfRange(status_)) status_ = Status();
      return false;
    }
    if (result.data() != out) std::memcpy(out, result.data(), n);
    offset_ += n;
    status_ = Status();
    return true;
  }
  const Status& status() const { return status_; }

 private:
  RandomAccessFile* file_;
  uint64_t offset_ = 0;
  Status status_;
};

template <typename Key>
constexpr de::SnapshotKeyType KeyTypeOf() {
  return std::is_same_v<Key, int64_t> ? de::SnapshotKeyType::kInt64 : de::SnapshotKeyType::kString;
}

// Eager calls skip shape inference: inputs read as scalars are checked here (a non-scalar would
// abort the process in Tensor::scalar).
Status CheckScalars(OpKernelContext* ctx, const DynamicTable& table,
                    std::initializer_list<int> inputs) {
  for (int index : inputs) {
    if (!::tensorflow::TensorShapeUtils::IsScalar(ctx->input(index).shape())) {
      return table.Invalid(ctx->op_kernel().def().op(), ": input ", index,
                           " must be a scalar, got shape ",
                           ctx->input(index).shape().DebugString());
    }
  }
  return ::tensorflow::OkStatus();
}

int64_t ScalarInput(OpKernelContext* ctx, int index) {
  return ctx->input(index).scalar<int64_t>()();
}

// Sets outputs 0, 1, ... to these int64 scalars.
Status SetScalarOutputs(OpKernelContext* ctx, std::initializer_list<int64_t> values) {
  int index = 0;
  for (int64_t value : values) {
    Tensor* out;
    TF_RETURN_IF_ERROR(ctx->allocate_output(index++, TensorShape({}), &out));
    out->scalar<int64_t>()() = value;
  }
  return ::tensorflow::OkStatus();
}

// Writes `path` through a uniquely named temporary file that is renamed into place once write()
// returns true, so concurrent saves to one path never share a file and a failed save leaves none.
// write(sink) returns whether it wrote the whole file, *bytes what it wrote; the status is the
// file system's.
template <typename Write>
Status WriteFileInPlace(const std::string& path, int64_t* bytes, Write&& write) {
  Env* env = Env::Default();
  const std::string dir(::tensorflow::io::Dirname(path));
  if (!dir.empty() && !env->FileExists(dir).ok()) {
    TF_RETURN_IF_ERROR(env->RecursivelyCreateDir(dir));
  }
  const std::string temporary =
      path + ".tmp-" + std::to_string(std::random_device()() ^ env->NowMicros());
  std::unique_ptr<WritableFile> file;
  TF_RETURN_IF_ERROR(env->NewWritableFile(temporary, &file));
  FileSink sink(file.get());
  const bool written = write(&sink);
  *bytes = sink.bytes();
  Status status = sink.status();
  if (status.ok() && written) status = file->Close();
  if (status.ok() && written) status = env->RenameFile(temporary, path);
  if (!status.ok() || !written) {
    file.reset();
    env->DeleteFile(temporary).IgnoreError();
  }
  return status;
}

class SaveSnapshotOp : public TableKernel {
 public:
  explicit SaveSnapshotOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("track", &track_));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx, CheckScalars(ctx, *table, {1, 2, 3, 4, 5}));
    if (table->on_gpu()) {
      SaveFromDevice(ctx, table.get());
    } else if (table->key_dtype() == ::tensorflow::DT_STRING) {
      Save<std::string>(ctx, table.get());
    } else {
      Save<int64_t>(ctx, table.get());
    }
  }

 private:
  static de::SnapshotHeader HeaderOf(OpKernelContext* ctx, const DynamicTable& table) {
    de::SnapshotHeader header;
    header.dim = static_cast<uint32_t>(table.dim());
    header.chain_id = static_cast<uint64_t>(ScalarInput(ctx, 3));
    header.sequence = static_cast<uint64_t>(ScalarInput(ctx, 4));
    header.step = ScalarInput(ctx, 5);
    header.table_name = table.name();
    header.initializer_version = static_cast<uint32_t>(table.initializer().version);
    return header;
  }

  // The outputs: version, rows, tombstones, bytes and the slots' initial values.
  static void SetOutputs(OpKernelContext* ctx, int64_t version, const de::SnapshotHeader& header,
                         int64_t bytes) {
    OP_REQUIRES_OK(ctx, SetScalarOutputs(ctx, {version, static_cast<int64_t>(header.rows),
                                               static_cast<int64_t>(header.tombstones), bytes}));
    const int num_slots = static_cast<int>(header.slot_initial_values.size());
    Tensor* slot_init;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({num_slots}), &slot_init));
    for (int s = 0; s < num_slots; ++s) slot_init->flat<float>()(s) = header.slot_initial_values[s];
  }

  template <typename Key>
  void Save(OpKernelContext* ctx, DynamicTable* table) {
    const std::string path(ctx->input(1).scalar<tstring>()());
    const int64_t since = ScalarInput(ctx, 2);
    de::EmbeddingTable<Key>* core = table->template table<Key>();
    de::SnapshotHeader header = HeaderOf(ctx, *table);
    header.kind = since < 0 ? de::SnapshotKind::kFull : de::SnapshotKind::kDelta;
    header.key_type = KeyTypeOf<Key>();
    de::DescribeAdmission(core->admission(), &header);
    bool written = false;
    int64_t version = -1, bytes = 0;
    uint64_t over_limit_bytes = 0;
    const Status status = WriteFileInPlace(path, &bytes, [&](FileSink* sink) {
      de::SnapshotWriter writer(sink);
      version = core->Snapshot(
          since < 0 ? de::EmbeddingTable<Key>::kFullSnapshot : since,
          [&](int64_t rows, int64_t tombstones) {
            // stable: EnsureSlots waits for a running snapshot
            header.num_slots = static_cast<uint32_t>(core->num_slots());
            header.slot_initial_values = core->slot_initial_values();
            header.rows = static_cast<uint64_t>(rows);
            header.tombstones = static_cast<uint64_t>(tombstones);
            return writer.Begin(header);
          },
          [&](const Key& key, const de::RowRef& row) {
            return writer.Row(key, *row.update_count, *row.last_step, row.embedding, row.slots);
          },
          [&](const Key& key) { return writer.Tombstone(key); }, track_,
          [&](const Key& key, uint32_t count) { return writer.Pending(key, count); },
          [&](const de::CountMinSketch& sketch) { return writer.SketchCounters(sketch); });
      if (version >= 0) written = writer.Finish();
      over_limit_bytes = writer.over_limit_bytes();
      return written;
    });
    OP_REQUIRES(ctx, version != de::EmbeddingTable<Key>::kSnapshotNoBase,
                errors::FailedPrecondition("dynamic embedding table '", table->name(),
                                           "': ", de::NoDeltaBase(since)));
    OP_REQUIRES_OK(ctx, status);
    // Nothing of it is kept: the temporary file is deleted, and the path keeps what it held.
    OP_REQUIRES(
        ctx, over_limit_bytes == 0,
        errors::ResourceExhausted(de::CheckSnapshotFileBytes(table->name(), over_limit_bytes),
                                  " ('", path, "' not written)"));
    OP_REQUIRES(ctx, written,
                errors::Internal("dynamic embedding table '", table->name(),
                                 "': the snapshot walk stopped while writing ", path));
    if (track_) core->CommitSnapshot(version);
    SetOutputs(ctx, version, header, bytes);
  }

  // A GPU table writes full and delta snapshots in the same file format, by the same rules
  // (device_snapshot_file.h).
  void SaveFromDevice(OpKernelContext* ctx, DynamicTable* table) {
    const std::string path(ctx->input(1).scalar<tstring>()());
    const int64_t since = ScalarInput(ctx, 2);
    const DynamicTable::LockedCore core = table->device_table();  // for the whole save
    const cudaStream_t stream = StreamOf(ctx);
    de::SnapshotHeader header = HeaderOf(ctx, *table);
    std::string problem;
    int64_t version = -1, bytes = 0;
    const Status status = WriteFileInPlace(path, &bytes, [&](FileSink* sink) {
      problem = de::WriteDeviceSnapshot(*core, stream, &header, sink, /*chunk_rows=*/0, since,
                                        track_, &version);
      return problem.empty();
    });
    OP_REQUIRES(ctx, version != de::DeviceSnapshotPlan::kNoDeltaBase,
                errors::FailedPrecondition("dynamic embedding table '", table->name(),
                                           "': ", de::NoDeltaBase(since)));
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES_OK(ctx, DynamicTable::FromCore(problem));
    if (track_) OP_REQUIRES_OK(ctx, DynamicTable::FromCore(core->CommitSnapshot(stream, version)));
    SetOutputs(ctx, version, header, bytes);
  }

  bool track_;
};

// Reads snapshot files, in chain order, into a new table that replaces the content at the end.
// As shard `shard_index` of `num_shards`, it keeps only the rows of its own ids (TfExtShardOf);
// `merge` reads several full snapshots (the shards of a sharded checkpoint) into one table.
// With `verify_only` it reads and checks every file the same way but keeps no row.
// Admission state: a file of a chain that holds some replaces the earlier files' (it is the whole
// state at its save); merged files add up: exact counts of this shard's ids, sketch counters by
// element-wise max (admission.h says why). A sketch of another width or depth than the table's
// cannot be re-hashed and is dropped; exact counts restored into a sketch raise the ids'
// estimates; files without admission state (format version 1) leave the counts at 0.
template <typename Key>
class ChainLoader {
 public:
  explicit ChainLoader(DynamicTable* table, int num_shards = 1, int shard_index = 0,
                       bool merge = false, bool verify_only = false)
      : table_(table),
        fresh_(EmptyTableLike<Key>(table)),
        num_shards_(num_shards),
        shard_index_(shard_index),
        merge_(merge),
        verify_only_(verify_only) {}

  // Reads one file of the chain; `position` is its index in the chain (0 for each merged file).
  // Without `read_admission` the file's admission state is skipped.
  Status Load(const std::string& path, int64_t position, bool read_admission = true) {
    Env* env = Env::Default();
    std::unique_ptr<RandomAccessFile> file;
    Status status = env->NewRandomAccessFile(path, &file);
    if (!status.ok()) {
      return errors::NotFound(Where(path), "cannot open the snapshot file: ", status.message());
    }
    FileSource source(file.get());
    de::SnapshotReader reader(&source);
    de::SnapshotHeader header;
    std::string problem = reader.ReadHeader(&header);
    if (!problem.empty()) return DataLoss(path, problem, source.status());
    TF_RETURN_IF_ERROR(CheckHeader(path, header, position));
    // A file's rows are distinct ids: unless a shard keeps only some, so many rows would pass
    // the table's limit, and are refused before any is read.
    if (num_shards_ == 1 && header.rows > static_cast<uint64_t>(table_->max_rows())) {
      return errors::ResourceExhausted(
          de::CheckTableRows(table_->name(), 0, static_cast<int64_t>(header.rows),
                             table_->max_rows()),
          " ('", path, "' holds them)");
    }
    // Merged shards may differ in slots (a shard that no optimizer updated has none): rows of a
    // file with fewer keep the initial values of the others.
    if (header.num_slots > de::kMaxSlots ||
        (!merge_ && static_cast<int>(header.num_slots) < fresh_.num_slots())) {
      return DataLoss(path,
                      "it has " + std::to_string(header.num_slots) +
                          " optimizer slots per row, an earlier file or this build has " +
                          std::to_string(fresh_.num_slots()) + " (at most " +
                          std::to_string(de::kMaxSlots) + ")",
                      Status());
    }
    if (static_cast<int>(header.num_slots) > fresh_.num_slots()) {
      fresh_.EnsureSlots(static_cast<int>(header.num_slots), header.slot_initial_values);
    }
    const int dim = table_->dim();
    const int num_slots = static_cast<int>(header.num_slots);
    std::string too_many_rows;
    auto put_row = [&](auto key, uint32_t count, int64_t step, const float* values) {
      if (verify_only_) return true;
      if (num_shards_ > 1 && de::ShardOf(key, num_shards_) != shard_index_) return true;
      if (fresh_.Size() >= table_->max_rows() && !fresh_.Contains(key)) {
        too_many_rows = de::CheckTableRows(table_->name(), fresh_.Size(), 1, table_->max_rows());
        return false;
      }
      fresh_.Upsert(key, [&](de::RowRef& row, bool) {
        std::memcpy(row.embedding, values, sizeof(float) * dim);
        std::memcpy(row.slots, values + dim, sizeof(float) * dim * num_slots);
        *row.update_count = count;
        *row.last_step = step;
      });
      return true;
    };
    auto remove = [&](auto key) {
      if (verify_only_) return true;
      fresh_.Remove(key);
      return true;
    };
    if (header.admission != de::SnapshotAdmission::kNone && !merge_ && !verify_only_) {
      fresh_.ClearAdmission();
    }
    de::SnapshotReader::AdmissionRecords admission;
    auto pending = [&](auto key, uint32_t count) {
      if (verify_only_ || !read_admission) return true;
      if (num_shards_ > 1 && de::ShardOf(key, num_shards_) != shard_index_) return true;
      fresh_.RestorePending(key, count);
      return true;
    };
    admission.sketch = [&](uint64_t first, const uint32_t* counters, size_t n) {
      if (!verify_only_ && read_admission) {
        fresh_.RestoreSketch(static_cast<int64_t>(header.sketch_width),
                             static_cast<int>(header.sketch_depth), first, n, counters);
      }
      return true;
    };
    if constexpr (std::is_same_v<Key, int64_t>) {
      admission.int64_pending = pending;
      problem = reader.ReadRecords(remove, put_row, nullptr, nullptr, &admission);
    } else {
      admission.string_pending = pending;
      problem = reader.ReadRecords(nullptr, nullptr, remove, put_row, &admission);
    }
    if (!too_many_rows.empty()) {
      return errors::ResourceExhausted(too_many_rows, " (restoring '", path, "')");
    }
    if (!problem.empty()) return DataLoss(path, problem, source.status());
    step_ = header.step;
    return ::tensorflow::OkStatus();
  }

  void SwapIn() {
    if (!verify_only_) SwapInRestored(table_, &fresh_);
  }
  int64_t step() const { return step_; }

 private:
  std::string Where(const std::string& path) const {
    return "dynamic embedding table '" + table_->name() + "': '" + path + "': ";
  }
  Status DataLoss(const std::string& path, const std::string& problem, const Status& io) const {
    if (!io.ok()) return errors::DataLoss(Where(path), "read failed: ", io.message());
    return errors::DataLoss(Where(path), problem);
  }
  Status CheckHeader(const std::string& path, const de::SnapshotHeader& header, int64_t position) {
    if (header.key_type != KeyTypeOf<Key>()) {
      return table_->Invalid("'", path, "' holds ",
                             header.key_type == de::SnapshotKeyType::kString ? "string" : "int64",
                             " keys, the table has ", DataTypeString(table_->key_dtype()),
                             " keys (key_dtype)");
    }
    if (static_cast<int>(header.dim) != table_->dim()) {
      return table_->Invalid("'", path, "' holds rows of dim ", header.dim, ", the table has dim ",
                             table_->dim());
    }
    // Rows not in the file would start from other values than in the table saved.
    if (static_cast<int>(header.initializer_version) != table_->initializer().version) {
      return table_->Invalid("'", path, "' was saved from a table of initializer version ",
                             header.initializer_version, ", the table has version ",
                             table_->initializer().version,
                             " (a table keeps its initializer version for life)");
    }
    if (position == 0) {
      if (header.kind != de::SnapshotKind::kFull) {
        return table_->Invalid("delta chain out of order: '", path, "' is a delta (number ",
                               header.sequence, " of chain ", header.chain_id,
                               "), a chain must start with a full snapshot");
      }
      chain_id_ = header.chain_id;
      return ::tensorflow::OkStatus();
    }
    if (header.kind != de::SnapshotKind::kDelta || header.chain_id != chain_id_ ||
        header.sequence != static_cast<uint64_t>(position)) {
      return table_->Invalid(
          "delta chain out of order: '", path, "' is ",
          header.kind == de::SnapshotKind::kFull ? "a full snapshot" : "delta number ",
          header.kind == de::SnapshotKind::kFull ? "" : std::to_string(header.sequence),
          " of chain ", header.chain_id, ", expected delta number ", position, " of chain ",
          chain_id_);
    }
    return ::tensorflow::OkStatus();
  }

  DynamicTable* table_;
  de::EmbeddingTable<Key> fresh_;
  const int num_shards_;
  const int shard_index_;
  const bool merge_;
  const bool verify_only_;
  uint64_t chain_id_ = 0;
  int64_t step_ = 0;
};

// Reads snapshot chains (each a full snapshot, then its deltas) into the table, keeping the rows
// of shard `shard_index` of `num_shards`. Several chains (saved by the parts of a table split
// across ranks, whose ids are disjoint) merge; each one's admission state is its last file's,
// since every file holds the whole state at its save.
template <typename Key>
Status LoadChains(DynamicTable* table, const std::vector<std::vector<std::string>>& chains,
                  int num_shards, int shard_index, bool verify_only, int64_t* step) {
  const bool merge = chains.size() > 1;
  ChainLoader<Key> loader(table, num_shards, shard_index, merge, verify_only);
  for (const std::vector<std::string>& chain : chains) {
    for (size_t i = 0; i < chain.size(); ++i) {
      TF_RETURN_IF_ERROR(loader.Load(chain[i], i, !merge || i + 1 == chain.size()));
    }
  }
  loader.SwapIn();
  *step = loader.step();
  return ::tensorflow::OkStatus();
}

Status LoadChains(DynamicTable* table, const std::vector<std::vector<std::string>>& chains,
                  int num_shards, int shard_index, bool verify_only, int64_t* step) {
  return table->key_dtype() == ::tensorflow::DT_STRING
             ? LoadChains<std::string>(table, chains, num_shards, shard_index, verify_only, step)
             : LoadChains<int64_t>(table, chains, num_shards, shard_index, verify_only, step);
}

// Reads full snapshots (one, or the shards of a sharded checkpoint) into the table, keeping the
// rows of shard `shard_index` of `num_shards`.
template <typename Key>
Status LoadShards(DynamicTable* table, const std::vector<std::string>& paths, int num_shards,
                  int shard_index, bool verify_only) {
  ChainLoader<Key> loader(table, num_shards, shard_index, /*merge=*/true, verify_only);
  for (const std::string& path : paths) TF_RETURN_IF_ERROR(loader.Load(path, 0));
  loader.SwapIn();
  return ::tensorflow::OkStatus();
}

Status LoadShards(DynamicTable* table, const std::vector<std::string>& paths, int num_shards,
                  int shard_index, bool verify_only) {
  return table->key_dtype() == ::tensorflow::DT_STRING
             ? LoadShards<std::string>(table, paths, num_shards, shard_index, verify_only)
             : LoadShards<int64_t>(table, paths, num_shards, shard_index, verify_only);
}

// The files to read for a table's `path` in a checkpoint: the snapshot itself, or, when `path` is
// a sharded table's manifest, its shards' files (only shard `shard_index`'s when the counts match:
// TfExtShardOf is frozen, so that file holds exactly this shard's ids).
Status SnapshotFiles(const DynamicTable& table, const std::string& path, const std::string& prefix,
                     int num_shards, int shard_index, std::vector<std::string>* files) {
  Env* env = Env::Default();
  std::unique_ptr<RandomAccessFile> file;
  TF_RETURN_IF_ERROR(env->NewRandomAccessFile(path, &file));
  std::string head(de::kShardManifestHeader.size(), '\0');
  ::tensorflow::StringPiece read;
  // A short read (OutOfRange) is a file too small to be a manifest: read on as a snapshot.
  file->Read(0, head.size(), &read, head.data()).IgnoreError();
  if (!de::IsShardManifest(std::string_view(read.data(), read.size()))) {
    *files = {path};
    return ::tensorflow::OkStatus();
  }
  std::string manifest;
  TF_RETURN_IF_ERROR(::tensorflow::ReadFileToString(env, path, &manifest));
  std::vector<std::string> suffixes;
  const std::string problem = de::ParseShardManifest(manifest, &suffixes);
  if (!problem.empty()) {
    return errors::DataLoss("dynamic embedding table '", table.name(), "': '", path,
                            "': ", problem);
  }
  if (static_cast<int>(suffixes.size()) == num_shards) {
    *files = {de::ShardFilePath(prefix, suffixes[shard_index])};
    return ::tensorflow::OkStatus();
  }
  files->clear();
  for (const std::string& suffix : suffixes) files->push_back(de::ShardFilePath(prefix, suffix));
  return ::tensorflow::OkStatus();
}

// Reads snapshot files in order into a new GPU table of the table's options, and swaps it in only
// once every file read cleanly (with verify_only, never): a chain (a full snapshot, then deltas),
// or with `merge` the full snapshots of a table's shards, whose admission sketches merge. *step:
// the last file's step.
Status LoadIntoDevice(OpKernelContext* ctx, DynamicTable* table,
                      const std::vector<std::string>& paths, bool merge, bool verify_only,
                      int64_t* step) {
  std::string error;
  std::unique_ptr<de::DeviceTable> fresh = table->device_table()->NewEmpty(&error);
  if (fresh == nullptr) return DynamicTable::FromCore(error);
  const cudaStream_t stream = StreamOf(ctx);
  for (const std::string& path : paths) {
    std::unique_ptr<RandomAccessFile> file;
    TF_RETURN_IF_ERROR(Env::Default()->NewRandomAccessFile(path, &file));
    FileSource source(file.get());
    de::SnapshotHeader header;
    const std::string problem = de::ReadDeviceSnapshot(&source, *fresh, stream, &header, merge);
    TF_RETURN_IF_ERROR(source.status());
    if (!problem.empty()) {
      return errors::DataLoss("dynamic embedding table '", table->name(), "': '", path,
                              "': ", problem);
    }
    *step = header.step;
  }
  if (verify_only) return ::tensorflow::OkStatus();
  return DynamicTable::FromCore(table->device_table()->SwapContents(*fresh));
}

class RestoreSnapshotsOp : public TableKernel {
 public:
  explicit RestoreSnapshotsOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("track", &track_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("verify_only", &verify_only_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_index", &shard_index_));
    OP_REQUIRES(
        ctx,
        num_shards_ >= 1 && num_shards_ <= de::kMaxShards && shard_index_ >= 0 &&
            shard_index_ < num_shards_,
        errors::InvalidArgument("TfExtTableRestoreSnapshots: shard_index ", shard_index_,
                                " of num_shards ", num_shards_, " (at most ", de::kMaxShards, ")"));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    const auto flat = ctx->input(1).flat<tstring>();
    OP_REQUIRES(ctx, flat.size() > 0, table->Invalid("restore: paths is empty"));
    // An empty path separates chains.
    std::vector<std::vector<std::string>> chains(1);
    for (int64_t i = 0; i < flat.size(); ++i) {
      if (flat(i).empty()) {
        chains.emplace_back();
      } else {
        chains.back().emplace_back(flat(i));
      }
    }
    for (const std::vector<std::string>& chain : chains) {
      OP_REQUIRES(ctx, !chain.empty(), table->Invalid("restore: paths holds an empty chain"));
    }
    int64_t step = 0;
    if (table->on_gpu()) {
      OP_REQUIRES(ctx, chains.size() == 1 && num_shards_ == 1,
                  table->Invalid("a table in GPU memory restores one chain whole, not the "
                                 "chains of a table split across another number of ranks"));
      OP_REQUIRES_OK(
          ctx, LoadIntoDevice(ctx, table.get(), chains[0], /*merge=*/false, verify_only_, &step));
    } else {
      OP_REQUIRES_OK(
          ctx, LoadChains(table.get(), chains, num_shards_, shard_index_, verify_only_, &step));
    }
    int64_t version = -1;
    if (track_ && !verify_only_) {
      version = table->on_gpu() ? table->device_table()->MarkSnapshotBase(StreamOf(ctx))
                : table->key_dtype() == ::tensorflow::DT_STRING
                    ? table->table<std::string>()->MarkSnapshotBase()
                    : table->table<int64_t>()->MarkSnapshotBase();
    }
    OP_REQUIRES_OK(ctx, SetScalarOutputs(ctx, {version, step}));
  }

 private:
  bool track_;
  bool verify_only_;
  int num_shards_;
  int shard_index_;
};

class RestoreCheckpointOp : public TableKernel {
 public:
  explicit RestoreCheckpointOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_index", &shard_index_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("verify_only", &verify_only_));
    OP_REQUIRES(
        ctx, num_shards_ <= de::kMaxShards && shard_index_ < num_shards_,
        errors::InvalidArgument("TfExtTableRestoreCheckpoint: shard_index ", shard_index_,
                                " of num_shards ", num_shards_, " (at most ", de::kMaxShards, ")"));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx, CheckScalars(ctx, *table, {1, 2, 3}));
    const std::string path(ctx->input(1).scalar<tstring>()());
    const std::string prefix(ctx->input(2).scalar<tstring>()());
    const std::string legacy(ctx->input(3).scalar<tstring>()());
    if (Env::Default()->FileExists(path).ok()) {
      std::vector<std::string> files;
      OP_REQUIRES_OK(ctx, SnapshotFiles(*table, path, prefix, num_shards_, shard_index_, &files));
      if (table->on_gpu()) {
        OP_REQUIRES(ctx, num_shards_ == 1,
                    table->Invalid("a table in GPU memory restores whole (num_shards=1), not as "
                                   "shard ",
                                   shard_index_, " of ", num_shards_));
        int64_t step = 0;
        OP_REQUIRES_OK(
            ctx, LoadIntoDevice(ctx, table.get(), files, /*merge=*/true, verify_only_, &step));
        return;
      }
      OP_REQUIRES_OK(ctx, LoadShards(table.get(), files, num_shards_, shard_index_, verify_only_));
      return;
    }
    ::tensorflow::BundleReader bundle(Env::Default(), prefix);
    OP_REQUIRES(ctx, bundle.status().ok() && bundle.Contains(legacy + "keys"),
                errors::NotFound("dynamic embedding table '", table->name(), "': checkpoint '",
                                 prefix, "' has no snapshot file '", path,
                                 "' (copy every file of the checkpoint: <prefix>.*)"));
    OP_REQUIRES(ctx, !table->on_gpu(),
                table->Invalid("checkpoint '", prefix,
                               "' is a tf_ext 0.1 checkpoint, which restores into a table in host "
                               "memory only"));
    // 0.1 checkpoints predate sharding: their tensors are imported whole, unfiltered.
    OP_REQUIRES(ctx, num_shards_ == 1,
                table->Invalid("checkpoint '", prefix,
                               "' is a tf_ext 0.1 checkpoint, which restores into a table of one "
                               "shard only: restore it into num_shards=None, save, then restore "
                               "that checkpoint into the sharded table"));
    static const char* const kSuffixes[] = {"keys",          "values",     "slots",
                                            "update_counts", "last_steps", "slot_initial_values"};
    Tensor tensors[6];
    for (int i = 0; i < 6; ++i) {
      const std::string name = legacy + kSuffixes[i];
      DataType dtype;
      TensorShape shape;
      OP_REQUIRES_OK(ctx, bundle.LookupDtypeAndShape(name, &dtype, &shape));
      OP_REQUIRES(ctx, i != 0 || dtype == table->key_dtype(),
                  table->Invalid("checkpoint '", prefix, "' holds ", DataTypeString(dtype),
                                 " keys, the table has ", DataTypeString(table->key_dtype()),
                                 " keys (key_dtype)"));
      // Verifying reads no 0.1 tensor (whole, it would double the memory of the restore).
      if (verify_only_) continue;
      tensors[i] = Tensor(dtype, shape);
      OP_REQUIRES_OK(ctx, bundle.Lookup(name, &tensors[i]));
    }
    if (verify_only_) return;
    Status status = table->key_dtype() == ::tensorflow::DT_STRING
                        ? ImportTensors<std::string>(ctx, table.get(), tensors[0], tensors[1],
                                                     tensors[2], tensors[3], tensors[4], tensors[5])
                        : ImportTensors<int64_t>(ctx, table.get(), tensors[0], tensors[1],
                                                 tensors[2], tensors[3], tensors[4], tensors[5]);
    OP_REQUIRES_OK(ctx, status);
  }

 private:
  int num_shards_;
  int shard_index_;
  bool verify_only_;
};

// Writes the table's ids and rows as slices of two bundle tensors, a chunk at a time (the op's
// doc says why: a serving export needs no copy of the table).
class WriteServingBundleOp : public TableKernel {
 public:
  explicit WriteServingBundleOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk_rows", &chunk_rows_));
  }

  void Compute(OpKernelContext* ctx) override {
    TF_EXT_GET_TABLE(ctx, table);
    OP_REQUIRES_OK(ctx, CheckScalars(ctx, *table, {1, 2, 3, 4, 5}));
    OP_REQUIRES(ctx, !table->on_gpu(),
                errors::Unimplemented("dynamic embedding table '", table->name(),
                                      "': a GPU table is exported whole, not streamed"));
    // RestoreV2 reads a string tensor written in slices back wrong, so string ids go whole.
    OP_REQUIRES(ctx, table->key_dtype() == ::tensorflow::DT_INT64,
                errors::Unimplemented("dynamic embedding table '", table->name(),
                                      "': a table of string ids is exported whole, not streamed "
                                      "(TensorFlow cannot restore string tensors written in "
                                      "slices)"));
    Write(ctx, *table);
  }

 private:
  void Write(OpKernelContext* ctx, DynamicTable& table) {
    const std::string prefix(ctx->input(1).scalar<tstring>()());
    const std::string keys_name(ctx->input(2).scalar<tstring>()());
    const std::string values_name(ctx->input(3).scalar<tstring>()());
    const int64_t first_row = ScalarInput(ctx, 4);
    int64_t total_rows = ScalarInput(ctx, 5);
    const int64_t dim = table.dim();
    OP_REQUIRES(ctx, first_row >= 0, table.Invalid("first_row must be >= 0, got ", first_row));
    ::tensorflow::BundleWriter writer(Env::Default(), prefix);
    OP_REQUIRES_OK(ctx, writer.status());
    Tensor keys(table.key_dtype(), TensorShape({chunk_rows_}));
    Tensor values(::tensorflow::DT_FLOAT, TensorShape({chunk_rows_, dim}));
    int64_t filled = 0, written = 0;
    Status status;
    auto flush = [&] {
      if (filled == 0) return true;
      const int64_t start = first_row + written;
      status = writer.AddSlice(keys_name, TensorShape({total_rows}),
                               ::tensorflow::TensorSlice({{start, filled}}), keys.Slice(0, filled));
      if (status.ok()) {
        status = writer.AddSlice(values_name, TensorShape({total_rows, dim}),
                                 ::tensorflow::TensorSlice({{start, filled}, {0, dim}}),
                                 values.Slice(0, filled));
      }
      written += filled;
      filled = 0;
      return status.ok();
    };
    de::EmbeddingTable<int64_t>* core = table.table<int64_t>();
    const int64_t version = core->Snapshot(
        de::EmbeddingTable<int64_t>::kFullSnapshot,
        [&](int64_t rows, int64_t) {  // the rows at the snapshot's instant: they stay stable
          if (total_rows < 0) total_rows = first_row + rows;
          if (first_row + rows <= total_rows) return true;
          status =
              errors::FailedPrecondition("dynamic embedding table '", table.name(), "': ", rows,
                                         " rows do not fit the serving export's rows [", first_row,
                                         ", ", total_rows, ") (the table grew during the export)");
          return false;
        },
        [&](const int64_t& key, const de::RowRef& row) {
          keys.flat<int64_t>()(filled) = key;
          std::memcpy(values.flat<float>().data() + filled * dim, row.embedding,
                      sizeof(float) * dim);
          return ++filled < chunk_rows_ || flush();
        },
        [](const int64_t&) { return true; }, /*track=*/false);
    if (version >= 0) flush();
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES(ctx, version >= 0,
                errors::Internal("dynamic embedding table '", table.name(),
                                 "': the walk stopped while writing ", prefix));
    if (total_rows == 0) {  // no slice to write: the tensors whole, empty
      OP_REQUIRES_OK(ctx, writer.Add(keys_name, Tensor(table.key_dtype(), TensorShape({0}))));
      OP_REQUIRES_OK(
          ctx, writer.Add(values_name, Tensor(::tensorflow::DT_FLOAT, TensorShape({0, dim}))));
    }
    OP_REQUIRES_OK(ctx, writer.Finish());
    OP_REQUIRES_OK(ctx, SetScalarOutputs(ctx, {written}));
  }

  int64_t chunk_rows_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtTableSaveSnapshot").Device(DEVICE_CPU), SaveSnapshotOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableRestoreSnapshots").Device(DEVICE_CPU), RestoreSnapshotsOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableRestoreCheckpoint").Device(DEVICE_CPU),
                        RestoreCheckpointOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableWriteServingBundle").Device(DEVICE_CPU),
                        WriteServingBundleOp);

// The GPU kernels (RegisterGpuKernel: table_kernel.h): paths, scalars and outputs in host memory;
// the rows stream through pinned memory (device_snapshot_file.h).
using ::tensorflow::KernelDefBuilder;
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableSaveSnapshot")
                               .HostMemory("path")
                               .HostMemory("since_version")
                               .HostMemory("chain_id")
                               .HostMemory("sequence")
                               .HostMemory("step")
                               .HostMemory("version")
                               .HostMemory("rows")
                               .HostMemory("tombstones")
                               .HostMemory("bytes")
                               .HostMemory("slot_initial_values"),
                           SaveSnapshotOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableRestoreSnapshots")
                               .HostMemory("paths")
                               .HostMemory("version")
                               .HostMemory("step"),
                           RestoreSnapshotsOp)
TF_EXT_REGISTER_GPU_KERNEL(KernelDefBuilder("TfExtTableRestoreCheckpoint")
                               .HostMemory("snapshot_path")
                               .HostMemory("checkpoint_prefix")
                               .HostMemory("legacy_tensor_prefix"),
                           RestoreCheckpointOp)

}  // namespace
}  // namespace tf_ext
