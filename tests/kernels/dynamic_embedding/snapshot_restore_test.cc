// The restore rules written once (core/snapshot_restore.h), through each storage's sink: the CPU
// table (EmbeddingTableSink) and the GPU table's algorithm on host threads (DeviceTableSink over
// MakeEmulatedGpuTable). The same files must give the same rows and the same errors in both.
#include "kernels/dynamic_embedding/core/snapshot_restore.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/embedding_table_sink.h"
#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/sharding.h"
#include "tests/kernels/dynamic_embedding/snapshot_images.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

namespace tf_ext {
namespace de {
namespace {

constexpr int kDim = 4;
using Code = TableError::Code;

// A snapshot of `table` (string_bytes.h's Write); *version: its version.
std::string Save(EmbeddingTable<int64_t>& table, int64_t since, uint64_t sequence,
                 int64_t* version) {
  std::string bytes;
  *version =
      Write(table, since < 0 ? EmbeddingTable<int64_t>::kFullSnapshot : since, sequence, &bytes);
  return bytes;
}

void Put(EmbeddingTable<int64_t>& table, int64_t key, float value) {
  table.Upsert(key, [&](RowRef& row, bool) {
    for (int j = 0; j < kDim; ++j) row.embedding[j] = value + j;
    *row.update_count = 3;
    *row.last_step = 9;
  });
}

// A chain of three files: rows 0..99, then 100..119 added and 0..9 removed, then 50 rewritten.
struct Chain {
  std::map<std::string, std::string> files;  // path -> bytes
  std::map<int64_t, float> rows;             // what the chain restores: key -> first value
};

Chain MakeChain() {
  Chain chain;
  EmbeddingTable<int64_t> table(kDim, InitializerSpec());
  for (int64_t k = 0; k < 100; ++k) Put(table, k, static_cast<float>(k));
  int64_t version;
  chain.files["full"] = Save(table, -1, 0, &version);
  for (int64_t k = 100; k < 120; ++k) Put(table, k, static_cast<float>(k));
  for (int64_t k = 0; k < 10; ++k) table.Remove(k);
  chain.files["delta1"] = Save(table, version, 1, &version);
  Put(table, 50, 500.0f);
  chain.files["delta2"] = Save(table, version, 2, &version);
  for (int64_t k = 10; k < 120; ++k) chain.rows[k] = static_cast<float>(k);
  chain.rows[50] = 500.0f;
  return chain;
}

// A new, empty table of one storage, and its restore sink.
class Target {
 public:
  virtual ~Target() = default;
  virtual RestoreSink<int64_t>* sink() = 0;
  virtual int64_t Size() = 0;
  // The first embedding value of key's row; false when the key has none.
  virtual bool First(int64_t key, float* value) = 0;
};

class CpuTarget : public Target {
 public:
  explicit CpuTarget(int64_t max_rows)
      : table_(kDim, InitializerSpec()), sink_("t", &table_, max_rows) {}
  RestoreSink<int64_t>* sink() override { return &sink_; }
  int64_t Size() override { return table_.Size(); }
  bool First(int64_t key, float* value) override {
    float row[kDim];
    if (!table_.Contains(key)) return false;
    table_.Find(key, row);
    *value = row[0];
    return true;
  }

 private:
  EmbeddingTable<int64_t> table_;
  EmbeddingTableSink<int64_t> sink_;
};

class EmulatedGpuTarget : public Target {
 public:
  explicit EmulatedGpuTarget(int64_t max_rows) {
    DeviceTableOptions options;
    options.name = "t";
    options.dim = kDim;
    options.max_rows = max_rows;
    std::string error;
    table_ = MakeEmulatedGpuTable(options, &error);
    EXPECT_EQ(error, "");
    sink_ = std::make_unique<DeviceTableSink>(table_.get(), nullptr);
  }
  RestoreSink<int64_t>* sink() override { return sink_.get(); }
  int64_t Size() override { return table_->Size(nullptr); }
  bool First(int64_t key, float* value) override {
    float row[kDim];
    bool found = false;
    EXPECT_EQ(table_->Find(nullptr, 1, &key, row, &found), "");
    *value = row[0];
    return found;
  }

 private:
  std::unique_ptr<DeviceTable> table_;
  std::unique_ptr<DeviceTableSink> sink_;
};

class SnapshotRestoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Target> NewTarget(int64_t max_rows = kMaxTableRows) {
    if (GetParam() == "cpu") return std::make_unique<CpuTarget>(max_rows);
    return std::make_unique<EmulatedGpuTarget>(max_rows);
  }
  static RestoreOptions Options() {
    RestoreOptions options;
    options.table_name = "t";
    options.dim = kDim;
    return options;
  }
  // Opens the files of `files` by name; any other path is not there.
  static OpenSnapshot Opener(const std::map<std::string, std::string>& files) {
    return [&files](const std::string& path, OpenedSnapshot* opened) {
      const auto it = files.find(path);
      if (it == files.end()) return TableError::NotFound("no such file");
      opened->source = std::make_unique<StringSource>(it->second);
      return TableError::Ok();
    };
  }
};

TEST_P(SnapshotRestoreTest, AChainRestoresItsLastStateWithRemovalsAndTheLastStep) {
  const Chain chain = MakeChain();
  auto target = NewTarget();
  int64_t step = 0;
  SnapshotHeader last;
  const TableError error = RestoreChains<int64_t>(
      Options(), {{"full", "delta1", "delta2"}}, Opener(chain.files), target->sink(), &step, &last);
  ASSERT_TRUE(error.ok()) << error.message();
  EXPECT_EQ(step, 102);  // the last file's
  EXPECT_EQ(last.sequence, 2u);
  EXPECT_EQ(target->Size(), static_cast<int64_t>(chain.rows.size()));
  for (const auto& [key, value] : chain.rows) {
    float got = -1;
    ASSERT_TRUE(target->First(key, &got)) << key;
    EXPECT_EQ(got, value) << key;
  }
  float unused;
  EXPECT_FALSE(target->First(3, &unused));  // removed by the first delta
}

TEST_P(SnapshotRestoreTest, AChainOutOfOrderIsRefusedNamingTheFileAndTheExpectedDelta) {
  const Chain chain = MakeChain();
  int64_t step;
  TableError error = RestoreChains<int64_t>(Options(), {{"full", "delta2"}}, Opener(chain.files),
                                            NewTarget()->sink(), &step);
  EXPECT_EQ(error.code(), Code::kInvalidArgument);
  EXPECT_NE(error.message().find("delta chain out of order: 'delta2' is delta number 2 of chain "
                                 "42, expected delta number 1"),
            std::string::npos)
      << error.message();
  error = RestoreChains<int64_t>(Options(), {{"delta1"}}, Opener(chain.files), NewTarget()->sink(),
                                 &step);
  EXPECT_EQ(error.code(), Code::kInvalidArgument);
  EXPECT_NE(error.message().find("a chain must start with a full snapshot"), std::string::npos);
}

TEST_P(SnapshotRestoreTest, FilesOfAnotherDimOrInitializerVersionAreRefused) {
  const Chain chain = MakeChain();
  int64_t step;
  RestoreOptions wide = Options();
  wide.dim = kDim + 1;
  auto target = NewTarget();
  TableError error =
      RestoreChains<int64_t>(wide, {{"full"}}, Opener(chain.files), target->sink(), &step);
  EXPECT_EQ(error.code(), Code::kInvalidArgument);
  EXPECT_NE(error.message().find("'full' holds rows of dim 4, the table has dim 5"),
            std::string::npos);
  RestoreOptions other_version = Options();
  other_version.initializer_version = 2;
  error =
      RestoreChains<int64_t>(other_version, {{"full"}}, Opener(chain.files), target->sink(), &step);
  EXPECT_EQ(error.code(), Code::kInvalidArgument);
  EXPECT_NE(error.message().find("a table keeps its initializer version for life"),
            std::string::npos);
  EXPECT_EQ(target->Size(), 0);
}

TEST_P(SnapshotRestoreTest, AShardKeepsOnlyItsOwnIds) {
  const Chain chain = MakeChain();
  RestoreOptions options = Options();
  options.num_shards = 2;
  options.shard_index = 1;
  auto target = NewTarget();
  int64_t step;
  ASSERT_TRUE(RestoreChains<int64_t>(options, {{"full", "delta1", "delta2"}}, Opener(chain.files),
                                     target->sink(), &step)
                  .ok());
  int64_t mine = 0;
  for (const auto& [key, value] : chain.rows) {
    float got;
    const bool kept = target->First(key, &got);
    EXPECT_EQ(kept, ShardOf(key, 2) == 1) << key;
    if (kept) {
      EXPECT_EQ(got, value);
    }
    mine += kept;
  }
  EXPECT_EQ(target->Size(), mine);
  EXPECT_GT(mine, 0);
}

TEST_P(SnapshotRestoreTest, ChainsOfDisjointIdsMergeIntoOneTable) {
  Chain first = MakeChain();
  EmbeddingTable<int64_t> other(kDim, InitializerSpec());
  for (int64_t k = 1000; k < 1050; ++k) Put(other, k, static_cast<float>(k));
  int64_t version;
  first.files["other"] = Save(other, -1, 0, &version);
  auto target = NewTarget();
  int64_t step;
  ASSERT_TRUE(RestoreChains<int64_t>(Options(), {{"full", "delta1", "delta2"}, {"other"}},
                                     Opener(first.files), target->sink(), &step)
                  .ok());
  EXPECT_EQ(target->Size(), static_cast<int64_t>(first.rows.size()) + 50);
  EXPECT_EQ(step, 100);  // the last chain's file
}

TEST_P(SnapshotRestoreTest, VerifyingReadsEveryFileAndWritesNothing) {
  Chain chain = MakeChain();
  RestoreOptions verify = Options();
  verify.verify_only = true;
  auto target = NewTarget();
  int64_t step;
  ASSERT_TRUE(RestoreChains<int64_t>(verify, {{"full", "delta1", "delta2"}}, Opener(chain.files),
                                     target->sink(), &step)
                  .ok());
  EXPECT_EQ(target->Size(), 0);
  chain.files["delta2"][chain.files["delta2"].size() / 2] ^= 0x40;
  const TableError error = RestoreChains<int64_t>(verify, {{"full", "delta1", "delta2"}},
                                                  Opener(chain.files), target->sink(), &step);
  EXPECT_EQ(error.code(), Code::kDataLoss) << error.message();
  EXPECT_NE(error.message().find("'delta2'"), std::string::npos);
}

TEST_P(SnapshotRestoreTest, RowsPastTheTableLimitAreRefused) {
  const Chain chain = MakeChain();
  int64_t step;
  RestoreOptions small = Options();
  small.max_rows = 50;
  TableError error =
      RestoreChains<int64_t>(small, {{"full"}}, Opener(chain.files), NewTarget(50)->sink(), &step);
  EXPECT_EQ(error.code(), Code::kResourceExhausted);
  EXPECT_NE(error.message().find("('full' holds them)"), std::string::npos) << error.message();
  // A shard checks row by row, since it keeps only some of a file's rows.
  small.num_shards = 2;
  error =
      RestoreChains<int64_t>(small, {{"full"}}, Opener(chain.files), NewTarget(10)->sink(), &step);
  EXPECT_EQ(error.code(), Code::kResourceExhausted);
  EXPECT_NE(error.message().find("(restoring 'full')"), std::string::npos) << error.message();
}

TEST_P(SnapshotRestoreTest, AMissingFileIsNotFound) {
  int64_t step;
  const std::map<std::string, std::string> none;
  const TableError error =
      RestoreChains<int64_t>(Options(), {{"gone"}}, Opener(none), NewTarget()->sink(), &step);
  EXPECT_EQ(error.code(), Code::kNotFound);
  EXPECT_NE(error.message().find("'gone': cannot open the snapshot file: no such file"),
            std::string::npos)
      << error.message();
}

INSTANTIATE_TEST_SUITE_P(EveryStorage, SnapshotRestoreTest,
                         ::testing::Values("cpu", "emulated_gpu"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace de
}  // namespace tf_ext
