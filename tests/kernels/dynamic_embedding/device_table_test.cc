// The GPU table core (kernels/dynamic_embedding/core/gpu/device_table.h), checked against the CPU
// table (embedding_table.h) operation by operation.
//
// Every case runs on each backend this machine has:
//   host    the GPU table's algorithm on one host thread (MakeEmulatedGpuTable): every build;
//   host4   the same on 4 threads, so that claims of one slot and counts race;
//   cuda    the CUDA table, where the build has CUDA and the machine a GPU.
// With TF_EXT_REQUIRE_GPU=1 (the GPU run: tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh)
// a missing GPU fails the run instead of leaving the cuda backend out.
//
// On the host backends the GPU table must agree with the CPU table bit for bit. On a GPU, initial
// rows must too; updates to within kGpuTolerance (relative), which covers the device's double pow
// in Adam's step size and FTRL's powf (host_device.h).
#include "kernels/dynamic_embedding/core/gpu/device_table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/gpu/device_memory.h"
#include "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h"
#include "kernels/dynamic_embedding/core/initializers.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

// BadOptionsAndExhaustedMemory asks for more memory than exists on purpose: under the sanitizers
// (make sanitize), a failed allocation must return null as malloc does, not abort the run.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }

namespace tf_ext {
namespace de {
namespace {

constexpr float kGpuTolerance = 2e-6f;

// Where a backend's tables live, and how test data gets there and back.
struct Backend {
  std::string name;
  bool on_device;
  int threads;  // host threads; on the device, GPU threads per key (0: the default)

  std::unique_ptr<DeviceTable> Make(DeviceTableOptions options, std::string* error) const {
    if (!on_device) return MakeEmulatedGpuTable(options, error, threads);
    if (threads > 0 && options.tile_lanes == 0) options.tile_lanes = threads;
    return MakeCudaTable(options, error);
  }
};

void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

std::vector<Backend> Backends() {
  std::vector<Backend> backends = {{"host", false, 1}, {"host4", false, 4}};
  std::string description;
  if (cuda::DeviceAvailable(&description)) {
    // The default tile, and the narrowest and widest: a probe window of 1 and of 32 slots.
    backends.push_back({"cuda", true, 0});
    backends.push_back({"cuda_lanes1", true, 1});
    backends.push_back({"cuda_lanes32", true, 32});
  }
  return backends;
}

// A buffer the table's calls take: device memory on the cuda backend, else host memory.
template <typename T>
class Buffer {
 public:
  Buffer(const Backend& backend, const std::vector<T>& values)
      : Buffer(backend, static_cast<int64_t>(values.size())) {
    if (!values.empty()) Upload(values);
  }
  Buffer(const Backend& backend, int64_t n) : on_device_(backend.on_device), n_(n), host_(n) {
    if (on_device_) device_ = static_cast<T*>(cuda::Alloc(sizeof(T) * std::max<int64_t>(n, 1)));
  }
  ~Buffer() {
    if (on_device_) cuda::Free(device_);
  }
  T* get() { return on_device_ ? device_ : host_.data(); }
  void Upload(const std::vector<T>& values) {
    host_ = values;
    if (on_device_) cuda::CopyToDevice(device_, host_.data(), sizeof(T) * n_);
  }
  std::vector<T> Download() {
    if (on_device_) cuda::CopyToHost(host_.data(), device_, sizeof(T) * n_);
    return host_;
  }

 private:
  bool on_device_;
  int64_t n_;
  std::vector<T> host_;
  T* device_ = nullptr;
};

// bool has no std::vector<bool> storage to hand out: found flags travel as uint8_t-sized bools.
struct Flags {
  explicit Flags(const Backend& backend, int64_t n) : bytes(backend, n) {}
  bool* get() { return reinterpret_cast<bool*>(bytes.get()); }
  std::vector<uint8_t> Download() { return bytes.Download(); }
  Buffer<uint8_t> bytes;
};

std::unique_ptr<DeviceTable> MakeOrDie(const Backend& backend, const DeviceTableOptions& options) {
  std::string error;
  auto table = backend.Make(options, &error);
  EXPECT_TRUE(table) << error;
  return table;
}

DeviceTableOptions Options(int dim, InitializerSpec init = {}) {
  DeviceTableOptions options;
  options.name = "t";
  options.dim = dim;
  options.initializer = init;
  options.initial_capacity = 64;  // small, so that the cases grow it
  return options;
}

// Each row of a table, by key: [update count, last step, row values...].
using Contents = std::map<int64_t, std::vector<double>>;

Contents ContentsOf(DeviceTable& table) {
  Contents contents;
  const int stride = table.dim() * (1 + table.num_slots());
  const std::string error = table.Export(nullptr, 1000, [&](const HostRows& rows) {
    for (int64_t i = 0; i < rows.n; ++i) {
      std::vector<double> row = {static_cast<double>(rows.update_counts[i]),
                                 static_cast<double>(rows.last_steps[i])};
      row.insert(row.end(), rows.values + i * stride, rows.values + (i + 1) * stride);
      EXPECT_TRUE(contents.emplace(rows.keys[i], row).second) << "key exported twice";
    }
    return true;
  });
  EXPECT_EQ(error, "");
  return contents;
}

Contents ContentsOf(EmbeddingTable<int64_t>& table) {
  Contents contents;
  const int stride = table.dim() * (1 + table.num_slots());
  table.Export([](int64_t) { return true; },
               [&](int64_t, const int64_t& key, const RowRef& row) {
                 std::vector<double> values = {static_cast<double>(*row.update_count),
                                               static_cast<double>(*row.last_step)};
                 values.insert(values.end(), row.embedding, row.embedding + table.dim());
                 values.insert(values.end(), row.slots, row.slots + stride - table.dim());
                 contents.emplace(key, values);
               });
  return contents;
}

void ExpectSameContents(const Contents& expected, const Contents& actual, const Backend& backend) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [key, row] : expected) {
    auto it = actual.find(key);
    ASSERT_TRUE(it != actual.end()) << "key " << key << " missing";
    ASSERT_EQ(row.size(), it->second.size());
    for (size_t j = 0; j < row.size(); ++j) {
      if (backend.on_device) {
        ASSERT_NEAR(row[j], it->second[j], kGpuTolerance * std::max(1.0, std::fabs(row[j])))
            << "key " << key << " element " << j;
      } else {
        ASSERT_EQ(row[j], it->second[j]) << "key " << key << " element " << j;
      }
    }
  }
}

std::vector<int64_t> Keys(std::mt19937_64& rng, int64_t n, int64_t range) {
  std::uniform_int_distribution<int64_t> pick(-range, range);
  std::vector<int64_t> keys(n);
  for (auto& key : keys) key = pick(rng);
  return keys;
}

// The optimizer of the cases that train with one.
OptimizerParams Adam() {
  OptimizerParams adam;
  adam.kind = OptimizerKind::kAdam;
  adam.learning_rate = 0.01f;
  adam.epsilon = 1e-7f;
  return adam;
}

class DeviceTableTest : public ::testing::TestWithParam<Backend> {};

TEST(DeviceTableBackends, GpuRunFindsTheGpu) {
  std::string description;
  const bool available = cuda::DeviceAvailable(&description);
  const char* required = std::getenv("TF_EXT_REQUIRE_GPU");
  if (required != nullptr && std::string(required) == "1") {
    ASSERT_TRUE(available) << "TF_EXT_REQUIRE_GPU=1 but: " << description;
  }
  std::printf("CUDA table built: %s; device: %s\n", CudaTableBuilt() ? "yes" : "no",
              description.c_str());
}

TEST_P(DeviceTableTest, MissingKeysReadTheCpuTablesInitialRowsBitForBit) {
  const Backend& backend = GetParam();
  std::mt19937_64 rng(1);
  std::vector<int64_t> keys = Keys(rng, 300, int64_t{1} << 62);
  keys.insert(keys.end(), {0, -1, -2, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()});
  for (InitializerKind kind : kInitializerKinds) {
    for (int dim : {1, 7, 64}) {
      for (int version = kOldestInitializerVersion; version <= kNewestInitializerVersion;
           ++version) {
        InitializerSpec init{kind, 0.5f, 1.5f, 42};
        init.version = version;
        auto table = MakeOrDie(backend, Options(dim, init));
        Buffer<int64_t> device_keys(backend, keys);
        Buffer<float> rows(backend, static_cast<int64_t>(keys.size()) * dim);
        Flags found(backend, static_cast<int64_t>(keys.size()));
        ASSERT_EQ(table->Find(nullptr, keys.size(), device_keys.get(), rows.get(), found.get()),
                  "");
        const std::vector<float> got = rows.Download();
        const std::vector<uint8_t> present = found.Download();
        std::vector<float> expected(dim);
        for (size_t i = 0; i < keys.size(); ++i) {
          EXPECT_FALSE(present[i]);
          FillInitialRow(init, InitialRowKeyHash(keys[i]), expected.data(), dim);
          ASSERT_EQ(0, std::memcmp(expected.data(), got.data() + i * dim, sizeof(float) * dim))
              << InitializerKindName(kind) << " version " << version << " dim " << dim << " key "
              << keys[i];
        }
        EXPECT_EQ(table->Size(nullptr), 0);
      }
    }
  }
}

TEST_P(DeviceTableTest, FindOrInsertCreatesEachKeyOnceAndGrowsWithoutDroppingAny) {
  const Backend& backend = GetParam();
  auto table = MakeOrDie(backend, Options(4, {InitializerKind::kUniform, -1.0f, 1.0f, 7}));
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 20000; ++k) keys.push_back(k * 7919 - 50000);
  keys.push_back(-1);  // the two keys whose bits mark free and removed slots
  keys.push_back(-2);
  std::vector<int64_t> twice = keys;
  twice.insert(twice.end(), keys.begin(), keys.end());  // every key given twice in one call
  Buffer<int64_t> device_keys(backend, twice);
  Buffer<float> rows(backend, static_cast<int64_t>(twice.size()) * 4);
  ASSERT_EQ(table->FindOrInsert(nullptr, twice.size(), device_keys.get(), rows.get()), "");
  EXPECT_EQ(table->Size(nullptr), static_cast<int64_t>(keys.size()));
  EXPECT_GE(table->Capacity(), static_cast<int64_t>(keys.size()));
  const Contents contents = ContentsOf(*table);
  ASSERT_EQ(contents.size(), keys.size());
  const std::vector<float> got = rows.Download();
  std::vector<float> initial(4);
  for (size_t i = 0; i < keys.size(); ++i) {
    FillInitialRow(table->options().initializer, InitialRowKeyHash(keys[i]), initial.data(), 4);
    const std::vector<double>& row = contents.at(keys[i]);
    EXPECT_EQ(row[0], 0) << "no update counted";
    for (int j = 0; j < 4; ++j) {
      ASSERT_EQ(row[2 + j], initial[j]);
      ASSERT_EQ(got[i * 4 + j], initial[j]);
      ASSERT_EQ(got[(i + keys.size()) * 4 + j], initial[j]);
    }
  }
}

TEST_P(DeviceTableTest, InsertOrAssignLetsTheLastRowWinAndRemoveLeavesOthersFindable) {
  const Backend& backend = GetParam();
  auto table = MakeOrDie(backend, Options(2));
  std::vector<int64_t> keys;
  std::vector<float> values;
  for (int64_t k = 0; k < 5000; ++k) {
    keys.push_back(k);
    values.insert(values.end(), {static_cast<float>(k), 1.0f});
  }
  keys.push_back(3);  // again: this row wins
  values.insert(values.end(), {-3.0f, -3.0f});
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> rows(backend, values);
  ASSERT_EQ(table->InsertOrAssign(nullptr, keys.size(), device_keys.get(), rows.get()), "");
  EXPECT_EQ(table->Size(nullptr), 5000);
  std::vector<int64_t> odd;
  for (int64_t k = 1; k < 5000; k += 2) odd.push_back(k);
  odd.push_back(1);                 // twice: removed once
  odd.push_back(int64_t{1} << 40);  // absent
  Buffer<int64_t> remove(backend, odd);
  int64_t removed = 0;
  ASSERT_EQ(table->Remove(nullptr, odd.size(), remove.get(), &removed), "");
  EXPECT_EQ(removed, 2500);
  EXPECT_EQ(table->Size(nullptr), 2500);
  const Contents contents = ContentsOf(*table);
  ASSERT_EQ(contents.size(), 2500u);
  for (int64_t k = 0; k < 5000; k += 2) {
    const std::vector<double>& row = contents.at(k);
    EXPECT_EQ(row[2], k == 3 ? -3.0 : static_cast<double>(k));
  }
  // Removed slots hold tombstones: keys past them still probe to their rows, and new keys go in.
  ASSERT_EQ(table->InsertOrAssign(nullptr, 1, remove.get(), rows.get()), "");
  EXPECT_EQ(table->Size(nullptr), 2501);
  ASSERT_EQ(table->Clear(nullptr), "");
  EXPECT_EQ(table->Size(nullptr), 0);
  EXPECT_TRUE(ContentsOf(*table).empty());
}

// As the CPU table: a call that could pass max_rows is refused before it changes anything, where
// near the limit only the distinct keys the table lacks count; every call that adds rows checks.
TEST_P(DeviceTableTest, RowsAtTheLimitWorkAndOnePastIsRefusedByEveryAddingCall) {
  const Backend& backend = GetParam();
  DeviceTableOptions options = Options(2);
  options.max_rows = 100;
  auto table = MakeOrDie(backend, options);
  std::vector<int64_t> first(100);
  for (int64_t k = 0; k < 100; ++k) first[k] = k * 7;
  first.push_back(first[0]);  // a key given twice counts once
  Buffer<int64_t> keys(backend, first);
  Buffer<float> rows(backend, static_cast<int64_t>(first.size()) * 2);
  ASSERT_EQ(table->FindOrInsert(nullptr, first.size(), keys.get(), rows.get()), "");
  ASSERT_EQ(table->Size(nullptr), 100);
  // Every key again (present: they count for nothing) and one new key.
  std::vector<int64_t> one_more = first;
  one_more.push_back(-1);
  Buffer<int64_t> more(backend, one_more);
  Buffer<float> more_rows(backend, std::vector<float>(one_more.size() * 2, 0.5f));
  const auto refused = [&](const std::string& error) {
    return error.find("'t'") != std::string::npos &&
           error.find("is over the limit of 100 rows") != std::string::npos;
  };
  std::string error = table->FindOrInsert(nullptr, one_more.size(), more.get(), more_rows.get());
  EXPECT_TRUE(refused(error)) << error;
  error = table->InsertOrAssign(nullptr, one_more.size(), more.get(), more_rows.get());
  EXPECT_TRUE(refused(error)) << error;
  OptimizerParams params;
  params.kind = OptimizerKind::kSgd;
  params.learning_rate = 0.1f;
  error = table->ApplyGradients(nullptr, params, 1, one_more.size(), more.get(), more_rows.get());
  EXPECT_TRUE(refused(error)) << error;
  EXPECT_EQ(table->Size(nullptr), 100);
  Flags found(backend, 1);
  Buffer<float> row(backend, 2);
  ASSERT_EQ(table->Find(nullptr, 1, more.get() + one_more.size() - 1, row.get(), found.get()), "");
  EXPECT_EQ(found.Download()[0], 0) << "a refused call added its key";
  // Keys the table holds are updated and assigned at the limit.
  ASSERT_EQ(table->InsertOrAssign(nullptr, first.size(), more.get(), more_rows.get()), "");
  ASSERT_EQ(table->ApplyGradients(nullptr, params, 1, first.size(), more.get(), more_rows.get()),
            "");
  // A removal makes room for one.
  int64_t removed = 0;
  ASSERT_EQ(table->Remove(nullptr, 1, keys.get(), &removed), "");
  ASSERT_EQ(table->FindOrInsert(nullptr, 1, more.get() + one_more.size() - 1, more_rows.get()), "");
  EXPECT_EQ(table->Size(nullptr), 100);
}

// Near full load most buckets are full, and a find stops at a full bucket unless a claim went on
// past it (its overflow bit): every key stored beyond a full bucket must still be found, through
// removals (tombstones keep buckets full), and after Clear none is.
TEST_P(DeviceTableTest, KeysPastFullBucketsAreFoundAtNinetyPercentLoad) {
  const Backend& backend = GetParam();
  DeviceTableOptions options = Options(1);
  options.initial_capacity = 1 << 13;
  options.max_load_factor = 0.95;
  auto table = MakeOrDie(backend, options);
  std::mt19937_64 rng(7);
  const int64_t n = (options.initial_capacity * 9) / 10;
  const std::vector<int64_t> keys = Keys(rng, 2 * n, int64_t{1} << 62);
  const std::vector<int64_t> stored(keys.begin(), keys.begin() + n);
  std::vector<float> values(stored.begin(), stored.end());
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> device_values(backend, values);
  ASSERT_EQ(table->InsertOrAssign(nullptr, n, device_keys.get(), device_values.get()), "");
  ASSERT_EQ(table->Capacity(), options.initial_capacity);  // no growth: 90 % full
  auto expect_found = [&](const std::string& when, int64_t removed_below) {
    Buffer<float> rows(backend, 2 * n);
    Flags found(backend, 2 * n);
    ASSERT_EQ(table->Find(nullptr, 2 * n, device_keys.get(), rows.get(), found.get()), "");
    const std::vector<uint8_t> present = found.Download();
    const std::vector<float> got = rows.Download();
    int64_t wrong = 0;
    for (int64_t i = 0; i < 2 * n; ++i) {
      const bool expected = i >= removed_below && i < n;
      if (present[i] != expected || (expected && got[i] != static_cast<float>(keys[i]))) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << when;
  };
  expect_found("after inserts", 0);
  Buffer<int64_t> first_third(backend, std::vector<int64_t>(keys.begin(), keys.begin() + n / 3));
  int64_t removed = 0;
  ASSERT_EQ(table->Remove(nullptr, n / 3, first_third.get(), &removed), "");
  EXPECT_EQ(removed, n / 3);
  expect_found("after removing a third", n / 3);
  ASSERT_EQ(table->Clear(nullptr), "");
  expect_found("after clear", n);
}

// The optimizers' settings each case trains with.
std::vector<OptimizerParams> EveryOptimizer() {
  std::vector<OptimizerParams> all;
  auto with = [&](OptimizerKind kind, auto set) {
    OptimizerParams p;
    p.kind = kind;
    p.learning_rate = 0.05f;
    p.epsilon = 1e-7f;
    set(p);
    all.push_back(p);
  };
  with(OptimizerKind::kSgd, [](OptimizerParams&) {});
  with(OptimizerKind::kAdagrad, [](OptimizerParams& p) { p.initial_accumulator_value = 0.1f; });
  with(OptimizerKind::kAdagrad, [](OptimizerParams& p) { p.epsilon_inside_sqrt = true; });
  with(OptimizerKind::kAdam, [](OptimizerParams&) {});
  // Every row bias-corrected by the optimizer's step (bias_correction_step 'optimizer').
  with(OptimizerKind::kAdam, [](OptimizerParams& p) {
    p.bias_correction = BiasCorrection::kKeras;
    p.shared_prior_updates = 9;
  });
  with(OptimizerKind::kAmsgrad, [](OptimizerParams&) {});
  with(OptimizerKind::kMomentum, [](OptimizerParams& p) { p.momentum = 0.9f; });
  with(OptimizerKind::kMomentum, [](OptimizerParams& p) {
    p.momentum = 0.9f;
    p.use_nesterov = true;
  });
  with(OptimizerKind::kKerasMomentum, [](OptimizerParams& p) { p.momentum = 0.8f; });
  with(OptimizerKind::kKerasMomentum, [](OptimizerParams& p) {
    p.momentum = 0.8f;
    p.use_nesterov = true;
  });
  with(OptimizerKind::kFtrl, [](OptimizerParams& p) {
    p.initial_accumulator_value = 0.1f;
    p.l1 = 0.01f;
    p.l2 = 0.02f;
  });
  with(OptimizerKind::kFtrl, [](OptimizerParams& p) {
    p.initial_accumulator_value = 0.1f;
    p.l2_shrinkage = 0.01f;
    p.learning_rate_power = -0.7f;
  });
  for (OptimizerKind kind : {OptimizerKind::kRmsprop, OptimizerKind::kCenteredRmsprop}) {
    for (bool inside : {false, true}) {
      with(kind, [inside](OptimizerParams& p) {
        p.rho = 0.8f;
        p.epsilon = 1e-3f;
        p.epsilon_inside_sqrt = inside;
        p.initial_accumulator_value = 1.0f;
      });
    }
  }
  for (OptimizerKind kind :
       {OptimizerKind::kRmspropMomentum, OptimizerKind::kCenteredRmspropMomentum}) {
    with(kind, [](OptimizerParams& p) {
      p.rho = 0.8f;
      p.momentum = 0.5f;
      p.epsilon = 1e-3f;
    });
  }
  with(OptimizerKind::kAdadelta, [](OptimizerParams& p) {
    p.learning_rate = 1.0f;
    p.rho = 0.9f;
    p.epsilon = 1e-3f;
  });
  with(OptimizerKind::kProximalSgd, [](OptimizerParams& p) {
    p.l1 = 0.01f;
    p.l2 = 0.1f;
  });
  with(OptimizerKind::kProximalAdagrad, [](OptimizerParams& p) {
    p.initial_accumulator_value = 0.1f;
    p.l1 = 0.01f;
    p.l2 = 0.1f;
  });
  with(OptimizerKind::kAdagradDa, [](OptimizerParams& p) {
    p.initial_accumulator_value = 0.1f;
    p.l1 = 0.01f;
    p.l2 = 0.1f;
    p.global_step = 3.0f;
  });
  with(OptimizerKind::kAdamax, [](OptimizerParams& p) { p.beta1 = 0.8f; });
  with(OptimizerKind::kNadam, [](OptimizerParams&) {});
  with(OptimizerKind::kNadam, [](OptimizerParams& p) { p.shared_prior_updates = 4; });
  with(OptimizerKind::kNadam, [](OptimizerParams& p) {
    p.beta1 = 0.99f;
    p.schedule_decay = 0.004f;
  });
  return all;
}

// The CPU table's training update for a batch with duplicates: what the Python layer hands the op
// (each key once, in first-seen order, its gradients summed in the order given).
void CpuApply(EmbeddingTable<int64_t>& cpu, const OptimizerParams& p, int64_t step,
              const std::vector<int64_t>& keys, const std::vector<float>& gradients) {
  const int dim = cpu.dim();
  std::vector<int64_t> distinct;
  std::map<int64_t, size_t> index;
  std::vector<float> sums;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = index.emplace(keys[i], distinct.size());
    if (fresh) {
      distinct.push_back(keys[i]);
      sums.insert(sums.end(), gradients.begin() + i * dim, gradients.begin() + (i + 1) * dim);
    } else {
      for (int j = 0; j < dim; ++j) sums[it->second * dim + j] += gradients[i * dim + j];
    }
  }
  if (cpu.num_slots() < NumSlots(p.kind)) cpu.EnsureSlots(NumSlots(p.kind), SlotInitialValues(p));
  cpu.UpdateBatch(
      distinct.size(), [&](int64_t i) { return distinct[i]; }, step,
      [&](int64_t i, RowRef& row) {
        ApplyGradient(p, *row.update_count, sums.data() + i * dim, dim, row.embedding, row.slots);
      });
}

// One training step of both tables on the same batch.
void TrainBoth(EmbeddingTable<int64_t>& cpu, DeviceTable& gpu, const Backend& backend,
               const OptimizerParams& p, int64_t step, const std::vector<int64_t>& keys,
               const std::vector<float>& grads) {
  CpuApply(cpu, p, step, keys, grads);
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> device_grads(backend, grads);
  ASSERT_EQ(
      gpu.ApplyGradients(nullptr, p, step, keys.size(), device_keys.get(), device_grads.get()), "");
}

TEST_P(DeviceTableTest, EveryOptimizerUpdatesAsTheCpuTableWithDuplicatesSummed) {
  const Backend& backend = GetParam();
  for (const OptimizerParams& p : EveryOptimizer()) {
    SCOPED_TRACE(testing::Message() << "optimizer " << static_cast<int>(p.kind));
    const int dim = 5;
    const InitializerSpec init{InitializerKind::kNormal, 0.0f, 0.1f, 3};
    EmbeddingTable<int64_t> cpu(dim, init);
    auto gpu = MakeOrDie(backend, Options(dim, init));
    std::mt19937_64 rng(11);
    std::normal_distribution<float> gradient(0.0f, 1.0f);
    for (int64_t step = 1; step <= 12; ++step) {
      const std::vector<int64_t> keys = Keys(rng, 400, 150);  // many duplicates
      std::vector<float> grads(keys.size() * dim);
      for (float& g : grads) g = gradient(rng);
      TrainBoth(cpu, *gpu, backend, p, step, keys, grads);
    }
    ExpectSameContents(ContentsOf(cpu), ContentsOf(*gpu), backend);
    EXPECT_EQ(gpu->LatestStep(nullptr), cpu.latest_step());
    EXPECT_EQ(gpu->slot_initial_values(), cpu.slot_initial_values());
  }
}

TEST_P(DeviceTableTest, AdmissionCountsAsTheCpuSketch) {
  const Backend& backend = GetParam();
  AdmissionSpec admission;
  admission.min_count = 3;
  admission.sketch_width = 1 << 20;  // wide: no two of these keys share every counter
  admission.sketch_depth = 4;
  EmbeddingTable<int64_t> cpu(3, {}, 6, admission);
  DeviceTableOptions options = Options(3);
  options.admission = admission;
  auto gpu = MakeOrDie(backend, options);
  OptimizerParams sgd;
  sgd.learning_rate = 0.1f;
  std::mt19937_64 rng(5);
  for (int64_t step = 1; step <= 6; ++step) {
    const std::vector<int64_t> keys = Keys(rng, 300, 400);
    const std::vector<float> grads(keys.size() * 3, 1.0f);
    TrainBoth(cpu, *gpu, backend, sgd, step, keys, grads);
  }
  ExpectSameContents(ContentsOf(cpu), ContentsOf(*gpu), backend);
  const TableCounters c = cpu.Counters(), g = gpu->Counters(nullptr);
  EXPECT_EQ(c.admitted, g.admitted);
  EXPECT_EQ(c.rejected, g.rejected);
  EXPECT_GT(g.rejected, 0);
  EXPECT_GT(g.admitted, 0);
}

TEST_P(DeviceTableTest, EvictionRemovesWhatTheCpuTableRemoves) {
  const Backend& backend = GetParam();
  OptimizerParams sgd;
  sgd.learning_rate = 0.5f;
  // One key per step, so that last steps never tie at max_size's cutoff.
  auto train = [&](EmbeddingTable<int64_t>& cpu, DeviceTable& gpu) {
    std::mt19937_64 rng(9);
    std::normal_distribution<float> gradient(0.0f, 1.0f);
    for (int64_t step = 1; step <= 400; ++step) {
      const std::vector<int64_t> keys = {step % 40 == 0 ? 7 : step};
      std::vector<float> grads(3);
      for (float& g : grads) g = gradient(rng) * (step % 3 == 0 ? 0.01f : 1.0f);
      TrainBoth(cpu, gpu, backend, sgd, step, keys, grads);
    }
  };
  std::vector<EvictionCriteria> cases(4);
  cases[0].ttl_steps = 150;
  cases[1].min_frequency = 2;
  cases[1].frequency_window_steps = 10;
  cases[2].min_l2_norm = 0.05f;
  cases[3].max_size = 100;
  for (EvictionCriteria criteria : cases) {
    criteria.now_step = 400;
    EmbeddingTable<int64_t> cpu(3, {});
    auto gpu = MakeOrDie(backend, Options(3));
    train(cpu, *gpu);
    const int64_t expected = cpu.Evict(criteria);
    int64_t evicted = -1;
    ASSERT_EQ(gpu->Evict(nullptr, criteria, &evicted), "");
    EXPECT_GT(expected, 0);
    EXPECT_EQ(evicted, expected);
    ExpectSameContents(ContentsOf(cpu), ContentsOf(*gpu), backend);
    EXPECT_EQ(gpu->Counters(nullptr).evicted, expected);
  }
}

// The CPU table's own full snapshot and restore (as checkpoint_kernels.cc does them).
std::string CpuSnapshot(EmbeddingTable<int64_t>& cpu) {
  StringSink sink;
  SnapshotWriter writer(&sink);
  SnapshotHeader header;
  header.dim = cpu.dim();
  header.table_name = "t";
  const int64_t version = cpu.Snapshot(
      EmbeddingTable<int64_t>::kFullSnapshot,
      [&](int64_t rows, int64_t) {
        header.num_slots = cpu.num_slots();
        header.slot_initial_values = cpu.slot_initial_values();
        header.rows = rows;
        return writer.Begin(header);
      },
      [&](const int64_t& key, const RowRef& row) {
        return writer.Row(key, *row.update_count, *row.last_step, row.embedding, row.slots);
      },
      [&](const int64_t& key) { return writer.Tombstone(key); }, /*track=*/false);
  EXPECT_GE(version, 0);
  EXPECT_TRUE(writer.Finish());
  return sink.bytes;
}

// Applies a full or delta snapshot to the CPU table: removed ids, then rows.
void CpuRestore(const std::string& bytes, EmbeddingTable<int64_t>* cpu) {
  StringSource source(bytes);
  SnapshotReader reader(&source);
  SnapshotHeader header;
  ASSERT_EQ(reader.ReadHeader(&header), "");
  cpu->EnsureSlots(header.num_slots, header.slot_initial_values);
  const int dim = cpu->dim(), slots = header.num_slots;
  ASSERT_EQ(reader.ReadRecords(
                [&](int64_t key) {
                  cpu->Remove(key);
                  return true;
                },
                [&](int64_t key, uint32_t count, int64_t step, const float* values) {
                  cpu->Upsert(key, [&](RowRef& row, bool) {
                    std::memcpy(row.embedding, values, sizeof(float) * dim);
                    std::memcpy(row.slots, values + dim, sizeof(float) * dim * slots);
                    *row.update_count = count;
                    *row.last_step = step;
                  });
                  return true;
                },
                nullptr, nullptr),
            "");
}

TEST_P(DeviceTableTest, SnapshotsMoveBetweenTheGpuAndTheCpuTableExactly) {
  const Backend& backend = GetParam();
  const OptimizerParams adam = Adam();
  const InitializerSpec init{InitializerKind::kTruncatedNormal, 0.0f, 0.2f, 1};
  auto gpu = MakeOrDie(backend, Options(6, init));
  std::mt19937_64 rng(2);
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<int64_t> keys = Keys(rng, 3000, 5000);
    const std::vector<float> grads(keys.size() * 6, 0.25f);
    Buffer<int64_t> device_keys(backend, keys);
    Buffer<float> device_grads(backend, grads);
    ASSERT_EQ(gpu->ApplyGradients(nullptr, adam, step, keys.size(), device_keys.get(),
                                  device_grads.get()),
              "");
  }
  // GPU -> file (in small chunks) -> CPU table.
  StringSink sink;
  SnapshotHeader header;
  header.table_name = "t";
  header.step = 5;
  ASSERT_EQ(WriteDeviceSnapshot(*gpu, nullptr, &header, &sink, /*chunk_rows=*/512), "");
  EmbeddingTable<int64_t> cpu(6, init);
  CpuRestore(sink.bytes, &cpu);
  const Contents from_gpu = ContentsOf(*gpu);
  ExpectSameContents(from_gpu, ContentsOf(cpu), Backend{"exact", false, 1});
  // CPU table -> file -> a new GPU table.
  const std::string cpu_file = CpuSnapshot(cpu);
  auto restored = MakeOrDie(backend, Options(6, init));
  StringSource source(cpu_file);
  SnapshotHeader read;
  ASSERT_EQ(ReadDeviceSnapshot(&source, *restored, nullptr, &read), "");
  EXPECT_EQ(read.rows, from_gpu.size());
  ExpectSameContents(from_gpu, ContentsOf(*restored), Backend{"exact", false, 1});
  EXPECT_EQ(restored->LatestStep(nullptr), 5);
  // A damaged file is an error, never a partial silent restore.
  std::string damaged = cpu_file;
  damaged[damaged.size() / 2] ^= 0x40;
  auto target = MakeOrDie(backend, Options(6, init));
  StringSource damaged_source(damaged);
  EXPECT_NE(ReadDeviceSnapshot(&damaged_source, *target, nullptr), "");
  StringSource wrong_dim(cpu_file);
  auto narrow = MakeOrDie(backend, Options(5, init));
  EXPECT_NE(ReadDeviceSnapshot(&wrong_dim, *narrow, nullptr).find("dim"), std::string::npos);
}

// One tracked snapshot of `gpu` (full: since_version < 0), committed as the save kernel does;
// returns its bytes, and its version in *version.
std::string TrackedSnapshot(DeviceTable& gpu, int64_t since_version, uint64_t sequence,
                            int64_t* version) {
  StringSink sink;
  SnapshotHeader header;
  header.table_name = "t";
  header.chain_id = 7;
  header.sequence = sequence;
  EXPECT_EQ(WriteDeviceSnapshot(gpu, nullptr, &header, &sink, /*chunk_rows=*/300, since_version,
                                /*track=*/true, version),
            "");
  EXPECT_EQ(gpu.CommitSnapshot(nullptr, *version), "");
  return sink.bytes;
}

SnapshotHeader HeaderOfFile(const std::string& bytes) {
  StringSource source(bytes);
  SnapshotReader reader(&source);
  SnapshotHeader header;
  EXPECT_EQ(reader.ReadHeader(&header), "");
  return header;
}

// A chain of a full snapshot and deltas taken from the GPU table while it trains, takes new ids,
// loses ids to removal and eviction and gets some back, restores the table as it was at each
// save: into a new GPU table and into the CPU table, exactly. Each delta holds only the rows
// written since the save before it, and the removed ids.
TEST_P(DeviceTableTest, DeltaSnapshotsRestoreTheTableAsItWasAtEachSave) {
  const Backend& backend = GetParam();
  const int dim = 4;
  const InitializerSpec init{InitializerKind::kUniform, -0.1f, 0.1f, 5};
  DeviceTableOptions options = Options(dim, init);
  auto gpu = MakeOrDie(backend, options);
  const OptimizerParams adam = Adam();
  std::mt19937_64 rng(35);
  std::normal_distribution<float> gradient(0.0f, 1.0f);
  auto train = [&](int64_t step, int64_t n, int64_t range) {
    const std::vector<int64_t> keys = Keys(rng, n, range);
    std::vector<float> grads(keys.size() * dim);
    for (float& g : grads) g = gradient(rng);
    Buffer<int64_t> device_keys(backend, keys);
    Buffer<float> device_grads(backend, grads);
    ASSERT_EQ(gpu->ApplyGradients(nullptr, adam, step, keys.size(), device_keys.get(),
                                  device_grads.get()),
              "");
  };
  train(1, 4000, 3000);
  int64_t version = -1;
  std::vector<std::string> chain = {TrackedSnapshot(*gpu, -1, 0, &version)};
  EXPECT_EQ(HeaderOfFile(chain[0]).kind, SnapshotKind::kFull);
  for (int64_t save = 1; save <= 6; ++save) {
    const int64_t step = 1 + save;
    const int64_t size_before = gpu->Size(nullptr);
    train(step, 200, 3000 + 500 * save);  // a few rows change, some ids are new
    // Removals: a batch of ids (thousands over the run, so the removal log grows), then every
    // third save an eviction of the rows idle for 3 steps (at save 3 also of the least recently
    // updated past 1000 rows); ids removed now and trained again later come back in a later delta.
    const std::vector<int64_t> doomed = Keys(rng, 1500, 3000);
    Buffer<int64_t> device_doomed(backend, doomed);
    ASSERT_EQ(gpu->Remove(nullptr, doomed.size(), device_doomed.get(), nullptr), "");
    if (save % 3 == 0) {
      EvictionCriteria criteria;
      criteria.now_step = step;
      criteria.ttl_steps = 3;
      criteria.max_size = save == 3 ? 1000 : 0;  // then the least recently updated go too
      int64_t evicted = 0;
      ASSERT_EQ(gpu->Evict(nullptr, criteria, &evicted), "");
      EXPECT_GT(evicted, 0);
    }
    const std::vector<int64_t> inserted = Keys(rng, 50, 100);
    std::vector<float> values(inserted.size() * dim, 0.5f * save);
    Buffer<int64_t> device_inserted(backend, inserted);
    Buffer<float> device_values(backend, values);
    ASSERT_EQ(
        gpu->InsertOrAssign(nullptr, inserted.size(), device_inserted.get(), device_values.get()),
        "");
    const int64_t since = version;
    const size_t bytes_with_log = gpu->BytesInUse();
    chain.push_back(TrackedSnapshot(*gpu, since, save, &version));
    EXPECT_GT(version, since);
    EXPECT_LT(gpu->BytesInUse(), bytes_with_log) << "the commit gave the removal log's memory back";
    const SnapshotHeader header = HeaderOfFile(chain.back());
    EXPECT_EQ(header.kind, SnapshotKind::kDelta);
    EXPECT_LE(header.rows, 250u) << "a delta holds the rows written since its base, not "
                                 << size_before << " rows";
    EXPECT_GT(header.tombstones, 0u);
    const Contents expected = ContentsOf(*gpu);
    auto restored = MakeOrDie(backend, options);
    EmbeddingTable<int64_t> cpu(dim, init);
    for (const std::string& file : chain) {
      StringSource source(file);
      ASSERT_EQ(ReadDeviceSnapshot(&source, *restored, nullptr), "");
      CpuRestore(file, &cpu);
    }
    ExpectSameContents(expected, ContentsOf(*restored), Backend{"exact", false, 1});
    ExpectSameContents(expected, ContentsOf(cpu), Backend{"exact", false, 1});
  }
}

// A delta needs a base the table tracked since and did not commit past; a restored or cleared
// table tracks again only from MarkSnapshotBase (or a new full snapshot).
TEST_P(DeviceTableTest, DeltaWithoutABaseIsRefusedAndNothingIsWritten) {
  const Backend& backend = GetParam();
  auto gpu = MakeOrDie(backend, Options(3));
  const std::vector<int64_t> keys = {1, 2, 3};
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> rows(backend, std::vector<float>(9, 1.0f));
  ASSERT_EQ(gpu->InsertOrAssign(nullptr, 3, device_keys.get(), rows.get()), "");
  auto refused = [&](int64_t since) {
    StringSink sink;
    SnapshotHeader header;
    int64_t version = 0;
    const std::string error =
        WriteDeviceSnapshot(*gpu, nullptr, &header, &sink, 0, since, true, &version);
    EXPECT_EQ(version, DeviceSnapshotPlan::kNoDeltaBase);
    EXPECT_TRUE(sink.bytes.empty());
    return error.find("no delta since version " + std::to_string(since)) != std::string::npos;
  };
  EXPECT_TRUE(refused(1)) << "never snapshotted with tracking";
  int64_t first = -1, second = -1;
  TrackedSnapshot(*gpu, -1, 0, &first);
  TrackedSnapshot(*gpu, first, 1, &second);
  EXPECT_TRUE(refused(first)) << "a later delta was committed";
  EXPECT_TRUE(refused(second + 5)) << "a version the table has not reached";
  int64_t third = -1;
  TrackedSnapshot(*gpu, second, 2, &third);
  auto other = MakeOrDie(backend, Options(3));
  ASSERT_EQ(gpu->SwapContents(*other), "");
  EXPECT_TRUE(refused(third)) << "swapped in (a restore)";
  const int64_t base = gpu->MarkSnapshotBase(nullptr);
  EXPECT_GT(base, third) << "versions never go back";
  ASSERT_EQ(other->SwapContents(*gpu), "");  // the rows come back
  EXPECT_TRUE(refused(base)) << "each swap stops tracking";
  const int64_t again = gpu->MarkSnapshotBase(nullptr);
  int64_t after_base = -1;
  ASSERT_EQ(gpu->Remove(nullptr, 1, device_keys.get(), nullptr), "");
  const SnapshotHeader header = HeaderOfFile(TrackedSnapshot(*gpu, again, 3, &after_base));
  EXPECT_EQ(header.rows, 0u);
  EXPECT_EQ(header.tombstones, 1u);
  ASSERT_EQ(gpu->Clear(nullptr), "");
  EXPECT_TRUE(refused(after_base)) << "cleared";
}

// A table is used from one host thread at a time: a call from another thread while one runs is
// an error that says so, and changes nothing; a call made inside a running one on its own thread
// (here, from an export's visitor) runs.
TEST_P(DeviceTableTest, ACallFromASecondThreadWhileOneRunsIsRefused) {
  const Backend& backend = GetParam();
  auto gpu = MakeOrDie(backend, Options(2));
  const std::vector<int64_t> keys = {5, 6};
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> rows(backend, std::vector<float>(4, 1.0f));
  ASSERT_EQ(gpu->InsertOrAssign(nullptr, 2, device_keys.get(), rows.get()), "");
  std::string from_other_thread, from_same_thread = "not run";
  ASSERT_EQ(gpu->Export(nullptr, 0,
                        [&](const HostRows&) {
                          std::thread other([&] {
                            from_other_thread = gpu->Remove(nullptr, 2, device_keys.get(), nullptr);
                          });
                          other.join();
                          from_same_thread =
                              gpu->Find(nullptr, 2, device_keys.get(), rows.get(), nullptr);
                          return true;
                        }),
            "");
  EXPECT_NE(from_other_thread.find("called from two threads at once"), std::string::npos)
      << from_other_thread;
  EXPECT_EQ(from_same_thread, "");
  EXPECT_EQ(gpu->Size(nullptr), 2) << "the refused removal changed nothing";
  EXPECT_EQ(gpu->Remove(nullptr, 2, device_keys.get(), nullptr), "") << "free again after the call";
}

// Ids waiting for admission keep their counts across a save and restore: seen once before the
// save, once after, they are admitted (min_count 2), as on the CPU table.
TEST_P(DeviceTableTest, AdmissionSketchTravelsWithSnapshots) {
  const Backend& backend = GetParam();
  DeviceTableOptions options = Options(2);
  options.admission.min_count = 2;
  options.admission.sketch_width = 1 << 12;
  options.admission.sketch_depth = 3;
  OptimizerParams sgd;
  sgd.learning_rate = 0.1f;
  std::vector<int64_t> keys;
  for (int64_t k = 1; k <= 100; ++k) keys.push_back(k * 7919);
  const std::vector<float> grads(keys.size() * 2, 1.0f);
  Buffer<int64_t> device_keys(backend, keys);
  Buffer<float> device_grads(backend, grads);
  auto train_once = [&](DeviceTable& table, int64_t step) {
    ASSERT_EQ(table.ApplyGradients(nullptr, sgd, step, keys.size(), device_keys.get(),
                                   device_grads.get()),
              "");
  };
  auto saved = MakeOrDie(backend, options);
  train_once(*saved, 1);
  ASSERT_EQ(saved->Size(nullptr), 0);  // every id waits
  StringSink sink;
  SnapshotHeader header;
  header.table_name = "t";
  ASSERT_EQ(WriteDeviceSnapshot(*saved, nullptr, &header, &sink), "");
  auto restored = MakeOrDie(backend, options);
  StringSource source(sink.bytes);
  ASSERT_EQ(ReadDeviceSnapshot(&source, *restored, nullptr), "");
  train_once(*restored, 2);
  EXPECT_EQ(restored->Size(nullptr), 100);
  // A sketch of another width cannot be re-hashed: dropped, so the ids wait again.
  DeviceTableOptions narrower = options;
  narrower.admission.sketch_width = 1 << 11;
  auto other_width = MakeOrDie(backend, narrower);
  StringSource again(sink.bytes);
  ASSERT_EQ(ReadDeviceSnapshot(&again, *other_width, nullptr), "");
  train_once(*other_width, 2);
  EXPECT_EQ(other_width->Size(nullptr), 0);
  // Writes set the counters, or merge them keeping the larger.
  const uint32_t first[] = {5, 0}, second[] = {3, 9};
  uint32_t read[2];
  ASSERT_EQ(restored->WriteSketch(nullptr, 10, 2, first, /*keep_larger=*/false), "");
  ASSERT_EQ(restored->WriteSketch(nullptr, 10, 2, second, /*keep_larger=*/true), "");
  ASSERT_EQ(restored->ReadSketch(nullptr, 10, 2, read), "");
  EXPECT_EQ(read[0], 5u);
  EXPECT_EQ(read[1], 9u);
  EXPECT_NE(restored->ReadSketch(nullptr, restored->SketchCounters() - 1, 2, read), "");
}

TEST_P(DeviceTableTest, BadOptionsAndExhaustedMemoryAreClearErrorsNamingTheTable) {
  const Backend& backend = GetParam();
  std::string error;
  DeviceTableOptions options = Options(0);
  options.name = "clicks";
  EXPECT_FALSE(backend.Make(options, &error));
  EXPECT_NE(error.find("clicks"), std::string::npos) << error;
  EXPECT_NE(error.find("dim"), std::string::npos) << error;
  options = Options(4);
  options.name = "clicks";
  options.admission.min_count = 2;
  options.admission.exact = true;
  EXPECT_FALSE(backend.Make(options, &error));
  EXPECT_NE(error.find("exact admission"), std::string::npos) << error;
  options = Options(4);
  options.tile_lanes = 3;
  EXPECT_FALSE(backend.Make(options, &error));
  EXPECT_NE(error.find("tile_lanes must be 0 (the default) or a power of two up to 32, got 3"),
            std::string::npos)
      << error;
  options = Options(kMaxDim);
  options.name = "clicks";
  options.initial_capacity = int64_t{1} << 40;  // 2^40 rows of 4096 floats: no device has that
  EXPECT_FALSE(backend.Make(options, &error));
  EXPECT_NE(error.find("clicks"), std::string::npos) << error;
  EXPECT_NE(error.find("out of device memory"), std::string::npos) << error;
}

// A restore fills a new table and swaps it in: the rows trade places, and a table of another dim
// is refused with both tables unchanged.
TEST_P(DeviceTableTest, SwapContentsTradesRowsAndRefusesAnotherDim) {
  const Backend& backend = GetParam();
  auto live = MakeOrDie(backend, Options(2));
  auto restored = MakeOrDie(backend, Options(2));
  const std::vector<int64_t> live_keys = {1, 2, 3}, restored_keys = {7};
  Buffer<int64_t> live_device_keys(backend, live_keys);
  Buffer<float> live_rows(backend, std::vector<float>{1, 1, 2, 2, 3, 3});
  ASSERT_EQ(live->InsertOrAssign(nullptr, 3, live_device_keys.get(), live_rows.get()), "");
  Buffer<int64_t> restored_device_keys(backend, restored_keys);
  Buffer<float> restored_rows(backend, std::vector<float>{7, -7});
  ASSERT_EQ(restored->InsertOrAssign(nullptr, 1, restored_device_keys.get(), restored_rows.get()),
            "");
  ASSERT_EQ(live->SwapContents(*restored), "");
  EXPECT_EQ(live->Size(nullptr), 1);
  EXPECT_EQ(restored->Size(nullptr), 3);
  const Contents now_live = ContentsOf(*live);
  ASSERT_EQ(now_live.size(), 1u);
  EXPECT_EQ(now_live.at(7)[2], 7.0);
  EXPECT_EQ(now_live.at(7)[3], -7.0);
  EXPECT_EQ(ContentsOf(*restored).at(3)[2], 3.0);
  auto wider = MakeOrDie(backend, Options(4));
  const std::string error = live->SwapContents(*wider);
  EXPECT_NE(error.find("dim or admission differs"), std::string::npos) << error;
  EXPECT_EQ(live->Size(nullptr), 1);
  EXPECT_EQ(wider->Size(nullptr), 0);
}

// The CPU-vs-GPU equivalence run: one long random sequence of every operation, driven into both
// tables, whose contents must stay equal throughout.
TEST_P(DeviceTableTest, LongRandomSequenceKeepsBothTablesEqual) {
  const Backend& backend = GetParam();
  const int dim = 8;
  const InitializerSpec init{InitializerKind::kUniform, -0.05f, 0.05f, 17};
  AdmissionSpec admission;
  admission.min_count = 2;
  admission.sketch_width = 1 << 22;
  EmbeddingTable<int64_t> cpu(dim, init, 6, admission);
  DeviceTableOptions options = Options(dim, init);
  options.admission = admission;
  auto gpu = MakeOrDie(backend, options);
  const OptimizerParams adam = Adam();
  std::mt19937_64 rng(2026);
  std::normal_distribution<float> gradient(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  int64_t range = 2000;  // the id space widens: the table grows through several rebuilds
  int64_t operations[6] = {0, 0, 0, 0, 0, 0};
  for (int64_t step = 1; step <= 300; ++step, range += 300) {
    const int op = pick(rng);
    if (op < 55) {  // training, with duplicates and admissions
      ++operations[0];
      const std::vector<int64_t> keys = Keys(rng, 1 + pick(rng) * 20, range);
      std::vector<float> grads(keys.size() * dim);
      for (float& g : grads) g = gradient(rng);
      TrainBoth(cpu, *gpu, backend, adam, step, keys, grads);
    } else if (op < 70) {  // lookups: present and missing ids read the same rows
      ++operations[1];
      const std::vector<int64_t> keys = Keys(rng, 500, range);
      std::vector<float> expected(keys.size() * dim);
      cpu.FindBatch(
          keys.size(), [&](int64_t i) { return keys[i]; }, expected.data());
      Buffer<int64_t> device_keys(backend, keys);
      Buffer<float> rows(backend, static_cast<int64_t>(keys.size()) * dim);
      ASSERT_EQ(gpu->Find(nullptr, keys.size(), device_keys.get(), rows.get(), nullptr), "");
      const std::vector<float> got = rows.Download();
      for (size_t e = 0; e < expected.size(); ++e) {
        ASSERT_NEAR(expected[e], got[e], backend.on_device ? kGpuTolerance : 0.0f) << "at " << e;
      }
    } else if (op < 80) {  // inserts
      ++operations[2];
      const std::vector<int64_t> keys = Keys(rng, 200, range);
      std::vector<float> values(keys.size() * dim);
      for (float& v : values) v = gradient(rng);
      for (size_t i = 0; i < keys.size(); ++i) cpu.InsertOrAssign(keys[i], values.data() + i * dim);
      Buffer<int64_t> device_keys(backend, keys);
      Buffer<float> rows(backend, values);
      ASSERT_EQ(gpu->InsertOrAssign(nullptr, keys.size(), device_keys.get(), rows.get()), "");
    } else if (op < 88) {  // removals
      ++operations[3];
      const std::vector<int64_t> keys = Keys(rng, 300, range);
      const int64_t expected = cpu.RemoveBatch(keys.size(), [&](int64_t i) { return keys[i]; });
      Buffer<int64_t> device_keys(backend, keys);
      int64_t removed = -1;
      ASSERT_EQ(gpu->Remove(nullptr, keys.size(), device_keys.get(), &removed), "");
      // A key given twice counts once on the GPU table, on the CPU table each time it was found.
      EXPECT_LE(removed, expected);
    } else if (op < 95) {  // evictions; max_size ties may go differently: reconciled below
      ++operations[4];
      EvictionCriteria criteria;
      criteria.now_step = step;
      criteria.ttl_steps = 120;
      criteria.min_l2_norm = 0.02f;
      ASSERT_EQ(cpu.Evict(criteria), [&] {
        int64_t evicted = -1;
        EXPECT_EQ(gpu->Evict(nullptr, criteria, &evicted), "");
        return evicted;
      }());
      if (cpu.Size() > 1500) {
        EvictionCriteria size_only;
        size_only.now_step = step;
        size_only.max_size = 1500;
        const Contents before = ContentsOf(cpu);
        cpu.Evict(size_only);
        ASSERT_EQ(gpu->Evict(nullptr, size_only, nullptr), "");
        Contents cpu_after = ContentsOf(cpu), gpu_after = ContentsOf(*gpu);
        ASSERT_EQ(cpu_after.size(), gpu_after.size());
        double cutoff = 0;  // the newest step the CPU table evicted: only rows there may differ
        for (const auto& [key, row] : before) {
          if (!cpu_after.count(key)) cutoff = std::max(cutoff, row[1]);
        }
        std::vector<int64_t> differing;
        for (const auto& [key, row] : before) {
          if (cpu_after.count(key) != gpu_after.count(key)) {
            ASSERT_EQ(row[1], cutoff) << "key " << key << " is no tie at the cutoff";
            differing.push_back(key);
          }
        }
        cpu.RemoveBatch(differing.size(), [&](int64_t i) { return differing[i]; });
        ASSERT_EQ(gpu->RemoveHostKeys(nullptr, differing.size(), differing.data()), "");
      }
    } else {  // a snapshot round trip through the file format into a new GPU table
      ++operations[5];
      StringSink sink;
      SnapshotHeader header;
      header.table_name = "t";
      ASSERT_EQ(WriteDeviceSnapshot(*gpu, nullptr, &header, &sink, 700), "");
      auto restored = MakeOrDie(backend, options);
      StringSource source(sink.bytes);
      ASSERT_EQ(ReadDeviceSnapshot(&source, *restored, nullptr), "");
      ExpectSameContents(ContentsOf(*gpu), ContentsOf(*restored), Backend{"exact", false, 1});
    }
    if (step % 25 == 0) ExpectSameContents(ContentsOf(cpu), ContentsOf(*gpu), backend);
  }
  ExpectSameContents(ContentsOf(cpu), ContentsOf(*gpu), backend);
  EXPECT_GT(gpu->Capacity(), 1024) << "the sequence grew the table";
  for (int64_t count : operations) EXPECT_GT(count, 0) << "an operation kind never ran";
  std::printf(
      "[%s] %ld rows, %ld slots; trained %ld, looked up %ld, inserted %ld, removed %ld, "
      "evicted %ld, round trips %ld\n",
      backend.name.c_str(), static_cast<long>(gpu->Size(nullptr)),
      static_cast<long>(gpu->Capacity()), static_cast<long>(operations[0]),
      static_cast<long>(operations[1]), static_cast<long>(operations[2]),
      static_cast<long>(operations[3]), static_cast<long>(operations[4]),
      static_cast<long>(operations[5]));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTableTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace de
}  // namespace tf_ext
