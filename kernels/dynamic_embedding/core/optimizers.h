// Row-wise optimizer updates over a table row and its co-located slots. Each function
// receives the row's update count *before* this update (Adam's bias correction uses the
// row's own step, so a row that appears in every batch matches dense Adam exactly and a
// rare row is not over-corrected).
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_

#include <cmath>
#include <cstdint>
#include <string_view>

namespace tf_ext {
namespace de {

enum class OptimizerKind { kSgd, kAdagrad, kAdam };

// The names of the op's `optimizer` attr (ops/dynamic_embedding_ops.cc). False if unknown, so a
// name the op allows but the kernel lacks is an error, not a silent SGD step.
inline bool ParseOptimizerKind(std::string_view name, OptimizerKind* kind) {
  if (name == "sgd") {
    *kind = OptimizerKind::kSgd;
  } else if (name == "adagrad") {
    *kind = OptimizerKind::kAdagrad;
  } else if (name == "adam") {
    *kind = OptimizerKind::kAdam;
  } else {
    return false;
  }
  return true;
}

struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 0.0f;
  // Adagrad: TF1 uses g / sqrt(acc), legacy Keras g / (sqrt(acc) + eps), Keras 2.11+
  // g / sqrt(acc + eps). false: outside, true: inside.
  bool epsilon_inside_sqrt = false;
};

inline int NumSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

// `slots` holds NumSlots(kind) consecutive blocks of `dim` floats.
inline void ApplyGradient(const OptimizerParams& p, int64_t prior_updates, const float* grad,
                          int dim, float* embedding, float* slots) {
  switch (p.kind) {
    case OptimizerKind::kSgd:
      for (int j = 0; j < dim; ++j) embedding[j] -= p.learning_rate * grad[j];
      return;
    case OptimizerKind::kAdagrad: {
      float* acc = slots;
      for (int j = 0; j < dim; ++j) {
        acc[j] += grad[j] * grad[j];
        const float denom =
            p.epsilon_inside_sqrt ? std::sqrt(acc[j] + p.epsilon) : std::sqrt(acc[j]) + p.epsilon;
        embedding[j] -= p.learning_rate * grad[j] / denom;
      }
      return;
    }
    case OptimizerKind::kAdam: {
      float* m = slots;
      float* v = slots + dim;
      const double t = static_cast<double>(prior_updates + 1);
      const float lr_t = static_cast<float>(
          p.learning_rate * std::sqrt(1.0 - std::pow(p.beta2, t)) / (1.0 - std::pow(p.beta1, t)));
      for (int j = 0; j < dim; ++j) {
        m[j] = p.beta1 * m[j] + (1.0f - p.beta1) * grad[j];
        v[j] = p.beta2 * v[j] + (1.0f - p.beta2) * grad[j] * grad[j];
        embedding[j] -= lr_t * m[j] / (std::sqrt(v[j]) + p.epsilon);
      }
      return;
    }
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
