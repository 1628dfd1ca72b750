// Deterministic per-key initial rows: the value of element j of a row depends only on
// (key, seed, j), so an id gets the same initial row whatever batch or order it arrives in,
// and a lookup of a missing id can compute it without touching the table.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_

#include <math.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kernels/dynamic_embedding/core/host_device.h"

namespace tf_ext {
namespace de {

enum class InitializerKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

struct InitializerSpec {
  InitializerKind kind = InitializerKind::kZeros;
  // kConstant: a = value. kUniform: [a, b). kNormal / kTruncatedNormal: mean a, stddev b
  // (truncated at two standard deviations, as TensorFlow's truncated_normal).
  float a = 0.0f;
  float b = 0.0f;
  int64_t seed = 0;
  // Which generator computes normal and truncated-normal rows (the other kinds are the same in
  // every version): 1, the first, FROZEN and the default; 2, FastNormalPair's float math, about
  // ten times faster per row. A table keeps its version for life (see docs/dynamic_embedding.md).
  int version = 1;
};

constexpr int kOldestInitializerVersion = 1;
constexpr int kNewestInitializerVersion = 2;

// Every kind. Their names (InitializerKindName) are what ParseInitializerKind accepts: "zeros",
// "constant", "uniform", "normal", "truncated_normal" (tf_ext/dynamic_embedding/initializers.py
// KINDS, checked by tests/dynamic_embedding/test_op_facts.py).
constexpr InitializerKind kInitializerKinds[] = {
    InitializerKind::kZeros, InitializerKind::kConstant, InitializerKind::kUniform,
    InitializerKind::kNormal, InitializerKind::kTruncatedNormal};

// False if `name` is not the name of a kind.
bool ParseInitializerKind(std::string_view name, InitializerKind* kind);
const char* InitializerKindName(InitializerKind kind);
// "zeros, constant, ...": for error messages.
std::string InitializerKindNames();

TF_EXT_HOST_DEVICE inline uint64_t Mix64(
    uint64_t x) {  // splitmix64's finalizer: a bijection on 64 bits.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The key hash of initial rows. FROZEN: the row a served model returns for an id it never
// trained on, and the starting value of every new row, is
//   FillInitialRow(spec, InitialRowKeyHash(key), row, dim),
// so changing this function (or Mix64, or FillInitialRow) silently changes the untrained rows of
// every saved model. tests/kernels/dynamic_embedding/initial_rows_golden_test.cc and
// tests/dynamic_embedding/test_golden.py pin its values. Where a key is stored is decided by the
// table's own StorageHash (embedding_table.h), which is free to change: tune that one.
TF_EXT_HOST_DEVICE inline uint64_t InitialRowKeyHash(int64_t key) {
  return Mix64(static_cast<uint64_t>(key));
}
uint64_t InitialRowKeyHash(std::string_view key);

// Version 2 of normal rows: float32 Box-Muller from one 32-bit counter-based hash per uniform,
// with a polynomial log and sine/cosine in plain float arithmetic (no math library, whose last
// bits differ between builds and devices), so a row is exact to the bit on every CPU build and on
// the GPU (-fmad=false), and a loop over a row vectorizes. FROZEN once released, as version 1.
// Its normals are exact Box-Muller transforms of 24-bit uniforms up to the polynomials' error
// (a few float ulp), so the tails stop at sqrt(2 * 25 * ln 2) = 5.89 standard deviations.
namespace fast_normal {

TF_EXT_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits;
#endif
}
TF_EXT_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
#endif
}

// A bijection on 32 bits (two multiply-xorshift rounds).
TF_EXT_HOST_DEVICE inline uint32_t Hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// Draw n of the stream whose 64-bit base is (base_lo, base_hi): distinct for distinct n < 2^32.
TF_EXT_HOST_DEVICE inline uint32_t Draw(uint32_t base_lo, uint32_t base_hi, uint32_t n) {
  return Hash32(Hash32(base_lo + 0x9e3779b9U * n) ^ base_hi);
}

// ln(u) for u in (0, 1]: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
// ln(m) = 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^9. Selections
// are integer arithmetic, not branches: the compiler vectorizes the loops around it.
TF_EXT_HOST_DEVICE inline float Log(float u) {
  const uint32_t bits = FloatBits(u);
  const uint32_t mantissa = bits & 0x007fffffU;
  const uint32_t high = mantissa > 0x3504f3U ? 1U : 0U;  // m in [1, 2) above sqrt(2): halve it
  const float m = BitsFloat((mantissa | 0x3f800000U) - (high << 23));
  const int exponent = static_cast<int>(bits >> 23) - 127 + static_cast<int>(high);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float series =
      1.0f + s2 * (0.333333333f + s2 * (0.2f + s2 * (0.142857143f + s2 * 0.111111111f)));
  return static_cast<float>(exponent) * 0.693147181f + 2.0f * s * series;
}

// (cos, sin) of a uniform angle from the top 24 bits of `bits`: the top 3 pick the octant, the
// other 21 the angle t in (0, pi/4) within it, by Taylor polynomials (sin to t^9, cos to t^8);
// the octant then swaps and negates them, exactly (bit operations).
TF_EXT_HOST_DEVICE inline void CosSin(uint32_t bits, float* cos_out, float* sin_out) {
  const uint32_t octant = bits >> 29;
  const float t = (static_cast<float>(static_cast<int32_t>((bits >> 8) & 0x1fffffU)) + 0.5f) *
                  (0.785398163f / 2097152.0f);
  const float t2 = t * t;
  const float s =
      t * (1.0f + t2 * (-0.166666667f +
                        t2 * (0.00833333333f + t2 * (-0.000198412698f + t2 * 2.75573192e-6f))));
  const float c =
      1.0f + t2 * (-0.5f + t2 * (0.0416666667f + t2 * (-0.00138888889f + t2 * 2.48015873e-5f)));
  // Octant o covers [o pi/4, (o + 1) pi/4): angle t in even octants, pi/4 - t measured back from
  // the octant's end in odd ones (still uniform). So cos and sin swap in octants 1, 2, 5 and 6;
  // cos is negative in 2 to 5, sin in 4 to 7.
  const uint32_t swap = 0U - (((octant + 1) >> 1) & 1U);  // all ones or zero
  const uint32_t cos_sign = (((octant + 2) >> 2) & 1U) << 31;
  const uint32_t sin_sign = ((octant >> 2) & 1U) << 31;
  const uint32_t s_bits = FloatBits(s), c_bits = FloatBits(c);
  *cos_out = BitsFloat(((c_bits & ~swap) | (s_bits & swap)) ^ cos_sign);
  *sin_out = BitsFloat(((s_bits & ~swap) | (c_bits & swap)) ^ sin_sign);
}

// Standard normals 2k and 2k + 1 of the stream, from draws 2k + 1 (radius) and 2k + 2 (angle).
TF_EXT_HOST_DEVICE inline void NormalPair(uint32_t base_lo, uint32_t base_hi, uint32_t k, float* z0,
                                          float* z1) {
  const uint32_t radius_bits = Draw(base_lo, base_hi, 2 * k + 1);
  const float u = (static_cast<float>(static_cast<int32_t>(radius_bits >> 8)) + 0.5f) *
                  (1.0f / 16777216.0f);  // (0, 1)
  const float r = sqrtf(-2.0f * Log(u));
  float c, s;
  CosSin(Draw(base_lo, base_hi, 2 * k + 2), &c, &s);
  *z0 = r * c;
  *z1 = r * s;
}

// The redraw `attempt` (>= 1) of element j of a truncated-normal row: a stream of its own (the
// base's high word salted by the attempt), so each element redraws independently of the others.
TF_EXT_HOST_DEVICE inline float Redraw(uint32_t base_lo, uint32_t base_hi, uint32_t j,
                                       uint32_t attempt) {
  float z, unused;
  NormalPair(base_lo, Hash32(base_hi + 0x632be59bU * attempt), j, &z, &unused);
  return z;
}

}  // namespace fast_normal

// The counter-based stream of a key's initial row: its n-th draw (n >= 1) is a pure function of
// (key hash, seed, n). FROZEN with InitialRowKeyHash. Its functions run on the CPU and on the GPU
// (host_device.h), so both tables fill the same rows: element j of a uniform row is draw j + 1,
// of a normal row draws 2j + 1 and 2j + 2; a truncated-normal row redraws, so its elements come
// in order (TruncatedNormalRow).
class InitialRowStream {
 public:
  TF_EXT_HOST_DEVICE InitialRowStream(uint64_t key_hash, int64_t seed)
      : base_(Mix64(key_hash ^ Mix64(static_cast<uint64_t>(seed) + 0x632be59bd9b4e019ULL))) {}
  // Uniform in (0, 1): never exactly 0, so log() below is finite.
  TF_EXT_HOST_DEVICE double OpenUnit(uint64_t n) const {
    const uint64_t bits = Mix64(base_ + 0x9e3779b97f4a7c15ULL * n);
    return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  // A standard normal from draws n and n + 1 (Box-Muller).
  TF_EXT_HOST_DEVICE double Normal(uint64_t n) const {
    const double u1 = OpenUnit(n), u2 = OpenUnit(n + 1);
    return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
  }
  // Version 2 (fast_normal): standard normal j of a normal row; of a truncated-normal row, the
  // same unless beyond two standard deviations, then redrawn.
  TF_EXT_HOST_DEVICE float FastNormal(int j) const {
    float z0, z1;
    fast_normal::NormalPair(low(), high(), static_cast<uint32_t>(j) >> 1, &z0, &z1);
    return (j & 1) ? z1 : z0;
  }
  TF_EXT_HOST_DEVICE float FastTruncatedNormal(int j) const { return Truncated(FastNormal(j), j); }
  // z, element j's first draw, or if |z| > 2 its first redraw within two standard deviations.
  TF_EXT_HOST_DEVICE float Truncated(float z, int j) const {
    for (uint32_t attempt = 1; fabsf(z) > 2.0f; ++attempt) {
      z = fast_normal::Redraw(low(), high(), static_cast<uint32_t>(j), attempt);
    }
    return z;
  }
  TF_EXT_HOST_DEVICE uint32_t low() const { return static_cast<uint32_t>(base_); }
  TF_EXT_HOST_DEVICE uint32_t high() const { return static_cast<uint32_t>(base_ >> 32); }

 private:
  uint64_t base_;
};

// Whether InitialRowElement computes every element of the spec's rows on its own: all but
// version 1's truncated normal, whose redraws run along the row (TruncatedNormalRow).
TF_EXT_HOST_DEVICE inline bool RowElementsAreIndependent(const InitializerSpec& spec) {
  return spec.kind != InitializerKind::kTruncatedNormal || spec.version >= 2;
}

// Element j of the initial row of a key (whose stream is `stream`) for a spec whose
// RowElementsAreIndependent.
TF_EXT_HOST_DEVICE inline float InitialRowElement(const InitializerSpec& spec,
                                                  const InitialRowStream& stream, int j) {
  switch (spec.kind) {
    case InitializerKind::kZeros:
      return 0.0f;
    case InitializerKind::kConstant:
      return spec.a;
    case InitializerKind::kUniform:
      return static_cast<float>(spec.a + (spec.b - spec.a) * stream.OpenUnit(j + 1));
    case InitializerKind::kTruncatedNormal:  // version 2
      return spec.a + spec.b * stream.FastTruncatedNormal(j);
    default:  // kNormal
      if (spec.version >= 2) return spec.a + spec.b * stream.FastNormal(j);
      return static_cast<float>(spec.a + spec.b * stream.Normal(2 * static_cast<uint64_t>(j) + 1));
  }
}

// A whole version 1 kTruncatedNormal row: redraws outside two standard deviations, as TensorFlow's
// truncated_normal does.
TF_EXT_HOST_DEVICE inline void TruncatedNormalRow(const InitializerSpec& spec,
                                                  const InitialRowStream& stream, float* out,
                                                  int dim) {
  uint64_t n = 1;
  for (int j = 0; j < dim; ++j) {
    double z;
    do {
      z = stream.Normal(n);
      n += 2;
    } while (::fabs(z) > 2.0);
    out[j] = static_cast<float>(spec.a + spec.b * z);
  }
}

// Fills `dim` floats: the initial row of the key whose InitialRowKeyHash is `key_hash`. Element j
// depends only on (key_hash, spec, j), so a row of a smaller dim is a prefix of a wider one.
void FillInitialRow(const InitializerSpec& spec, uint64_t key_hash, float* out, int dim);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
