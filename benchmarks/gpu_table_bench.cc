// The GPU table core's throughput (kernels/dynamic_embedding/core/gpu/device_table.h): find,
// find-or-insert and the fused Adam update, batches of 1 Mi keys, at each dim and load factor, and
// the device's copy bandwidth measured in the same run (the anchor of "fraction of bandwidth").
// Run by benchmarks/gpu_table.py on a GPU machine, which compares it with HierarchicalKV's own
// benchmark; it prints one JSON object per measurement.
//
// As HierarchicalKV's benchmark does, each batch hits the table at --hit-rate (its 0.6; the rest
// are new keys, which find reads as initial rows and find-or-insert inserts) and each figure is the
// best of --repeats runs (HKV: of 2).
//
// usage: gpu_table_bench [--dims 8,32,64,128] [--load-factors 0.5,0.9] [--capacity-log2 25]
//                        [--batch 1048576] [--repeats 5] [--hit-rate 0.6] [--tile-lanes 0]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_memory.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"

namespace {

using tf_ext::de::DeviceTable;
using tf_ext::de::DeviceTableOptions;
namespace cuda = tf_ext::de::cuda;

struct Settings {
  std::vector<int> dims = {8, 32, 64, 128};
  std::vector<double> load_factors = {0.5, 0.9};
  int capacity_log2 = 25;
  int64_t batch = int64_t{1} << 20;
  int repeats = 5;
  double hit_rate = 0.6;
  int tile_lanes = 0;  // DeviceTableOptions::tile_lanes (0: the table's default)
};

template <typename T>
std::vector<T> ParseList(const char* text) {
  std::vector<T> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(static_cast<T>(std::stod(item)));
  return values;
}

Settings Parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dims") {
      settings.dims = ParseList<int>(argv[i + 1]);
    } else if (flag == "--load-factors") {
      settings.load_factors = ParseList<double>(argv[i + 1]);
    } else if (flag == "--capacity-log2") {
      settings.capacity_log2 = std::atoi(argv[i + 1]);
    } else if (flag == "--batch") {
      settings.batch = std::atoll(argv[i + 1]);
    } else if (flag == "--hit-rate") {
      settings.hit_rate = std::atof(argv[i + 1]);
    } else if (flag == "--tile-lanes") {
      settings.tile_lanes = std::atoi(argv[i + 1]);
    } else if (flag == "--repeats") {
      settings.repeats = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return settings;
}

void Check(const std::string& error) {
  if (!error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::exit(1);
  }
}

// Distinct keys spread over the whole int64 range: the n-th key of `stream`.
int64_t KeyAt(int64_t stream, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(n) + (static_cast<uint64_t>(stream) << 40)) *
                              0x9e3779b97f4a7c15ULL);
}

template <typename T>
T* Upload(const std::vector<T>& values) {
  T* device = static_cast<T*>(cuda::Alloc(sizeof(T) * values.size()));
  if (device == nullptr || !cuda::CopyToDevice(device, values.data(), sizeof(T) * values.size())) {
    std::fprintf(stderr, "out of device memory for the benchmark's inputs\n");
    std::exit(1);
  }
  return device;
}

// The best seconds of `repeats` runs of fn(r) (after a warm-up, r = 0), each run synchronized;
// after(r), untimed, follows each run.
template <typename Fn, typename After>
double BestSeconds(int repeats, Fn&& fn, After&& after) {
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    cuda::Synchronize();
    const auto start = std::chrono::steady_clock::now();
    fn(r);
    cuda::Synchronize();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (r > 0) seconds.push_back(elapsed.count());
    after(r);
  }
  return *std::min_element(seconds.begin(), seconds.end());
}

void Report(const char* op, int dim, double load_factor, int64_t keys, double seconds, double bytes,
            double copy_bandwidth) {
  std::printf(
      "{\"op\": \"%s\", \"dim\": %d, \"load_factor\": %.2f, \"keys\": %lld, \"seconds\": %.6e, "
      "\"keys_per_s\": %.6e, \"bandwidth_fraction\": %.4f}\n",
      op, dim, load_factor, static_cast<long long>(keys), seconds, keys / seconds,
      bytes / seconds / copy_bandwidth);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = Parse(argc, argv);
  std::string device;
  if (!cuda::DeviceAvailable(&device)) {
    std::fprintf(stderr, "no CUDA device: %s\n", device.c_str());
    return 1;
  }
  const double copy_bandwidth = cuda::CopyBandwidth(size_t{1} << 30, 10);
  std::printf("{\"device\": \"%s\", \"copy_bytes_per_s\": %.6e}\n", device.c_str(), copy_bandwidth);
  const int64_t capacity = int64_t{1} << settings.capacity_log2;
  const int64_t batch = settings.batch;
  for (int dim : settings.dims) {
    for (double load_factor : settings.load_factors) {
      DeviceTableOptions options;
      options.name = "bench";
      options.dim = dim;
      options.initial_capacity = capacity;
      options.max_load_factor = 0.97;  // the benchmark holds the load factor, not the table
      options.tile_lanes = settings.tile_lanes;
      std::string error;
      std::unique_ptr<DeviceTable> table = tf_ext::de::MakeCudaTable(options, &error);
      Check(error);
      tf_ext::de::OptimizerParams adam;
      adam.kind = tf_ext::de::OptimizerKind::kAdam;
      adam.learning_rate = 1e-3f;
      adam.epsilon = 1e-7f;
      // Slots first: filling then adding slots would rebuild the whole table.
      Check(table->EnsureSlots(nullptr, 2, tf_ext::de::SlotInitialValues(adam)));
      const int64_t fill = static_cast<int64_t>(load_factor * capacity);
      std::vector<int64_t> keys(batch);
      std::vector<float> rows(batch * dim, 0.5f);
      int64_t* device_keys = Upload(keys);
      float* device_rows = Upload(rows);
      for (int64_t begin = 0; begin < fill; begin += batch) {
        const int64_t n = std::min(batch, fill - begin);
        for (int64_t i = 0; i < n; ++i) keys[i] = KeyAt(0, begin + i);
        cuda::CopyToDevice(device_keys, keys.data(), sizeof(int64_t) * n);
        Check(table->InsertOrAssign(nullptr, n, device_keys, device_rows));
      }
      if (table->Capacity() != capacity) {
        std::fprintf(stderr, "the table grew while filling: capacity %lld\n",
                     static_cast<long long>(table->Capacity()));
        return 1;
      }
      // Batch r: present keys sampled across the filled range, then new keys of stream 1 + r.
      const int64_t hits = static_cast<int64_t>(settings.hit_rate * batch);
      std::vector<int64_t*> batches;
      for (int r = 0; r <= settings.repeats; ++r) {
        for (int64_t i = 0; i < batch; ++i) {
          keys[i] = i < hits ? KeyAt(0, (i * 7919 + r) % fill) : KeyAt(1 + r, i);
        }
        batches.push_back(Upload(keys));
      }
      auto nothing = [](int) {};
      const double row_bytes = 4.0 * dim;
      double seconds = BestSeconds(
          settings.repeats,
          [&](int r) { Check(table->Find(nullptr, batch, batches[r], device_rows, nullptr)); },
          nothing);
      // Reads each key and row, writes each row (a miss computes its row instead of reading it).
      Report("find", dim, load_factor, batch, seconds, batch * (8.0 + 2.0 * row_bytes),
             copy_bandwidth);
      // The new keys are inserted and removed again untimed, so the load factor holds.
      seconds = BestSeconds(
          settings.repeats,
          [&](int r) { Check(table->FindOrInsert(nullptr, batch, batches[r], device_rows)); },
          [&](int r) {
            Check(table->Remove(nullptr, batch - hits, batches[r] + hits, nullptr));
            Check(table->Reserve(nullptr, batch));  // drops the tombstones when needed
          });
      Report("find_or_insert", dim, load_factor, batch, seconds, batch * (8.0 + 2.0 * row_bytes),
             copy_bandwidth);
      // Training updates the present keys only (Adam; the table admits every key).
      seconds = BestSeconds(
          settings.repeats,
          [&](int r) {
            Check(table->ApplyGradients(nullptr, adam, 1 + r, hits, batches[r], device_rows));
          },
          nothing);
      // Reads the key, gradient, row and two slots; writes the row and two slots.
      Report("adam", dim, load_factor, hits, seconds, hits * (8.0 + 7.0 * row_bytes),
             copy_bandwidth);
      if (table->Capacity() != capacity) {
        std::fprintf(stderr, "the table grew during the benchmark: capacity %lld\n",
                     static_cast<long long>(table->Capacity()));
        return 1;
      }
      for (int64_t* keys_of_run : batches) cuda::Free(keys_of_run);
      cuda::Free(device_keys);
      cuda::Free(device_rows);
    }
  }
  return 0;
}
