// Row-wise optimizer updates over a table row and its co-located slots. Each function
// receives the row's update count *before* this update (Adam's bias correction uses the
// row's own step, so a row that appears in every batch matches dense Adam exactly and a
// rare row is not over-corrected).
//
// The arithmetic follows TensorFlow's sparse apply kernels (training_ops.cc) operation by
// operation, so a row updated here matches the same row of a dense variable updated by
// TensorFlow's optimizer to float rounding.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tf_ext {
namespace de {

enum class OptimizerKind {
  kSgd,
  kAdagrad,
  kAdam,
  kAmsgrad,        // Adam with AMSGrad's running maximum of the second moment
  kMomentum,       // tf.compat.v1.train.MomentumOptimizer: accum = mu * accum + g
  kKerasMomentum,  // Keras SGD(momentum): accum = mu * accum - lr * g
  kFtrl,
};

// The names of the op's `optimizer` attr (ops/dynamic_embedding_optimizer_ops.cc). False if
// unknown, so a name the op allows but the kernel lacks is an error, not a silent SGD step.
inline bool ParseOptimizerKind(std::string_view name, OptimizerKind* kind) {
  static constexpr struct {
    std::string_view name;
    OptimizerKind kind;
  } kNames[] = {
      {"sgd", OptimizerKind::kSgd},           {"adagrad", OptimizerKind::kAdagrad},
      {"adam", OptimizerKind::kAdam},         {"amsgrad", OptimizerKind::kAmsgrad},
      {"momentum", OptimizerKind::kMomentum}, {"keras_momentum", OptimizerKind::kKerasMomentum},
      {"ftrl", OptimizerKind::kFtrl},
  };
  for (const auto& entry : kNames) {
    if (entry.name == name) {
      *kind = entry.kind;
      return true;
    }
  }
  return false;
}

struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.0f;
  // Adam, AMSGrad.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 0.0f;  // also Adagrad's
  // Adagrad: TF1 uses g / sqrt(acc), legacy Keras g / (sqrt(acc) + eps), Keras 2.11+
  // g / sqrt(acc + eps). false: outside, true: inside.
  bool epsilon_inside_sqrt = false;
  // Adagrad's and FTRL's accumulator starts at this value.
  float initial_accumulator_value = 0.0f;
  // Both momentum kinds.
  float momentum = 0.0f;
  bool use_nesterov = false;
  // FTRL. l2 already includes FTRL's beta / (2 * learning_rate), as TensorFlow passes it.
  float l1 = 0.0f;
  float l2 = 0.0f;
  float l2_shrinkage = 0.0f;
  float learning_rate_power = -0.5f;
};

inline int NumSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kMomentum:
    case OptimizerKind::kKerasMomentum:
      return 1;  // accumulator; momentum
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl:
      return 2;  // m, v; accumulator, linear
    case OptimizerKind::kAmsgrad:
      return 3;  // m, v, the running maximum of v
  }
  return 0;
}

// The initial value of each of the kind's NumSlots(kind) slots.
inline std::vector<float> SlotInitialValues(const OptimizerParams& p) {
  std::vector<float> values(NumSlots(p.kind), 0.0f);
  if (p.kind == OptimizerKind::kAdagrad || p.kind == OptimizerKind::kFtrl) {
    values[0] = p.initial_accumulator_value;
  }
  return values;
}

// The op's `hyperparameters` input holds, by kind: momentum kinds [momentum]; FTRL [l1, l2,
// l2_shrinkage, learning_rate_power]; other kinds nothing (their scalars have inputs of their own).
inline int NumHyperparameters(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kMomentum:
    case OptimizerKind::kKerasMomentum:
      return 1;
    case OptimizerKind::kFtrl:
      return 4;
    default:
      return 0;
  }
}

// Sets the fields that `values` (NumHyperparameters(p->kind) of them) carry.
inline void SetHyperparameters(const float* values, OptimizerParams* p) {
  switch (p->kind) {
    case OptimizerKind::kMomentum:
    case OptimizerKind::kKerasMomentum:
      p->momentum = values[0];
      return;
    case OptimizerKind::kFtrl:
      p->l1 = values[0];
      p->l2 = values[1];
      p->l2_shrinkage = values[2];
      p->learning_rate_power = values[3];
      return;
    default:
      return;
  }
}

namespace internal {

// One FTRL step of a row (slots: accum, then linear), power(accum) being accum^(-lr_power).
template <typename Power>
inline void FtrlRow(const OptimizerParams& p, const float* __restrict grad, int dim,
                    float* __restrict embedding, float* slots, Power&& power) {
  float* __restrict accum = slots;
  float* __restrict linear = slots + dim;
  const float lr = p.learning_rate, l1 = p.l1;
  const float two_shrinkage = 2.0f * p.l2_shrinkage;
  const float two_l2 = 2.0f * p.l2;
  for (int j = 0; j < dim; ++j) {
    const float g = grad[j];
    const float g_with_shrinkage = g + two_shrinkage * embedding[j];
    const float new_accum = accum[j] + g * g;
    const float new_power = power(new_accum);
    linear[j] += g_with_shrinkage - (new_power - power(accum[j])) / lr * embedding[j];
    const float l1_adjusted = std::max(std::min(linear[j], l1), -l1);
    const float quadratic = new_power / lr + two_l2;
    embedding[j] = (l1_adjusted - linear[j]) / quadratic;
    accum[j] = new_accum;
  }
}

// Adam's step size for the row's update number t (1-based): lr * sqrt(1 - b2^t) / (1 - b1^t).
inline float AdamStepSizeOf(float learning_rate, float beta1, float beta2, int64_t prior_updates) {
  const double t = static_cast<double>(prior_updates + 1);
  return static_cast<float>(learning_rate * std::sqrt(1.0 - std::pow(beta2, t)) /
                            (1.0 - std::pow(beta1, t)));
}

// AdamStepSizeOf, remembered per thread for the last hyperparameters and update numbers: rows
// repeat the same few small update numbers, and its two pow() calls cost as much as the rest of a
// 16-wide update. The same inputs give the same value, so this changes no result.
inline float AdamStepSize(const OptimizerParams& p, int64_t prior_updates) {
  struct Remembered {
    float learning_rate, beta1, beta2;
    int64_t prior_updates = -1;
    float step_size;
  };
  constexpr int64_t kRemembered = 256;
  thread_local Remembered remembered[kRemembered];
  Remembered& r = remembered[static_cast<uint64_t>(prior_updates) % kRemembered];
  if (r.prior_updates != prior_updates || r.learning_rate != p.learning_rate ||
      r.beta1 != p.beta1 || r.beta2 != p.beta2) {
    r = Remembered{p.learning_rate, p.beta1, p.beta2, prior_updates,
                   AdamStepSizeOf(p.learning_rate, p.beta1, p.beta2, prior_updates)};
  }
  return r.step_size;
}

}  // namespace internal

// `slots` holds NumSlots(kind) consecutive blocks of `dim` floats.
//
// The gradient, the embedding and the slot blocks never overlap. Saying so (__restrict), with no
// per-element branch left in a loop, lets the compiler use vector instructions; one float at a
// time, Adam's, Adagrad's and FTRL's loops ran about 4x slower. The arithmetic per element is the
// same either way.
inline void ApplyGradient(const OptimizerParams& p, int64_t prior_updates, const float* grad,
                          int dim, float* embedding, float* slots) {
  const float* __restrict g = grad;
  float* __restrict e = embedding;
  const float lr = p.learning_rate;
  switch (p.kind) {
    case OptimizerKind::kSgd:
      for (int j = 0; j < dim; ++j) e[j] -= lr * g[j];
      return;
    case OptimizerKind::kAdagrad: {
      float* __restrict acc = slots;
      const float epsilon = p.epsilon;
      if (p.epsilon_inside_sqrt) {
        for (int j = 0; j < dim; ++j) {
          acc[j] += g[j] * g[j];
          e[j] -= lr * g[j] / std::sqrt(acc[j] + epsilon);
        }
      } else {
        for (int j = 0; j < dim; ++j) {
          acc[j] += g[j] * g[j];
          e[j] -= lr * g[j] / (std::sqrt(acc[j]) + epsilon);
        }
      }
      return;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAmsgrad: {
      float* __restrict m = slots;
      float* __restrict v = slots + dim;
      float* __restrict v_max = slots + 2 * dim;  // AMSGrad only
      const float beta1 = p.beta1, beta2 = p.beta2, epsilon = p.epsilon;
      const float lr_t = internal::AdamStepSize(p, prior_updates);
      if (p.kind == OptimizerKind::kAmsgrad) {
        for (int j = 0; j < dim; ++j) {
          m[j] = beta1 * m[j] + (1.0f - beta1) * g[j];
          v[j] = beta2 * v[j] + (1.0f - beta2) * g[j] * g[j];
          v_max[j] = std::max(v_max[j], v[j]);
          e[j] -= lr_t * m[j] / (std::sqrt(v_max[j]) + epsilon);
        }
        return;
      }
      for (int j = 0; j < dim; ++j) {
        m[j] = beta1 * m[j] + (1.0f - beta1) * g[j];
        v[j] = beta2 * v[j] + (1.0f - beta2) * g[j] * g[j];
        e[j] -= lr_t * m[j] / (std::sqrt(v[j]) + epsilon);
      }
      return;
    }
    case OptimizerKind::kMomentum: {  // TF's SparseApplyMomentum
      float* __restrict accum = slots;
      const float momentum = p.momentum;
      if (p.use_nesterov) {
        for (int j = 0; j < dim; ++j) {
          accum[j] = accum[j] * momentum + g[j];
          e[j] -= lr * g[j] + lr * momentum * accum[j];
        }
      } else {
        for (int j = 0; j < dim; ++j) {
          accum[j] = accum[j] * momentum + g[j];
          e[j] -= lr * accum[j];
        }
      }
      return;
    }
    case OptimizerKind::kKerasMomentum: {  // TF's SparseApplyKerasMomentum
      float* __restrict accum = slots;
      const float momentum = p.momentum;
      if (p.use_nesterov) {
        for (int j = 0; j < dim; ++j) {
          accum[j] = accum[j] * momentum - g[j] * lr;
          e[j] += accum[j] * momentum - g[j] * lr;
        }
      } else {
        for (int j = 0; j < dim; ++j) {
          accum[j] = accum[j] * momentum - g[j] * lr;
          e[j] += accum[j];
        }
      }
      return;
    }
    case OptimizerKind::kFtrl:  // TF's SparseApplyFtrl(V2), multiply_linear_by_lr = false
      // TensorFlow's exact square root for the usual lr_power = -0.5, else pow.
      if (p.learning_rate_power == -0.5f) {
        internal::FtrlRow(p, g, dim, e, slots, [](float accum) { return std::sqrt(accum); });
      } else {
        const float exponent = -p.learning_rate_power;
        internal::FtrlRow(p, g, dim, e, slots,
                          [exponent](float accum) { return std::pow(accum, exponent); });
      }
      return;
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
