#include "kernels/dynamic_embedding/core/initializers.h"

#include <cmath>
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

// Counter-based stream: the n-th draw for a key is a pure function of (key, seed, n).
class KeyStream {
 public:
  KeyStream(uint64_t key_hash, int64_t seed)
      : base_(Mix64(key_hash ^ Mix64(static_cast<uint64_t>(seed) + 0x632be59bd9b4e019ULL))) {}
  // Uniform in (0, 1): never exactly 0, so log() below is finite.
  double NextOpenUnit() {
    uint64_t bits = Mix64(base_ + 0x9e3779b97f4a7c15ULL * ++counter_);
    return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  double NextNormal() {
    const double u1 = NextOpenUnit(), u2 = NextOpenUnit();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t base_;
  uint64_t counter_ = 0;
};

}  // namespace

void FillInitialRow(const InitializerSpec& spec, uint64_t key_hash, float* out, int dim) {
  switch (spec.kind) {
    case InitializerKind::kZeros:
      std::memset(out, 0, sizeof(float) * dim);
      return;
    case InitializerKind::kConstant:
      for (int j = 0; j < dim; ++j) out[j] = spec.a;
      return;
    default:
      break;
  }
  KeyStream stream(key_hash, spec.seed);
  for (int j = 0; j < dim; ++j) {
    double value;
    if (spec.kind == InitializerKind::kUniform) {
      value = spec.a + (spec.b - spec.a) * stream.NextOpenUnit();
    } else if (spec.kind == InitializerKind::kNormal) {
      value = spec.a + spec.b * stream.NextNormal();
    } else {  // Truncated normal: redraw outside two standard deviations.
      double z;
      do z = stream.NextNormal();
      while (std::fabs(z) > 2.0);
      value = spec.a + spec.b * z;
    }
    out[j] = static_cast<float>(value);
  }
}

}  // namespace de
}  // namespace tf_ext
