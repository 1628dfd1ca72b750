#include "kernels/dynamic_embedding/core/initializers.h"

#include <cstring>

namespace tf_ext {
namespace de {

bool ParseInitializerKind(std::string_view name, InitializerKind* kind) {
  for (InitializerKind candidate : kInitializerKinds) {
    if (name == InitializerKindName(candidate)) {
      *kind = candidate;
      return true;
    }
  }
  return false;
}

const char* InitializerKindName(InitializerKind kind) {
  switch (kind) {
    case InitializerKind::kZeros:
      return "zeros";
    case InitializerKind::kConstant:
      return "constant";
    case InitializerKind::kUniform:
      return "uniform";
    case InitializerKind::kNormal:
      return "normal";
    case InitializerKind::kTruncatedNormal:
      return "truncated_normal";
  }
  return "unknown";
}

std::string InitializerKindNames() {
  std::string names;
  for (InitializerKind kind : kInitializerKinds) {
    names += names.empty() ? "" : ", ";
    names += InitializerKindName(kind);
  }
  return names;
}

uint64_t InitialRowKeyHash(std::string_view key) {  // frozen: see initializers.h
  // 8 bytes at a time through a multiply-xorshift; the length seeds the state so that
  // keys that differ only by trailing zero bytes hash apart.
  uint64_t h = Mix64(0x9e3779b97f4a7c15ULL ^ key.size());
  size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, key.data() + i, 8);
    h = Mix64(h ^ word) * 0x9e3779b97f4a7c15ULL;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, key.data() + i, key.size() - i);
  return Mix64(h ^ tail ^ (static_cast<uint64_t>(key.size() - i) << 56));
}

namespace {

// Version 2's normal and truncated-normal rows, as InitialRowElement computes them one by one,
// a pair of elements per Box-Muller transform in a loop the compiler vectorizes.
void FillFastNormalRow(const InitializerSpec& spec, const InitialRowStream& stream, float* out,
                       int dim) {
  const uint32_t low = stream.low(), high = stream.high();
  const int pairs = dim / 2;
  for (int k = 0; k < pairs; ++k) {
    fast_normal::NormalPair(low, high, static_cast<uint32_t>(k), &out[2 * k], &out[2 * k + 1]);
  }
  if (dim % 2 != 0) out[dim - 1] = stream.FastNormal(dim - 1);
  if (spec.kind == InitializerKind::kTruncatedNormal) {
    for (int j = 0; j < dim; ++j) {
      if (fabsf(out[j]) > 2.0f) out[j] = stream.Truncated(out[j], j);
    }
  }
  for (int j = 0; j < dim; ++j) out[j] = spec.a + spec.b * out[j];
}

}  // namespace

void FillInitialRow(const InitializerSpec& spec, uint64_t key_hash, float* out, int dim) {
  const InitialRowStream stream(key_hash, spec.seed);
  if (spec.version >= 2 &&
      (spec.kind == InitializerKind::kNormal || spec.kind == InitializerKind::kTruncatedNormal)) {
    FillFastNormalRow(spec, stream, out, dim);
    return;
  }
  if (spec.kind == InitializerKind::kTruncatedNormal) {
    TruncatedNormalRow(spec, stream, out, dim);
    return;
  }
  for (int j = 0; j < dim; ++j) out[j] = InitialRowElement(spec, stream, j);
}

}  // namespace de
}  // namespace tf_ext
