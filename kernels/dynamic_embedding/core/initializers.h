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

inline uint64_t Mix64(uint64_t x) {  // splitmix64's finalizer: a bijection on 64 bits.
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
inline uint64_t InitialRowKeyHash(int64_t key) { return Mix64(static_cast<uint64_t>(key)); }
uint64_t InitialRowKeyHash(std::string_view key);

// Fills `dim` floats: the initial row of the key whose InitialRowKeyHash is `key_hash`. Element j
// depends only on (key_hash, spec, j), so a row of a smaller dim is a prefix of a wider one.
void FillInitialRow(const InitializerSpec& spec, uint64_t key_hash, float* out, int dim);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_INITIALIZERS_H_
