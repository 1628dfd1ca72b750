// Deterministic per-key initial rows: the value of element j of a row depends only on
// (key, seed, j), so an id gets the same initial row whatever batch or order it arrives in,
// and a lookup of a missing id can compute it without touching the table.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_

#include <cstdint>
#include <string>
#include <string_view>

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

// Parses "zeros", "constant", "uniform", "normal", "truncated_normal". False if unknown.
bool ParseInitializerKind(std::string_view name, InitializerKind* kind);
const char* InitializerKindName(InitializerKind kind);

inline uint64_t Mix64(uint64_t x) {  // splitmix64's finalizer: a bijection on 64 bits.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline uint64_t HashKey(int64_t key) { return Mix64(static_cast<uint64_t>(key)); }
uint64_t HashKey(std::string_view key);

// Fills `dim` floats for the key whose HashKey is `key_hash`.
void FillInitialRow(const InitializerSpec& spec, uint64_t key_hash, float* out, int dim);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
