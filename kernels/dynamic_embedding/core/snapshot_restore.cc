#include "kernels/dynamic_embedding/core/snapshot_restore.h"

#include <type_traits>
#include <utility>

#include "kernels/dynamic_embedding/core/sharding.h"
#include "kernels/dynamic_embedding/core/table_policies.h"

namespace tf_ext {
namespace de {
namespace {

template <typename Key>
constexpr SnapshotKeyType KeyTypeOf() {
  return std::is_same_v<Key, std::string> ? SnapshotKeyType::kString : SnapshotKeyType::kInt64;
}

const char* KeyTypeName(SnapshotKeyType type) {
  return type == SnapshotKeyType::kString ? "string" : "int64";
}

// Reads the files of chains, one at a time, into the sink.
template <typename Key>
class ChainLoader {
 public:
  using KeyView = typename RestoreKey<Key>::View;
  ChainLoader(const RestoreOptions& options, bool merge, RestoreSink<Key>* sink)
      : options_(options), merge_(merge), sink_(sink) {}

  // Reads one file of a chain; `position` is its index in the chain. Without `read_admission`
  // the file's admission state is skipped.
  TableError Load(const std::string& path, int64_t position, bool read_admission,
                  const OpenSnapshot& open) {
    OpenedSnapshot opened;
    const TableError not_opened = open(path, &opened);
    if (!not_opened.ok()) {
      return TableError::NotFound(Where(path) +
                                  "cannot open the snapshot file: " + not_opened.message());
    }
    SnapshotReader reader(opened.source.get());
    SnapshotHeader header;
    std::string problem = reader.ReadHeader(&header);
    if (!problem.empty()) return DataLoss(path, problem, opened);
    TableError error = CheckHeader(path, header, position);
    if (!error.ok()) return error;
    // A file's rows are distinct ids: unless a shard keeps only some, so many rows would pass
    // the table's limit, and are refused before any is read.
    if (options_.num_shards == 1 && header.rows > static_cast<uint64_t>(options_.max_rows)) {
      return TableError::OverLimit(CheckTableRows(options_.table_name, 0,
                                                  static_cast<int64_t>(header.rows),
                                                  options_.max_rows) +
                                   " ('" + path + "' holds them)");
    }
    // Merged parts may differ in slots (a part that no optimizer updated has none): rows of a
    // file with fewer keep the initial values of the others.
    if (header.num_slots > kMaxSlots ||
        (!merge_ && static_cast<int>(header.num_slots) < sink_->num_slots())) {
      return DataLoss(path,
                      "it has " + std::to_string(header.num_slots) +
                          " optimizer slots per row, an earlier file or this build has " +
                          std::to_string(sink_->num_slots()) + " (at most " +
                          std::to_string(kMaxSlots) + ")",
                      OpenedSnapshot());
    }
    const bool write = !options_.verify_only;
    if (write && static_cast<int>(header.num_slots) > sink_->num_slots()) {
      error = sink_->EnsureSlots(static_cast<int>(header.num_slots), header.slot_initial_values);
      if (!error.ok()) return error;
    }
    if (write && header.admission != SnapshotAdmission::kNone && !merge_) {
      error = sink_->ClearAdmission();
      if (!error.ok()) return error;
    }
    // The sink's first error stops the read; the file's own problems come from the reader.
    TableError sink_error;
    auto keep = [&](TableError result) {
      sink_error = std::move(result);
      return sink_error.ok();
    };
    const int file_slots = static_cast<int>(header.num_slots);
    auto put_row = [&](KeyView key, uint32_t count, int64_t last_step, const float* values) {
      if (!write || !Mine(key)) return true;
      return keep(sink_->PutRow(key, count, last_step, values, file_slots));
    };
    auto remove = [&](KeyView key) { return !write || keep(sink_->Remove(key)); };
    auto pending = [&](KeyView key, uint32_t count) {
      if (!write || !read_admission || !Mine(key)) return true;
      return keep(sink_->RestorePending(key, count));
    };
    SnapshotReader::AdmissionRecords admission;
    admission.sketch = [&](uint64_t first, const uint32_t* counters, size_t n) {
      if (!write || !read_admission) return true;
      return keep(sink_->RestoreSketch(header.sketch_width, static_cast<int>(header.sketch_depth),
                                       first, n, counters));
    };
    if constexpr (std::is_same_v<Key, int64_t>) {
      admission.int64_pending = pending;
      problem = reader.ReadRecords(remove, put_row, nullptr, nullptr, &admission);
    } else {
      admission.string_pending = pending;
      problem = reader.ReadRecords(nullptr, nullptr, remove, put_row, &admission);
    }
    // What the sink staged of this file goes in now, so that its errors name the file.
    if (problem.empty() && write && sink_error.ok()) keep(sink_->Flush());
    if (!sink_error.ok()) {
      if (sink_error.code() != TableError::Code::kResourceExhausted) return sink_error;
      return TableError::OverLimit(sink_error.message() + " (restoring '" + path + "')");
    }
    if (!problem.empty()) return DataLoss(path, problem, opened);
    last_header_ = std::move(header);
    return TableError::Ok();
  }

  const SnapshotHeader& last_header() const { return last_header_; }

 private:
  bool Mine(KeyView key) const {
    return options_.num_shards == 1 || ShardOf(key, options_.num_shards) == options_.shard_index;
  }
  std::string Where(const std::string& path) const {
    return "dynamic embedding table '" + options_.table_name + "': '" + path + "': ";
  }
  TableError Invalid(const std::string& what) const {
    return TableError::Invalid("dynamic embedding table '" + options_.table_name + "': " + what);
  }
  TableError DataLoss(const std::string& path, const std::string& problem,
                      const OpenedSnapshot& opened) const {
    const std::string io = opened.io_error ? opened.io_error() : "";
    if (!io.empty()) return TableError::DataLoss(Where(path) + "read failed: " + io);
    return TableError::DataLoss(Where(path) + problem);
  }
  TableError CheckHeader(const std::string& path, const SnapshotHeader& header, int64_t position) {
    if (header.key_type != KeyTypeOf<Key>()) {
      return Invalid("'" + path + "' holds " + KeyTypeName(header.key_type) +
                     " keys, the table has " + KeyTypeName(KeyTypeOf<Key>()) + " keys (key_dtype)");
    }
    if (static_cast<int>(header.dim) != options_.dim) {
      return Invalid("'" + path + "' holds rows of dim " + std::to_string(header.dim) +
                     ", the table has dim " + std::to_string(options_.dim));
    }
    // Rows not in the file would start from other values than in the table saved.
    if (static_cast<int>(header.initializer_version) != options_.initializer_version) {
      return Invalid("'" + path + "' was saved from a table of initializer version " +
                     std::to_string(header.initializer_version) + ", the table has version " +
                     std::to_string(options_.initializer_version) +
                     " (a table keeps its initializer version for life)");
    }
    if (!options_.check_chain_order) return TableError::Ok();
    if (position == 0) {
      if (header.kind != SnapshotKind::kFull) {
        return Invalid("delta chain out of order: '" + path + "' is a delta (number " +
                       std::to_string(header.sequence) + " of chain " +
                       std::to_string(header.chain_id) +
                       "), a chain must start with a full snapshot");
      }
      chain_id_ = header.chain_id;
      return TableError::Ok();
    }
    if (header.kind != SnapshotKind::kDelta || header.chain_id != chain_id_ ||
        header.sequence != static_cast<uint64_t>(position)) {
      const bool full = header.kind == SnapshotKind::kFull;
      return Invalid(
          "delta chain out of order: '" + path + "' is " +
          (full ? "a full snapshot" : "delta number " + std::to_string(header.sequence)) +
          " of chain " + std::to_string(header.chain_id) + ", expected delta number " +
          std::to_string(position) + " of chain " + std::to_string(chain_id_));
    }
    return TableError::Ok();
  }

  const RestoreOptions options_;
  const bool merge_;
  RestoreSink<Key>* sink_;
  uint64_t chain_id_ = 0;
  SnapshotHeader last_header_;
};

}  // namespace

template <typename Key>
TableError RestoreChains(const RestoreOptions& options,
                         const std::vector<std::vector<std::string>>& chains,
                         const OpenSnapshot& open, RestoreSink<Key>* sink, int64_t* step,
                         SnapshotHeader* last_header) {
  const bool merge = chains.size() > 1 || options.merge_into_sink;
  ChainLoader<Key> loader(options, merge, sink);
  for (const std::vector<std::string>& chain : chains) {
    for (size_t i = 0; i < chain.size(); ++i) {
      // Each file holds the whole admission state at its save: merged chains keep their last's.
      const TableError error =
          loader.Load(chain[i], static_cast<int64_t>(i), !merge || i + 1 == chain.size(), open);
      if (!error.ok()) return error;
    }
  }
  *step = loader.last_header().step;
  if (last_header != nullptr) *last_header = loader.last_header();
  return TableError::Ok();
}

template TableError RestoreChains<int64_t>(const RestoreOptions&,
                                           const std::vector<std::vector<std::string>>&,
                                           const OpenSnapshot&, RestoreSink<int64_t>*, int64_t*,
                                           SnapshotHeader*);
template TableError RestoreChains<std::string>(const RestoreOptions&,
                                               const std::vector<std::vector<std::string>>&,
                                               const OpenSnapshot&, RestoreSink<std::string>*,
                                               int64_t*, SnapshotHeader*);

}  // namespace de
}  // namespace tf_ext
