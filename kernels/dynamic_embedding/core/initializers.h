// Deterministic per-key initial rows: the value of element j of a row depends only on
// (key, seed, j), so an id gets the same initial row whatever batch or order it arrives in,
// and a lookup of a missing id can compute it without touching the table.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_

#include <math.h>

#include <cstdint>
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
};

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

 private:
  uint64_t base_;
};

// Element j of the initial row of a key (whose stream is `stream`) for every kind but
// kTruncatedNormal.
TF_EXT_HOST_DEVICE inline float InitialRowElement(const InitializerSpec& spec,
                                                  const InitialRowStream& stream, int j) {
  switch (spec.kind) {
    case InitializerKind::kZeros:
      return 0.0f;
    case InitializerKind::kConstant:
      return spec.a;
    case InitializerKind::kUniform:
      return static_cast<float>(spec.a + (spec.b - spec.a) * stream.OpenUnit(j + 1));
    default:  // kNormal
      return static_cast<float>(spec.a + spec.b * stream.Normal(2 * static_cast<uint64_t>(j) + 1));
  }
}

// A whole kTruncatedNormal row: redraws outside two standard deviations, as TensorFlow's
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
