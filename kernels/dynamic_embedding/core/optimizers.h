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

#include <math.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/host_device.h"

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

// Adam's step size for the row's update number t (1-based): lr * sqrt(1 - b2^t) / (1 - b1^t).
TF_EXT_HOST_DEVICE inline float AdamStepSizeOf(float learning_rate, float beta1, float beta2,
                                               int64_t prior_updates) {
  const double t = static_cast<double>(prior_updates + 1);
  return static_cast<float>(learning_rate * ::sqrt(1.0 - ::pow(beta2, t)) /
                            (1.0 - ::pow(beta1, t)));
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

// FTRL's accum^(-lr_power): TensorFlow's exact square root for the usual lr_power = -0.5.
struct FtrlSqrt {
  TF_EXT_HOST_DEVICE float operator()(float accum) const { return sqrtf(accum); }
};
// Other powers in double, rounded once: float powf differs by an ulp between glibc and CUDA, and
// FTRL's linear term magnifies that (its accumulators' difference divided by the learning rate).
struct FtrlPow {
  float exponent;
  TF_EXT_HOST_DEVICE float operator()(float accum) const {
    return static_cast<float>(::pow(static_cast<double>(accum), static_cast<double>(exponent)));
  }
};

}  // namespace internal

// The step of one element of a row, by kind: the embedding element e and the element's slot
// values, gradient g. ApplyGradient runs them over a row on the CPU, the GPU table one element per
// thread (ApplyGradientToElement), so both compute exactly the same arithmetic.
namespace element {

TF_EXT_HOST_DEVICE inline void Sgd(float lr, float g, float& e) { e -= lr * g; }

TF_EXT_HOST_DEVICE inline void Adagrad(float lr, float epsilon, bool epsilon_inside_sqrt, float g,
                                       float& e, float& acc) {
  acc += g * g;
  e -= epsilon_inside_sqrt ? lr * g / sqrtf(acc + epsilon) : lr * g / (sqrtf(acc) + epsilon);
}

TF_EXT_HOST_DEVICE inline void Adam(float lr_t, float beta1, float beta2, float epsilon, float g,
                                    float& e, float& m, float& v) {
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  e -= lr_t * m / (sqrtf(v) + epsilon);
}

TF_EXT_HOST_DEVICE inline void Amsgrad(float lr_t, float beta1, float beta2, float epsilon, float g,
                                       float& e, float& m, float& v, float& v_max) {
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  v_max = MaxOf(v_max, v);
  e -= lr_t * m / (sqrtf(v_max) + epsilon);
}

// TF's SparseApplyMomentum.
TF_EXT_HOST_DEVICE inline void Momentum(float lr, float momentum, bool use_nesterov, float g,
                                        float& e, float& accum) {
  accum = accum * momentum + g;
  e -= use_nesterov ? lr * g + lr * momentum * accum : lr * accum;
}

// TF's SparseApplyKerasMomentum.
TF_EXT_HOST_DEVICE inline void KerasMomentum(float lr, float momentum, bool use_nesterov, float g,
                                             float& e, float& accum) {
  accum = accum * momentum - g * lr;
  e += use_nesterov ? accum * momentum - g * lr : accum;
}

// FTRL's scalars, as its element step uses them.
struct FtrlScalars {
  float learning_rate, l1, two_l2_shrinkage, two_l2;
  TF_EXT_HOST_DEVICE explicit FtrlScalars(const OptimizerParams& p)
      : learning_rate(p.learning_rate),
        l1(p.l1),
        two_l2_shrinkage(2.0f * p.l2_shrinkage),
        two_l2(2.0f * p.l2) {}
};

// TF's SparseApplyFtrl(V2), multiply_linear_by_lr = false; l2 already includes FTRL's beta / (2 *
// learning_rate), as TensorFlow passes it.
template <typename Power>
TF_EXT_HOST_DEVICE inline void Ftrl(FtrlScalars f, Power power, float g, float& e, float& accum,
                                    float& linear) {
  const float g_with_shrinkage = g + f.two_l2_shrinkage * e;
  const float new_accum = accum + g * g;
  const float new_power = power(new_accum);
  linear += g_with_shrinkage - (new_power - power(accum)) / f.learning_rate * e;
  const float l1_adjusted = MaxOf(MinOf(linear, f.l1), -f.l1);
  const float quadratic = new_power / f.learning_rate + f.two_l2;
  e = (l1_adjusted - linear) / quadratic;
  accum = new_accum;
}

}  // namespace element

// `slots` holds NumSlots(kind) consecutive blocks of `dim` floats.
//
// The gradient, the embedding and the slot blocks never overlap. Saying so (__restrict), with the
// kind and its options decided outside each loop, lets the compiler use vector instructions; one
// float at a time, Adam's, Adagrad's and FTRL's loops ran about 4x slower. The arithmetic per
// element is the same either way.
inline void ApplyGradient(const OptimizerParams& p, int64_t prior_updates, const float* grad,
                          int dim, float* embedding, float* slots) {
  const float* __restrict g = grad;
  float* __restrict e = embedding;
  float* __restrict s0 = slots;
  float* __restrict s1 = slots + dim;
  float* __restrict s2 = slots + 2 * dim;
  // Scalars in locals: read through `p` inside a loop, they might alias the rows being written.
  const float lr = p.learning_rate, epsilon = p.epsilon, momentum = p.momentum;
  const float beta1 = p.beta1, beta2 = p.beta2;
  switch (p.kind) {
    case OptimizerKind::kSgd:
      for (int j = 0; j < dim; ++j) element::Sgd(lr, g[j], e[j]);
      return;
    case OptimizerKind::kAdagrad:
      if (p.epsilon_inside_sqrt) {
        for (int j = 0; j < dim; ++j) element::Adagrad(lr, epsilon, true, g[j], e[j], s0[j]);
      } else {
        for (int j = 0; j < dim; ++j) element::Adagrad(lr, epsilon, false, g[j], e[j], s0[j]);
      }
      return;
    case OptimizerKind::kAdam: {
      const float lr_t = internal::AdamStepSize(p, prior_updates);
      for (int j = 0; j < dim; ++j) {
        element::Adam(lr_t, beta1, beta2, epsilon, g[j], e[j], s0[j], s1[j]);
      }
      return;
    }
    case OptimizerKind::kAmsgrad: {
      const float lr_t = internal::AdamStepSize(p, prior_updates);
      for (int j = 0; j < dim; ++j) {
        element::Amsgrad(lr_t, beta1, beta2, epsilon, g[j], e[j], s0[j], s1[j], s2[j]);
      }
      return;
    }
    case OptimizerKind::kMomentum:
      if (p.use_nesterov) {
        for (int j = 0; j < dim; ++j) element::Momentum(lr, momentum, true, g[j], e[j], s0[j]);
      } else {
        for (int j = 0; j < dim; ++j) element::Momentum(lr, momentum, false, g[j], e[j], s0[j]);
      }
      return;
    case OptimizerKind::kKerasMomentum:
      if (p.use_nesterov) {
        for (int j = 0; j < dim; ++j) element::KerasMomentum(lr, momentum, true, g[j], e[j], s0[j]);
      } else {
        for (int j = 0; j < dim; ++j)
          element::KerasMomentum(lr, momentum, false, g[j], e[j], s0[j]);
      }
      return;
    case OptimizerKind::kFtrl: {
      const element::FtrlScalars f(p);
      if (p.learning_rate_power == -0.5f) {
        for (int j = 0; j < dim; ++j)
          element::Ftrl(f, internal::FtrlSqrt(), g[j], e[j], s0[j], s1[j]);
      } else {
        const internal::FtrlPow power{-p.learning_rate_power};
        for (int j = 0; j < dim; ++j) element::Ftrl(f, power, g[j], e[j], s0[j], s1[j]);
      }
      return;
    }
  }
}

// ApplyGradient for element j of one row, given the row's Adam step size (AdamStepSizeOf; any
// value for other kinds): one GPU thread's share of a row's update.
TF_EXT_HOST_DEVICE inline void ApplyGradientToElement(const OptimizerParams& p, float adam_lr_t,
                                                      float g, int dim, int j, float* embedding,
                                                      float* slots) {
  float& e = embedding[j];
  float* s0 = slots + j;
  switch (p.kind) {
    case OptimizerKind::kSgd:
      element::Sgd(p.learning_rate, g, e);
      return;
    case OptimizerKind::kAdagrad:
      element::Adagrad(p.learning_rate, p.epsilon, p.epsilon_inside_sqrt, g, e, *s0);
      return;
    case OptimizerKind::kAdam:
      element::Adam(adam_lr_t, p.beta1, p.beta2, p.epsilon, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kAmsgrad:
      element::Amsgrad(adam_lr_t, p.beta1, p.beta2, p.epsilon, g, e, s0[0], s0[dim], s0[2 * dim]);
      return;
    case OptimizerKind::kMomentum:
      element::Momentum(p.learning_rate, p.momentum, p.use_nesterov, g, e, *s0);
      return;
    case OptimizerKind::kKerasMomentum:
      element::KerasMomentum(p.learning_rate, p.momentum, p.use_nesterov, g, e, *s0);
      return;
    case OptimizerKind::kFtrl:
      if (p.learning_rate_power == -0.5f) {
        element::Ftrl(element::FtrlScalars(p), internal::FtrlSqrt(), g, e, s0[0], s0[dim]);
      } else {
        element::Ftrl(element::FtrlScalars(p), internal::FtrlPow{-p.learning_rate_power}, g, e,
                      s0[0], s0[dim]);
      }
      return;
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
