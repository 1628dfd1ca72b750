// Version 2 of normal and truncated-normal initial rows (initializers.h, fast_normal): golden
// rows pinned to the bit (a failure means the change would silently alter the untrained rows of
// every saved model with version 2 tables), the per-element form the GPU table computes equal to
// FillInitialRow's vectorized one, and the distribution: mean, standard deviation, tails and the
// truncation at two standard deviations. Version 1 is pinned by initial_rows_golden_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/initializers.h"

namespace tf_ext {
namespace de {
namespace {

constexpr int kDim = 8;
const int64_t kRowInt64Keys[] = {0, -1, 1000000000000000, std::numeric_limits<int64_t>::max()};
const std::string kRowStringKeys[] = {std::string("", 0), std::string("abcdefghi", 9),
                                      std::string("a\0b", 3)};
constexpr int kNumRowKeys = 7;  // kRowInt64Keys, then kRowStringKeys

uint64_t RowKeyHash(int key_index) {
  return key_index < 4 ? InitialRowKeyHash(kRowInt64Keys[key_index])
                       : InitialRowKeyHash(std::string_view(kRowStringKeys[key_index - 4]));
}

InitializerSpec Spec(InitializerKind kind, float a, float b, int64_t seed) {
  InitializerSpec spec{kind, a, b, seed};
  spec.version = 2;
  return spec;
}

struct GoldenRows {
  const char* name;
  InitializerSpec spec;
  float rows[kNumRowKeys][kDim];
};

// Recorded from this commit's first version 2, exact to the bit (hex float literals).
const GoldenRows kGoldenRows[] = {
    {"normal v2",
     Spec(InitializerKind::kNormal, 0.5f, 2.0f, 123),
     {
         {-0x1.a36b84p-1f, -0x1.5265d8p-2f, 0x1.8ddc0ap-2f, 0x1.5c2112p+1f, 0x1.e8530ep+0f,
          -0x1.890774p+0f, -0x1.9b294cp+0f, -0x1.ae0d1p-1f},  // 0
         {-0x1.c0744cp+1f, 0x1.9c6894p+0f, -0x1.6fa65p-1f, -0x1.6f6b34p-1f, 0x1.fb5b18p-1f,
          -0x1.01150ap+0f, 0x1.2e7b58p+1f, -0x1.5979ep-2f},  // -1
         {0x1.a3bbecp+1f, 0x1.8866ep-2f, -0x1.235a1ap+1f, 0x1.40d3c8p-1f, -0x1.8b6468p+0f,
          0x1.14143p+0f, -0x1.0b5b94p+0f, 0x1.20c856p+0f},  // 10^15
         {0x1.1df0e4p+1f, 0x1.b0a8ecp+0f, -0x1.e38274p+0f, 0x1.34a64ep+2f, -0x1.3083aep+0f,
          -0x1.92798p-3f, 0x1.fab7ep+1f, 0x1.b3b696p+1f},  // INT64_MAX
         {0x1.8ed112p+1f, -0x1.1b3cb4p+2f, 0x1.090b98p+0f, 0x1.0c60cep+2f, 0x1.2f7844p+1f,
          -0x1.3a7346p+0f, 0x1.5af4c4p+1f, 0x1.c6342cp-1f},  // ""
         {0x1.95425ep+2f, 0x1.3dbbb8p+1f, -0x1.07c698p-1f, 0x1.17facp+0f, 0x1.8d00fp-1f,
          0x1.ef896p-1f, 0x1.dbd28ap+2f, 0x1.a5e5aap+0f},  // "abcdefghi"
         {0x1.46b76cp+0f, 0x1.e4031p-3f, 0x1.59e846p+1f, -0x1.7e8776p+0f, -0x1.0492acp+0f,
          0x1.06a74p+2f, -0x1.82cd2cp+0f, 0x1.2c3488p-2f},  // "a\0b"
     }},
    // A redraw happens in the row of -1 (element 0).
    {"truncated_normal v2",
     Spec(InitializerKind::kTruncatedNormal, -1.0f, 0.1f, -99),
     {
         {-0x1.c3bf8ep-1f, -0x1.274b56p+0f, -0x1.e43c34p-1f, -0x1.9d5844p-1f, -0x1.dde7dap-1f,
          -0x1.dc1b6cp-1f, -0x1.f49ad4p-1f, -0x1.02c69ap+0f},  // 0
         {-0x1.08b1aep+0f, -0x1.f19022p-1f, -0x1.0f34d6p+0f, -0x1.0769cep+0f, -0x1.f55cep-1f,
          -0x1.ec19ecp-1f, -0x1.035e2cp+0f, -0x1.11fcc2p+0f},  // -1
         {-0x1.ffddbep-1f, -0x1.143bbp+0f, -0x1.0ca526p+0f, -0x1.d1852p-1f, -0x1.f68308p-1f,
          -0x1.e79f3cp-1f, -0x1.02346p+0f, -0x1.156c14p+0f},  // 10^15
         {-0x1.e73708p-1f, -0x1.0b9e48p+0f, -0x1.02c408p+0f, -0x1.032286p+0f, -0x1.e325fp-1f,
          -0x1.a0a846p-1f, -0x1.0c4dcep+0f, -0x1.b4a03p-1f},  // INT64_MAX
         {-0x1.d63498p-1f, -0x1.01e588p+0f, -0x1.07906p+0f, -0x1.0bd806p+0f, -0x1.16533cp+0f,
          -0x1.e6b91p-1f, -0x1.168168p+0f, -0x1.e5dd0cp-1f},  // ""
         {-0x1.1b0b58p+0f, -0x1.1c985ap+0f, -0x1.25d87cp+0f, -0x1.eeaa32p-1f, -0x1.eef30cp-1f,
          -0x1.019ea8p+0f, -0x1.2975ep+0f, -0x1.ae3468p-1f},  // "abcdefghi"
         {-0x1.b35358p-1f, -0x1.164f16p+0f, -0x1.112b46p+0f, -0x1.00d9c2p+0f, -0x1.ebf9p-1f,
          -0x1.06e1bcp+0f, -0x1.146aeap+0f, -0x1.ef306ap-1f},  // "a\0b"
     }},
};

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

TEST(InitialRowsVersion2Test, FillsPinnedRows) {
  for (const auto& golden : kGoldenRows) {
    for (int k = 0; k < kNumRowKeys; ++k) {
      for (int dim : {kDim, 5, 3}) {  // a narrower row is the prefix of a wider one, odd or even
        std::vector<float> row(dim);
        FillInitialRow(golden.spec, RowKeyHash(k), row.data(), dim);
        for (int j = 0; j < dim; ++j) {
          EXPECT_EQ(Bits(row[j]), Bits(golden.rows[k][j]))
              << golden.name << ", key " << k << ", dim " << dim << ", element " << j << ": got "
              << std::hexfloat << row[j] << ", pinned " << golden.rows[k][j];
        }
      }
    }
  }
}

TEST(InitialRowsVersion2Test, VersionsDifferOnlyForNormalKinds) {
  for (InitializerKind kind : kInitializerKinds) {
    InitializerSpec v1{kind, 0.25f, 0.75f, 7};
    InitializerSpec v2 = v1;
    v2.version = 2;
    std::vector<float> row1(kDim), row2(kDim);
    FillInitialRow(v1, RowKeyHash(2), row1.data(), kDim);
    FillInitialRow(v2, RowKeyHash(2), row2.data(), kDim);
    const bool normal =
        kind == InitializerKind::kNormal || kind == InitializerKind::kTruncatedNormal;
    EXPECT_EQ(row1 != row2, normal) << InitializerKindName(kind);
  }
}

// The GPU table computes each element on its own (InitialRowElement, per thread): the same bits.
TEST(InitialRowsVersion2Test, ElementsComputedOneByOneEqualTheRow) {
  for (InitializerKind kind : {InitializerKind::kNormal, InitializerKind::kTruncatedNormal}) {
    const InitializerSpec spec = Spec(kind, 0.1f, 1.5f, 11);
    ASSERT_TRUE(RowElementsAreIndependent(spec));
    for (int64_t key = -500; key < 500; ++key) {
      for (int dim : {1, 2, 7, 16, 33}) {
        std::vector<float> row(dim);
        const uint64_t hash = InitialRowKeyHash(key);
        FillInitialRow(spec, hash, row.data(), dim);
        const InitialRowStream stream(hash, spec.seed);
        for (int j = 0; j < dim; ++j) {
          ASSERT_EQ(Bits(row[j]), Bits(InitialRowElement(spec, stream, j)))
              << InitializerKindName(kind) << " key " << key << " dim " << dim << " element " << j;
        }
      }
    }
  }
}

TEST(InitialRowsVersion2Test, LogAndCosSinAreWithinAFewFloatUlps) {
  for (uint32_t i = 1; i <= (1U << 24); i += 37) {
    const float u = (static_cast<float>(i) - 0.5f) * (1.0f / 16777216.0f);
    const double exact = std::log(static_cast<double>(u));
    EXPECT_NEAR(fast_normal::Log(u), exact, 1e-6 + 4e-7 * std::fabs(exact)) << u;
  }
  for (uint32_t top = 0; top < (1U << 24); top += 101) {
    float c, s;
    fast_normal::CosSin(top << 8, &c, &s);
    // The angle the bits stand for: the octant, then t forwards (even) or backwards (odd).
    const uint32_t octant = top >> 21;
    const double t = ((top & 0x1fffffU) + 0.5) * (M_PI / 4 / 2097152.0);
    const double angle = octant * M_PI / 4 + ((octant & 1) ? M_PI / 4 - t : t);
    ASSERT_NEAR(c, std::cos(angle), 3e-7) << top;
    ASSERT_NEAR(s, std::sin(angle), 3e-7) << top;
  }
}

struct Moments {
  double mean = 0, stddev = 0, fourth = 0, largest = 0, beyond2 = 0, beyond3 = 0, lag1 = 0;
};

// Standard normals (spec mean 0, stddev 1) of 2^18 rows of dim 8.
Moments Measure(InitializerKind kind) {
  const InitializerSpec spec = Spec(kind, 0.0f, 1.0f, 2024);
  constexpr int kRows = 1 << 18;
  double sum = 0, sum2 = 0, sum4 = 0, products = 0;
  Moments m;
  std::vector<float> row(kDim);
  for (int64_t key = 0; key < kRows; ++key) {
    FillInitialRow(spec, InitialRowKeyHash(key), row.data(), kDim);
    for (int j = 0; j < kDim; ++j) {
      const double z = row[j];
      sum += z;
      sum2 += z * z;
      sum4 += z * z * z * z;
      m.largest = std::max(m.largest, std::fabs(z));
      m.beyond2 += std::fabs(z) > 2;
      m.beyond3 += std::fabs(z) > 3;
      if (j > 0) products += z * row[j - 1];
    }
  }
  const double n = double{kRows} * kDim;
  m.mean = sum / n;
  m.stddev = std::sqrt(sum2 / n - m.mean * m.mean);
  m.fourth = sum4 / n;
  m.beyond2 /= n;
  m.beyond3 /= n;
  m.lag1 = products / (double{kRows} * (kDim - 1));
  return m;
}

// 2^21 draws: the standard error of the mean is 0.0007, of a tail fraction near 0.0455 0.00014.
TEST(InitialRowsVersion2Test, NormalRowsHaveTheMomentsAndTailsOfANormal) {
  const Moments m = Measure(InitializerKind::kNormal);
  EXPECT_NEAR(m.mean, 0.0, 0.004);
  EXPECT_NEAR(m.stddev, 1.0, 0.003);
  EXPECT_NEAR(m.fourth, 3.0, 0.03);           // kurtosis of a normal
  EXPECT_NEAR(m.beyond2, 0.0455003, 0.0008);  // P(|z| > 2)
  EXPECT_NEAR(m.beyond3, 0.0026998, 0.0002);  // P(|z| > 3)
  EXPECT_NEAR(m.lag1, 0.0, 0.004);            // a pair's cos and sin halves are uncorrelated
  EXPECT_GT(m.largest, 4.5);
  EXPECT_LE(m.largest, 5.9);  // 24-bit uniforms: the tails stop at 5.89
}

TEST(InitialRowsVersion2Test, TruncatedNormalRowsStopAtTwoStandardDeviations) {
  const Moments m = Measure(InitializerKind::kTruncatedNormal);
  EXPECT_LE(m.largest, 2.0);
  EXPECT_GT(m.largest, 1.99);
  EXPECT_NEAR(m.mean, 0.0, 0.004);
  // A standard normal truncated to [-2, 2]: variance 1 - 4 phi(2) / (2 Phi(2) - 1) = 0.773741.
  EXPECT_NEAR(m.stddev, 0.879626, 0.003);
  EXPECT_NEAR(m.lag1, 0.0, 0.004);
}

TEST(InitialRowsVersion2Test, MeanAndStddevScaleTheStandardNormal) {
  const InitializerSpec unit = Spec(InitializerKind::kNormal, 0.0f, 1.0f, 5);
  const InitializerSpec scaled = Spec(InitializerKind::kNormal, -3.0f, 0.25f, 5);
  std::vector<float> z(kDim), row(kDim);
  FillInitialRow(unit, RowKeyHash(0), z.data(), kDim);
  FillInitialRow(scaled, RowKeyHash(0), row.data(), kDim);
  for (int j = 0; j < kDim; ++j) EXPECT_EQ(row[j], -3.0f + 0.25f * z[j]);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
