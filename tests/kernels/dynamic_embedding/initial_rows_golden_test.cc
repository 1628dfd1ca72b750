// Golden values of initial rows: the row a served model returns for an id it never trained on,
// and the starting value of every new row. They must never change (see InitialRowKeyHash in
// kernels/dynamic_embedding/core/initializers.h): a failure here means the change would silently
// alter the untrained rows of every saved model. Recorded from tf_ext at commit 9cba35a, exact to
// the bit (hex float literals); tests/dynamic_embedding/test_golden.py pins the same rows as
// served by the TensorFlow ops.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/initializers.h"

namespace tf_ext {
namespace de {
namespace {

struct Int64KeyHash {
  int64_t key;
  uint64_t hash;
};
struct StringKeyHash {
  std::string key;
  uint64_t hash;
};

// Keys at the edges of the int64 range, and strings around the 8-byte word size, with zero bytes.
const Int64KeyHash kInt64KeyHashes[] = {
    {0, 0x0000000000000000ULL},
    {1, 0x5692161d100b05e5ULL},
    {-1, 0xb4d055fcf2cbbd7bULL},
    {std::numeric_limits<int64_t>::min(), 0x25c26ea579cea98aULL},
    {std::numeric_limits<int64_t>::max(), 0x5a682afe7965debdULL},
    {1000000000000000, 0x9c8171f0d88e0e1aULL},
    {42, 0xa759ea27d4727622ULL},
};
const StringKeyHash kStringKeyHashes[] = {
    {std::string("", 0), 0x48218226ff3cd4bfULL},
    {std::string("a", 1), 0x85077e5b3b497e92ULL},
    {std::string("\0", 1), 0xfcd998f6a82c72d8ULL},
    {std::string("abcdefgh", 8), 0x75b33e0c60339018ULL},
    {std::string("abcdefg\0", 8), 0xeeff351c6be707e2ULL},
    {std::string("abcdefghi", 9), 0xeb9c1e3fb6745219ULL},
    {std::string("a\0b", 3), 0x7461fa2eefa698abULL},
    {std::string("user:1234567890/item:abcdefghijklmnopqrstuvwxyz", 47), 0xba8285fc8a02de3aULL},
};

TEST(InitialRowsGoldenTest, Int64KeyHash) {
  for (const auto& pinned : kInt64KeyHashes) {
    EXPECT_EQ(InitialRowKeyHash(pinned.key), pinned.hash) << "key " << pinned.key;
  }
}

TEST(InitialRowsGoldenTest, StringKeyHash) {
  for (const auto& pinned : kStringKeyHashes) {
    EXPECT_EQ(InitialRowKeyHash(std::string_view(pinned.key)), pinned.hash)
        << "key of " << pinned.key.size() << " bytes '" << pinned.key << "'";
  }
}

constexpr int kDim = 8;
const int64_t kRowInt64Keys[] = {0, -1, 1000000000000000, std::numeric_limits<int64_t>::max()};
const std::string kRowStringKeys[] = {std::string("", 0), std::string("abcdefghi", 9),
                                      std::string("a\0b", 3)};
constexpr int kNumRowKeys = 7;  // kRowInt64Keys, then kRowStringKeys

struct GoldenRows {
  const char* name;
  InitializerSpec spec;
  float rows[kNumRowKeys][kDim];
};

const GoldenRows kGoldenRows[] = {
    // initializer="uniform" in the Python API: uniform in [-0.05, 0.05), seed 0.
    {"uniform_by_name",
     {InitializerKind::kUniform, -0.05f, 0.05f, 0},
     {
         {0x1.47043ap-10f, 0x1.074c3ep-5f, -0x1.17722p-6f, -0x1.d80648p-7f, -0x1.0cf196p-5f,
          -0x1.35438ap-5f, -0x1.74bf6ep-6f, -0x1.51d56p-5f},  // 0
         {-0x1.4a0eacp-6f, -0x1.a60e6p-6f, 0x1.0034c2p-5f, 0x1.b2c0c6p-6f, 0x1.7bf826p-5f,
          0x1.75f652p-5f, 0x1.91b652p-5f, -0x1.f77d0cp-6f},  // -1
         {-0x1.ed8bdap-6f, 0x1.7a0028p-7f, 0x1.1809fcp-5f, -0x1.0221eap-11f, 0x1.d70f58p-6f,
          0x1.e39764p-6f, 0x1.48a13ap-6f, -0x1.520d9cp-6f},  // 10^15
         {0x1.6e4fb2p-9f, 0x1.78633cp-6f, -0x1.4c317ep-6f, 0x1.12d8e2p-5f, -0x1.e1ddp-6f,
          0x1.07edp-6f, 0x1.883746p-5f, 0x1.50c7acp-7f},  // INT64_MAX
         {0x1.a11ffp-6f, -0x1.39ba7ep-8f, 0x1.d1134ap-6f, 0x1.5557f4p-5f, 0x1.63aaecp-5f,
          0x1.8f5cf2p-5f, -0x1.f86bc4p-7f, -0x1.03b34ap-5f},  // ""
         {-0x1.5d3166p-6f, 0x1.a790b6p-6f, -0x1.3838f2p-5f, 0x1.54c8fcp-5f, 0x1.deac02p-7f,
          0x1.c8a68p-9f, 0x1.0a7344p-5f, -0x1.906a5ap-8f},  // "abcdefghi"
         {0x1.70c25ap-5f, 0x1.0ebc34p-10f, 0x1.abe536p-7f, 0x1.6719fap-6f, 0x1.5f0e5ap-6f,
          0x1.0e5756p-5f, -0x1.1dcf6ap-10f, -0x1.37d16cp-8f},  // "a\0b"
     }},
    {"uniform",
     {InitializerKind::kUniform, -0.3f, 0.7f, 17},
     {
         {-0x1.8b36a4p-4f, 0x1.2473a2p-2f, 0x1.3add86p-2f, 0x1.fe5232p-3f, 0x1.88f74p-4f,
          -0x1.39c16p-3f, 0x1.28890ap-3f, 0x1.c6b6bcp-4f},  // 0
         {-0x1.a1e7eep-6f, 0x1.916b5ep-2f, -0x1.21d0bcp-3f, 0x1.6c10e4p-4f, 0x1.bd4724p-3f,
          -0x1.276762p-2f, 0x1.328b2cp-2f, -0x1.31dd6ap-3f},  // -1
         {0x1.940098p-2f, -0x1.06e3bep-2f, 0x1.075182p-1f, 0x1.8b543cp-3f, -0x1.155f5cp-2f,
          0x1.6b568cp-6f, -0x1.d4d6a4p-4f, 0x1.e84a18p-3f},  // 10^15
         {0x1.1c7006p-1f, -0x1.a429dp-3f, 0x1.319f36p-2f, 0x1.677f3cp-2f, -0x1.90a5c8p-8f,
          0x1.ce7898p-2f, 0x1.1a43aap-4f, 0x1.aaa8f4p-4f},  // INT64_MAX
         {-0x1.2b1e1p-3f, -0x1.d56cbcp-4f, 0x1.ba0e34p-2f, 0x1.11beep-1f, 0x1.20ec4ap-2f,
          0x1.7b2116p-3f, 0x1.3a70fcp-4f, 0x1.4f3b9ep-3f},  // ""
         {0x1.3809cp-1f, -0x1.02410cp-4f, -0x1.0eaa3cp-2f, -0x1.613984p-3f, -0x1.1817dcp-5f,
          -0x1.d40f78p-4f, -0x1.1de9c2p-2f, 0x1.d971b4p-13f},  // "abcdefghi"
         {-0x1.125ba2p-2f, 0x1.472346p-1f, 0x1.7e8a7ap-3f, -0x1.60b53ep-6f, 0x1.7d3eb4p-3f,
          0x1.420dacp-6f, 0x1.0939c8p-1f, 0x1.3c340cp-1f},  // "a\0b"
     }},
    {"normal",
     {InitializerKind::kNormal, 0.5f, 2.0f, 123},
     {
         {0x1.b2af68p+1f, 0x1.86d548p-1f, 0x1.6a639ep+1f, -0x1.691fa4p-6f, -0x1.1b3148p+2f,
          -0x1.6d7e34p+1f, 0x1.38a7fp+1f, -0x1.b0318cp-1f},  // 0
         {0x1.6836aap-1f, -0x1.05527p+0f, -0x1.5d0c2ap+1f, -0x1.6cdap+1f, -0x1.1d2ddep+0f,
          -0x1.38535ep+0f, 0x1.5ade28p-1f, -0x1.07f18cp+1f},  // -1
         {-0x1.3a3ff4p-2f, 0x1.798824p+1f, 0x1.85bb6ep+1f, -0x1.324d28p+0f, -0x1.1f0086p+0f,
          0x1.41d458p+0f, 0x1.1ca3bp+0f, 0x1.0bbd6p-2f},  // 10^15
         {0x1.e84adcp+1f, 0x1.8775d8p+0f, -0x1.d1295cp+1f, -0x1.79af74p-1f, 0x1.9a903p-5f,
          0x1.6b7edap+1f, -0x1.f9572ep-2f, -0x1.31a532p-1f},  // INT64_MAX
         {0x1.088962p-5f, -0x1.5643b6p-1f, -0x1.0ca2eep+1f, 0x1.17cd6cp-1f, 0x1.f00a92p+0f,
          0x1.76ceb4p+1f, 0x1.983198p+1f, -0x1.10dd82p-3f},  // ""
         {-0x1.51192ep+1f, 0x1.5b199cp+0f, 0x1.b75eep+0f, -0x1.5f4a2ep-1f, -0x1.062724p+0f,
          -0x1.1e9a4ap+1f, 0x1.a27066p+1f, 0x1.3bf146p+0f},  // "abcdefghi"
         {-0x1.03edd4p+1f, 0x1.fdaaep-1f, -0x1.923fc4p-2f, -0x1.22d91cp-3f, -0x1.97e34ep-1f,
          0x1.4da82cp+2f, -0x1.0c7788p+1f, 0x1.080194p+1f},  // "a\0b"
     }},
    // Redraws happen in the rows of 1000000000000000 (element 5) and "" (element 2).
    {"truncated_normal",
     {InitializerKind::kTruncatedNormal, -1.0f, 0.1f, -99},
     {
         {-0x1.f2898p-1f, -0x1.f2c06cp-1f, -0x1.285a3cp+0f, -0x1.1fb9dcp+0f, -0x1.02127cp+0f,
          -0x1.09861p+0f, -0x1.0c5e3ap+0f, -0x1.f1a2bp-1f},  // 0
         {-0x1.efe92ap-1f, -0x1.097e38p+0f, -0x1.bf4a8ep-1f, -0x1.1966bcp+0f, -0x1.03b53cp+0f,
          -0x1.fd41fcp-1f, -0x1.ca44dp-1f, -0x1.d27cfep-1f},  // -1
         {-0x1.de70fep-1f, -0x1.ec8c5cp-1f, -0x1.07b422p+0f, -0x1.ffd66p-1f, -0x1.f4b31p-1f,
          -0x1.099762p+0f, -0x1.32e75cp+0f, -0x1.017d0ap+0f},  // 10^15
         {-0x1.011552p+0f, -0x1.2b0718p+0f, -0x1.c9c66cp-1f, -0x1.11d632p+0f, -0x1.0a085ap+0f,
          -0x1.fe62d4p-1f, -0x1.e8e722p-1f, -0x1.f919fap-1f},  // INT64_MAX
         {-0x1.dc7be8p-1f, -0x1.dc916p-1f, -0x1.2b9b6p+0f, -0x1.fb470ap-1f, -0x1.0997p+0f,
          -0x1.20b41ep+0f, -0x1.198724p+0f, -0x1.0ed454p+0f},  // ""
         {-0x1.ea7de4p-1f, -0x1.0955ccp+0f, -0x1.0ef006p+0f, -0x1.16b1b8p+0f, -0x1.115542p+0f,
          -0x1.07c0e6p+0f, -0x1.01774ap+0f, -0x1.b40dc8p-1f},  // "abcdefghi"
         {-0x1.fbdb18p-1f, -0x1.f658eap-1f, -0x1.ef322cp-1f, -0x1.01a712p+0f, -0x1.0222f2p+0f,
          -0x1.2114d2p+0f, -0x1.fee352p-1f, -0x1.ce2e46p-1f},  // "a\0b"
     }},
};

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Bit-exact, so that neither a drift in the last place nor -0.0 for 0.0 goes unnoticed.
void ExpectRow(const float* actual, const float* pinned, int dim, const std::string& what) {
  for (int j = 0; j < dim; ++j) {
    EXPECT_EQ(Bits(actual[j]), Bits(pinned[j]))
        << what << ", element " << j << ": got " << std::hexfloat << actual[j] << ", pinned "
        << pinned[j];
  }
}

std::string Describe(const GoldenRows& golden, int key_index) {
  return std::string(golden.name) + " row of " +
         (key_index < 4 ? "int64 key " + std::to_string(kRowInt64Keys[key_index])
                        : "string key '" + kRowStringKeys[key_index - 4] + "'");
}

uint64_t RowKeyHash(int key_index) {
  return key_index < 4 ? InitialRowKeyHash(kRowInt64Keys[key_index])
                       : InitialRowKeyHash(std::string_view(kRowStringKeys[key_index - 4]));
}

TEST(InitialRowsGoldenTest, RandomKindsFillPinnedRows) {
  for (const auto& golden : kGoldenRows) {
    for (int k = 0; k < kNumRowKeys; ++k) {
      for (int dim : {kDim, 3}) {  // a narrower row is the prefix of a wider one
        std::vector<float> row(dim);
        FillInitialRow(golden.spec, RowKeyHash(k), row.data(), dim);
        ExpectRow(row.data(), golden.rows[k], dim,
                  Describe(golden, k) + " at dim " + std::to_string(dim));
      }
    }
  }
}

TEST(InitialRowsGoldenTest, ZerosAndConstantIgnoreKeyAndSeed) {
  const InitializerSpec zeros{InitializerKind::kZeros, 0.0f, 0.0f, 5};
  const InitializerSpec constant{InitializerKind::kConstant, 0.25f, -3.0f, 5};
  for (int k = 0; k < kNumRowKeys; ++k) {
    for (int dim : {kDim, 3}) {
      std::vector<float> row(dim, 1.0f);
      FillInitialRow(zeros, RowKeyHash(k), row.data(), dim);
      ExpectRow(row.data(), std::vector<float>(dim, 0x0p+0f).data(), dim, "zeros");
      FillInitialRow(constant, RowKeyHash(k), row.data(), dim);
      ExpectRow(row.data(), std::vector<float>(dim, 0x1p-2f).data(), dim, "constant 0.25");
    }
  }
}

// What a table serves for a missing key is the pinned row, whatever else the table holds, its
// shard count (storage layout), and whether the key was there before and removed.
template <typename Key, typename KeyOf>
void ExpectTableServesPinnedRows(const GoldenRows& golden, int first_key_index,
                                 const std::vector<Key>& golden_keys, KeyOf&& other_key) {
  for (int shard_bits : {0, 6}) {
    EmbeddingTable<Key> table(kDim, golden.spec, shard_bits);
    const std::vector<float> other_row(kDim, 7.0f);
    for (int i = 0; i < 5000; ++i) table.InsertOrAssign(other_key(i), other_row.data());
    for (int i = 0; i < 5000; i += 3) table.Remove(other_key(i));
    // Missing keys between present ones, so that FindBatch's prefetching path serves them.
    std::vector<Key> batch;
    for (size_t k = 0; k < golden_keys.size(); ++k) {
      batch.push_back(golden_keys[k]);
      batch.push_back(other_key(static_cast<int>(3 * k + 1)));
    }
    std::vector<float> rows(batch.size() * kDim);
    const int64_t found = table.FindBatch(
        static_cast<int64_t>(batch.size()),
        [&](int64_t i) { return typename KeyTraits<Key>::View(batch[i]); }, rows.data());
    EXPECT_EQ(found, static_cast<int64_t>(golden_keys.size()));
    for (size_t k = 0; k < golden_keys.size(); ++k) {
      const int key_index = first_key_index + static_cast<int>(k);
      const std::string what =
          Describe(golden, key_index) + ", shard_bits " + std::to_string(shard_bits);
      ExpectRow(rows.data() + 2 * k * kDim, golden.rows[key_index], kDim, what + " (FindBatch)");
      std::vector<float> row(kDim);
      EXPECT_FALSE(table.Find(golden_keys[k], row.data()));
      ExpectRow(row.data(), golden.rows[key_index], kDim, what + " (Find)");
      // A row created by an update (or an insert of slots) starts from the same values; once
      // removed, the key reads them again.
      table.Upsert(golden_keys[k], [&](RowRef& created, bool is_new) {
        EXPECT_TRUE(is_new);
        ExpectRow(created.embedding, golden.rows[key_index], kDim, what + " (created)");
        created.embedding[0] += 1.0f;
      });
      EXPECT_TRUE(table.Remove(golden_keys[k]));
      EXPECT_FALSE(table.Find(golden_keys[k], row.data()));
      ExpectRow(row.data(), golden.rows[key_index], kDim, what + " (after remove)");
    }
  }
}

TEST(InitialRowsGoldenTest, TablesServePinnedRowsWhateverTheyHold) {
  const std::vector<int64_t> int64_keys(std::begin(kRowInt64Keys), std::end(kRowInt64Keys));
  const std::vector<std::string> string_keys(std::begin(kRowStringKeys), std::end(kRowStringKeys));
  for (const auto& golden : kGoldenRows) {
    ExpectTableServesPinnedRows<int64_t>(golden, 0, int64_keys,
                                         [](int i) { return int64_t{1} + 7919 * int64_t{i}; });
    ExpectTableServesPinnedRows<std::string>(golden, 4, string_keys,
                                             [](int i) { return "other:" + std::to_string(i); });
  }
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
