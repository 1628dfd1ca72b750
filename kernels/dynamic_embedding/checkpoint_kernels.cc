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

// A FileSource that owns its file.
class OwnedFileSource : public FileSource {
 public:
  explicit OwnedFileSource(std::unique_ptr<RandomAccessFile> file)
      : FileSource(file.get()), file_(std::move(file)) {}

 private:
  std::unique_ptr<RandomAccessFile> file_;
};

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
    const std::string path(ctx->input(1).scalar<tstring>()());
    const int64_t since = ScalarInput(ctx, 2);
    const cudaStream_t stream = StreamOf(ctx);
    de::SnapshotHeader header = HeaderOf(ctx, *table);
    Status written;
    int64_t version = -1, bytes = 0;
    const Status status = WriteFileInPlace(path, &bytes, [&](FileSink* sink) {
      written =
          table->backend()->WriteSnapshot(stream, path, since, track_, &header, sink, &version);
      return written.ok();
    });
    // A delta without its base says so first; then the file's errors, then the table's.
    if (version == de::DeviceSnapshotPlan::kNoDeltaBase) OP_REQUIRES_OK(ctx, written);
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES_OK(ctx, written);
    if (track_) OP_REQUIRES_OK(ctx, table->backend()->CommitSnapshot(stream, version));
    SetOutputs(ctx, version, header, bytes);
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

  bool track_;
};

// A snapshot file through TensorFlow's file systems, for the core's restore.
de::TableError OpenSnapshotFile(const std::string& path, de::OpenedSnapshot* opened) {
  std::unique_ptr<RandomAccessFile> file;
  const Status status = Env::Default()->NewRandomAccessFile(path, &file);
  if (!status.ok()) return de::TableError::NotFound(std::string(status.message()));
  auto source = std::make_unique<OwnedFileSource>(std::move(file));
  OwnedFileSource* reader = source.get();
  opened->io_error = [reader] { return std::string(reader->status().message()); };
  opened->source = std::move(source);
  return de::TableError::Ok();
}

// Reads snapshot chains (each a full snapshot, then its deltas; or single full snapshots, the
// shards of a sharded checkpoint) into the table by the core's rules (core/snapshot_restore.h),
// keeping the rows of shard `shard_index` of `num_shards`.
template <typename Key>
Status Restore(OpKernelContext* ctx, DynamicTable* table,
               const std::vector<std::vector<std::string>>& chains, int num_shards, int shard_index,
               bool verify_only, int64_t* step) {
  de::RestoreOptions options;
  options.table_name = table->name();
  options.dim = table->dim();
  options.initializer_version = table->initializer().version;
  options.max_rows = table->max_rows();
  options.num_shards = num_shards;
  options.shard_index = shard_index;
  options.verify_only = verify_only;
  return table->template backend<Key>()->Restore(ctx, options, chains, OpenSnapshotFile, step);
}

Status Restore(OpKernelContext* ctx, DynamicTable* table,
               const std::vector<std::vector<std::string>>& chains, int num_shards, int shard_index,
               bool verify_only, int64_t* step) {
  return table->key_dtype() == ::tensorflow::DT_STRING
             ? Restore<std::string>(ctx, table, chains, num_shards, shard_index, verify_only, step)
             : Restore<int64_t>(ctx, table, chains, num_shards, shard_index, verify_only, step);
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
    OP_REQUIRES_OK(
        ctx, Restore(ctx, table.get(), chains, num_shards_, shard_index_, verify_only_, &step));
    int64_t version = -1;
    if (track_ && !verify_only_) version = table->backend()->MarkSnapshotBase(StreamOf(ctx));
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
      // Each shard's file is a chain of its own: they merge.
      std::vector<std::vector<std::string>> chains;
      for (const std::string& file : files) chains.push_back({file});
      int64_t step = 0;
      OP_REQUIRES_OK(
          ctx, Restore(ctx, table.get(), chains, num_shards_, shard_index_, verify_only_, &step));
      return;
    }
    ::tensorflow::BundleReader bundle(Env::Default(), prefix);
    OP_REQUIRES(ctx, bundle.status().ok() && bundle.Contains(legacy + "keys"),
                errors::NotFound("dynamic embedding table '", table->name(), "': checkpoint '",
                                 prefix, "' has no snapshot file '", path,
                                 "' (copy every file of the checkpoint: <prefix>.*)"));
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
