// The TOPK compression core alone: selection against a sort-based reference, error feedback,
// fp16 conversion against the compiler's _Float16, the wire format and bad plans.
#include "kernels/lightcc/core/topk_compression.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace tf_ext {
namespace lightcc {
namespace {

SegmentPlan Plan(const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts) {
  SegmentPlan plan;
  std::string error;
  EXPECT_TRUE(MakeSegmentPlan(lengths, counts, &plan, &error)) << error;
  return plan;
}

// The k entries of largest |x|, ties to the lower index, by a full sort.
std::set<int32_t> ReferenceTopK(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  return std::set<int32_t>(order.begin(), order.begin() + k);
}

struct Decoded {
  std::vector<int32_t> indices;
  std::vector<float> values;
};

Decoded Decode(const std::vector<int32_t>& payload, const PayloadLayout& layout) {
  Decoded out;
  out.indices.assign(payload.begin(), payload.begin() + layout.num_selected);
  const unsigned char* bytes =
      reinterpret_cast<const unsigned char*>(payload.data() + layout.num_selected);
  for (int64_t j = 0; j < layout.num_selected; ++j) {
    if (layout.half_values) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * j, 2);
      out.values.push_back(HalfToFloat(h));
    } else {
      float v;
      std::memcpy(&v, bytes + 4 * j, 4);
      out.values.push_back(v);
    }
  }
  return out;
}

std::vector<float> Gaussian(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (nan) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
    }
  }
}

#if defined(__FLT16_MAX__)
TEST(Half, MatchesCompilerFloat16) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    // Bias towards the half range (|x| < 2^17) so that rounding, subnormals and overflow all occur.
    uint32_t b = bits(rng);
    if (i % 2) b = (b & 0x80ffffffu) | ((100u + (b >> 24) % 48u) << 23);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    const _Float16 reference = static_cast<_Float16>(f);
    uint16_t expected;
    std::memcpy(&expected, &reference, 2);
    ASSERT_EQ(FloatToHalf(f), expected) << "float bits 0x" << std::hex << b;
    const float back = HalfToFloat(expected), reference_back = static_cast<float>(reference);
    ASSERT_EQ(std::memcmp(&back, &reference_back, 4), 0) << "half 0x" << std::hex << expected;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}
#endif

TEST(Select, MatchesSortReferenceAcrossSizesAndTies) {
  const std::vector<int64_t> sizes = {1, 2, 7, 100, 16383, 16384, 70000, 300000};
  for (int64_t n : sizes) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5, 1.0}) {
      std::vector<float> g = Gaussian(n, static_cast<uint32_t>(n));
      // Ties: a block of equal magnitudes (both signs) and exact zeros.
      for (int64_t i = 0; i < n / 3; ++i) g[i] = (i % 2 ? 0.75f : -0.75f);
      for (int64_t i = n / 3; i < n / 2; ++i) g[i] = 0.0f;
      const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * n)));
      std::vector<float> residual(n, 0.0f);
      const SegmentPlan plan = Plan({n}, {k});
      const PayloadLayout layout{k, false};
      std::vector<int32_t> payload(layout.words());
      Compress(g.data(), residual.data(), plan, false, payload.data());
      const Decoded d = Decode(payload, layout);
      EXPECT_EQ(std::set<int32_t>(d.indices.begin(), d.indices.end()), ReferenceTopK(g, k))
          << "n=" << n << " k=" << k;
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(d.values[j], g[d.indices[j]]);
    }
  }
}

TEST(Select, ResidualKeepsExactlyWhatWasNotSent) {
  const int64_t n = 50000, k = 500;
  std::vector<float> r = Gaussian(n, 1, 0.1f), g = Gaussian(n, 2);
  std::vector<float> accumulated(n);
  for (int64_t i = 0; i < n; ++i) accumulated[i] = r[i] + g[i];
  for (bool half : {false, true}) {
    std::vector<float> residual = r;
    const PayloadLayout layout{k, half};
    std::vector<int32_t> payload(layout.words());
    Compress(g.data(), residual.data(), Plan({n}, {k}), half, payload.data());
    const Decoded d = Decode(payload, layout);
    EXPECT_EQ(std::set<int32_t>(d.indices.begin(), d.indices.end()), ReferenceTopK(accumulated, k));
    std::vector<float> sent(n, 0.0f);
    for (int64_t j = 0; j < k; ++j) sent[d.indices[j]] = d.values[j];
    int64_t rounding_kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(residual[i], accumulated[i] - sent[i]) << i;
      if (half && sent[i] != 0.0f) {
        EXPECT_EQ(sent[i], HalfToFloat(FloatToHalf(accumulated[i])));
        rounding_kept += residual[i] != 0.0f;
      }
    }
    // Few Gaussian floats are exact halves: nearly every sent entry leaves its rounding behind.
    if (half) {
      EXPECT_GT(rounding_kept, k * 9 / 10);
    }
  }
}

TEST(Select, Fp16SaturatesAndKeepsTheExcess) {
  std::vector<float> g = {1e6f, -3e5f, 1.0f, 2.0f};
  std::vector<float> residual(4, 0.0f);
  const PayloadLayout layout{2, true};
  std::vector<int32_t> payload(layout.words());
  Compress(g.data(), residual.data(), Plan({4}, {2}), true, payload.data());
  const Decoded d = Decode(payload, layout);
  std::map<int32_t, float> sent;
  for (int j = 0; j < 2; ++j) sent[d.indices[j]] = d.values[j];
  EXPECT_EQ(sent.at(0), 65504.0f);
  EXPECT_EQ(sent.at(1), -65504.0f);
  EXPECT_EQ(residual[0], 1e6f - 65504.0f);
  EXPECT_EQ(residual[1], -3e5f + 65504.0f);
  EXPECT_EQ(residual[2], 1.0f);
}

TEST(Select, SegmentsAreIndependentAndIndicesAbsolute) {
  const std::vector<int64_t> lengths = {0, 5, 20000, 3, 40000};
  const std::vector<int64_t> counts = {0, 2, 200, 3, 2};
  const SegmentPlan plan = Plan(lengths, counts);
  EXPECT_EQ(plan.total_length, 60008);
  EXPECT_EQ(plan.total_selected, 207);
  std::vector<float> g = Gaussian(plan.total_length, 3);
  std::vector<float> residual(plan.total_length, 0.0f);
  const PayloadLayout layout{plan.total_selected, true};
  std::vector<int32_t> payload(layout.words(), -1);
  Compress(g.data(), residual.data(), plan, true, payload.data());
  const Decoded d = Decode(payload, layout);
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t begin = plan.buffer_offsets[s];
    std::vector<float> part(g.begin() + begin, g.begin() + begin + lengths[s]);
    std::set<int32_t> expected;
    for (int32_t i : ReferenceTopK(part, counts[s]))
      expected.insert(static_cast<int32_t>(i + begin));
    const int64_t from = plan.selected_offsets[s];
    std::set<int32_t> got(d.indices.begin() + from, d.indices.begin() + from + counts[s]);
    EXPECT_EQ(got, expected) << "segment " << s;
  }
  // The odd number of halves leaves a zero padding half, the payload's last two bytes.
  ASSERT_EQ(layout.words(), 207 + 104);
  uint16_t padding;
  std::memcpy(&padding, reinterpret_cast<const unsigned char*>(payload.data() + 207) + 2 * 207, 2);
  EXPECT_EQ(padding, 0);
}

TEST(ErrorFeedback, RunningSumOfSentApproachesRunningSumOfGradients) {
  const int64_t n = 20000, k = 200;  // 1 %
  std::vector<float> residual(n, 0.0f), sum_sent(n, 0.0f), sum_gradient(n, 0.0f);
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> mean = Gaussian(n, 12, 0.5f);
  const PayloadLayout layout{k, true};
  std::vector<int32_t> payload(layout.words());
  auto gap = [&] {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      diff += std::pow(sum_sent[i] - sum_gradient[i], 2);
      norm += std::pow(sum_gradient[i], 2);
    }
    return std::sqrt(diff / norm);
  };
  double gap_early = 0;
  for (int step = 1; step <= 400; ++step) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = mean[i] + noise(rng);
    for (int64_t i = 0; i < n; ++i) sum_gradient[i] += g[i];
    Compress(g.data(), residual.data(), Plan({n}, {k}), true, payload.data());
    const Decoded d = Decode(payload, layout);
    for (int64_t j = 0; j < k; ++j) sum_sent[d.indices[j]] += d.values[j];
    if (step == 20) gap_early = gap();
  }
  // The gap is exactly the residual, which stays bounded while the sums grow.
  EXPECT_LT(gap(), 0.5 * gap_early);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum_gradient[i] - sum_sent[i], residual[i],
                1e-2f * (1 + std::fabs(sum_gradient[i])));
  }
}

TEST(Decompress, SumsEveryPayloadAndScales) {
  const PayloadLayout layout{2, false};
  // Two ranks' payloads: indices then values.
  float values[4] = {1.5f, -2.0f, 4.0f, 0.25f};
  std::vector<int32_t> payloads(8);
  payloads[0] = 3, payloads[1] = 0;
  std::memcpy(&payloads[2], &values[0], 8);
  payloads[4] = 3, payloads[5] = 4;
  std::memcpy(&payloads[6], &values[2], 8);
  std::vector<float> dense(5, 99.0f);
  ASSERT_TRUE(DecompressSum(payloads.data(), 2, layout, 5, 0.5f, dense.data()));
  EXPECT_EQ(dense, (std::vector<float>{-1.0f, 0.0f, 0.0f, 2.75f, 0.125f}));
  payloads[5] = 5;  // out of range
  EXPECT_FALSE(DecompressSum(payloads.data(), 2, layout, 5, 1.0f, dense.data()));
  payloads[5] = -1;
  EXPECT_FALSE(DecompressSum(payloads.data(), 2, layout, 5, 1.0f, dense.data()));
}

TEST(Decompress, HalfPayloadRoundTrip) {
  const int64_t n = 30000, k = 301;
  std::vector<float> g = Gaussian(n, 5), residual(n, 0.0f);
  const PayloadLayout layout{k, true};
  std::vector<int32_t> payload(layout.words());
  Compress(g.data(), residual.data(), Plan({n}, {k}), true, payload.data());
  std::vector<float> dense(n);
  ASSERT_TRUE(DecompressSum(payload.data(), 1, layout, n, 1.0f, dense.data()));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dense[i] + residual[i], g[i]) << i;
}

TEST(Plan, RejectsBadSegments) {
  SegmentPlan plan;
  std::string error;
  EXPECT_FALSE(MakeSegmentPlan({10}, {11}, &plan, &error));
  EXPECT_NE(error.find("segment 0"), std::string::npos) << error;
  EXPECT_FALSE(MakeSegmentPlan({10}, {0}, &plan, &error));
  EXPECT_FALSE(MakeSegmentPlan({-1}, {0}, &plan, &error));
  EXPECT_FALSE(MakeSegmentPlan({10, 3}, {1}, &plan, &error));
  EXPECT_NE(error.find("differ"), std::string::npos) << error;
  EXPECT_FALSE(MakeSegmentPlan({int64_t{1} << 31}, {1}, &plan, &error));
  EXPECT_NE(error.find("int32"), std::string::npos) << error;
  EXPECT_TRUE(MakeSegmentPlan({0, 4}, {0, 4}, &plan, &error)) << error;
}

}  // namespace
}  // namespace lightcc
}  // namespace tf_ext
