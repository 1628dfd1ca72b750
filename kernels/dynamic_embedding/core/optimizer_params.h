// The table optimizers' kinds, attributes and hyperparameters (OptimizerParams), and the slots
// each kind keeps beside a row. Part of optimizers.h.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_PARAMS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_PARAMS_H_

#include <math.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
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
  // RMSprop: Keras' without momentum [ms] (epsilon_inside_sqrt: Keras 2.11+ g / sqrt(ms + eps),
  // else legacy Keras g / (sqrt(ms) + eps)), centered [ms, mg]; TF's SparseApply(Centered)RMSProp,
  // with momentum [ms, mom] and [ms, mom, mg].
  kRmsprop,
  kCenteredRmsprop,
  kRmspropMomentum,
  kCenteredRmspropMomentum,
  kAdadelta,         // [accum, accum_update]
  kProximalSgd,      // TF1 ProximalGradientDescentOptimizer: no slots
  kProximalAdagrad,  // [accumulator]
  kAdagradDa,        // [gradient accumulator, squared accumulator]
  kAdamax,           // [m, u]
  kNadam,            // [m, v]
};

// The names of the op's `optimizer` attr (ops/dynamic_embedding_optimizer_ops.cc). False if
// unknown, so a name the op allows but the kernel lacks is an error, not a silent SGD step.
inline bool ParseOptimizerKind(std::string_view name, OptimizerKind* kind) {
  static constexpr struct {
    std::string_view name;
    OptimizerKind kind;
  } kNames[] = {
      {"sgd", OptimizerKind::kSgd},
      {"adagrad", OptimizerKind::kAdagrad},
      {"adam", OptimizerKind::kAdam},
      {"amsgrad", OptimizerKind::kAmsgrad},
      {"momentum", OptimizerKind::kMomentum},
      {"keras_momentum", OptimizerKind::kKerasMomentum},
      {"ftrl", OptimizerKind::kFtrl},
      {"rmsprop", OptimizerKind::kRmsprop},
      {"centered_rmsprop", OptimizerKind::kCenteredRmsprop},
      {"rmsprop_momentum", OptimizerKind::kRmspropMomentum},
      {"centered_rmsprop_momentum", OptimizerKind::kCenteredRmspropMomentum},
      {"adadelta", OptimizerKind::kAdadelta},
      {"proximal_sgd", OptimizerKind::kProximalSgd},
      {"proximal_adagrad", OptimizerKind::kProximalAdagrad},
      {"adagrad_da", OptimizerKind::kAdagradDa},
      {"adamax", OptimizerKind::kAdamax},
      {"nadam", OptimizerKind::kNadam},
  };
  for (const auto& entry : kNames) {
    if (entry.name == name) {
      *kind = entry.kind;
      return true;
    }
  }
  return false;
}

// How Adam's, AMSGrad's, Adamax's and Nadam's bias corrections compute beta^t and the step size:
// as the wrapped optimizer's API does, so that a row updated in every batch matches the dense
// variable that API trains to float rounding (TF's float32 0.999^t is off by up to ~1e-5
// relative after a few steps, which the exact value would not reproduce).
enum class BiasCorrection {
  kExact,  // double pow, rounded once (the op's default, for graphs made before this attr)
  // tf.compat.v1.train.AdamOptimizer: beta^t is a float32 variable multiplied by beta each step
  // (t factors in order); lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t) in float32.
  kTf1,
  // Legacy Keras (optimizer_v2): beta^t = powf(beta, t); its sparse Adam's
  // lr_t = lr * (sqrt(1 - b2^t) / (1 - b1^t)), Adamax's lr / (1 - b1^t), Nadam's 1 - b2^t.
  kKerasLegacy,
  // Keras 2.11+: beta^t = powf(beta, t); Adam's lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t).
  kKeras,
};

// The names of the op's `bias_correction` attr. False if unknown.
inline bool ParseBiasCorrection(std::string_view name, BiasCorrection* mode) {
  static constexpr struct {
    std::string_view name;
    BiasCorrection mode;
  } kNames[] = {
      {"exact", BiasCorrection::kExact},
      {"tf1", BiasCorrection::kTf1},
      {"keras_legacy", BiasCorrection::kKerasLegacy},
      {"keras", BiasCorrection::kKeras},
  };
  for (const auto& entry : kNames) {
    if (entry.name == name) {
      *mode = entry.mode;
      return true;
    }
  }
  return false;
}

struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kSgd;
  BiasCorrection bias_correction = BiasCorrection::kExact;
  // >= 0: the update count before this step that every row's bias corrections (and Nadam's
  // schedule) use, the optimizer's step; < 0: each row's own update count.
  int64_t shared_prior_updates = -1;
  float learning_rate = 0.0f;
  // Adam, AMSGrad, Adamax, Nadam.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 0.0f;  // also Adagrad's, RMSprop's and Adadelta's
  // Adagrad: TF1 uses g / sqrt(acc), legacy Keras g / (sqrt(acc) + eps), Keras 2.11+
  // g / sqrt(acc + eps). false: outside, true: inside. Also RMSprop without momentum's.
  bool epsilon_inside_sqrt = false;
  // The first slot of Adagrad, FTRL, ProximalAdagrad and RMSprop (TF1's starts at 1) starts at this
  // value, AdagradDA's second (its squared accumulator).
  float initial_accumulator_value = 0.0f;
  // Both momentum kinds and RMSprop's momentum kinds.
  float momentum = 0.0f;
  bool use_nesterov = false;
  // FTRL. l2 already includes FTRL's beta / (2 * learning_rate), as TensorFlow passes it. l1 and
  // l2 are also ProximalGradientDescent's, ProximalAdagrad's and AdagradDA's (plain strengths).
  float l1 = 0.0f;
  float l2 = 0.0f;
  float l2_shrinkage = 0.0f;
  float learning_rate_power = -0.5f;
  // RMSprop's and Adadelta's decay.
  float rho = 0.9f;
  // AdagradDA's global step as TensorFlow passes it (the optimizer's global_step + 1), in float as
  // its kernel converts it.
  float global_step = 1.0f;
  // Nadam's momentum schedule u_t = beta1 * (1 - 0.5 * 0.96^(schedule_decay * t)): Keras 2.11+
  // uses 1, legacy Keras its schedule_decay (0.004 by default).
  float schedule_decay = 1.0f;
};

// The update count that a row's bias corrections use: the row's own, or the shared one.
TF_EXT_HOST_DEVICE inline int64_t BiasCorrectionPriorUpdates(const OptimizerParams& p,
                                                             int64_t row_prior_updates) {
  return p.shared_prior_updates >= 0 ? p.shared_prior_updates : row_prior_updates;
}

inline int NumSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kProximalSgd:
      return 0;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kMomentum:
    case OptimizerKind::kKerasMomentum:
    case OptimizerKind::kRmsprop:
    case OptimizerKind::kProximalAdagrad:
      return 1;  // accumulator; momentum; ms
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl:
    case OptimizerKind::kCenteredRmsprop:
    case OptimizerKind::kRmspropMomentum:
    case OptimizerKind::kAdadelta:
    case OptimizerKind::kAdagradDa:
    case OptimizerKind::kAdamax:
    case OptimizerKind::kNadam:
      return 2;  // m, v; accumulator, linear; ms, mg; ms, mom; ...
    case OptimizerKind::kAmsgrad:
    case OptimizerKind::kCenteredRmspropMomentum:
      return 3;  // m, v, the running maximum of v; ms, mom, mg
  }
  return 0;
}

// The initial value of each of the kind's NumSlots(kind) slots.
inline std::vector<float> SlotInitialValues(const OptimizerParams& p) {
  std::vector<float> values(NumSlots(p.kind), 0.0f);
  switch (p.kind) {
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kFtrl:
    case OptimizerKind::kProximalAdagrad:
    case OptimizerKind::kRmsprop:
    case OptimizerKind::kCenteredRmsprop:
    case OptimizerKind::kRmspropMomentum:
    case OptimizerKind::kCenteredRmspropMomentum:
      values[0] = p.initial_accumulator_value;
      break;
    case OptimizerKind::kAdagradDa:
      values[1] = p.initial_accumulator_value;
      break;
    default:
      break;
  }
  return values;
}

// The op's `hyperparameters` input holds, by kind: momentum kinds [momentum]; FTRL [l1, l2,
// l2_shrinkage, learning_rate_power]; RMSprop without momentum and Adadelta [rho]; RMSprop with
// momentum [rho, momentum]; ProximalGradientDescent and ProximalAdagrad [l1, l2]; AdagradDA [l1,
// l2, global_step]; Nadam [schedule_decay]; other kinds nothing (their scalars have inputs of their
// own).
inline int NumHyperparameters(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kMomentum:
    case OptimizerKind::kKerasMomentum:
    case OptimizerKind::kRmsprop:
    case OptimizerKind::kCenteredRmsprop:
    case OptimizerKind::kAdadelta:
    case OptimizerKind::kNadam:
      return 1;
    case OptimizerKind::kRmspropMomentum:
    case OptimizerKind::kCenteredRmspropMomentum:
    case OptimizerKind::kProximalSgd:
    case OptimizerKind::kProximalAdagrad:
      return 2;
    case OptimizerKind::kAdagradDa:
      return 3;
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
    case OptimizerKind::kRmsprop:
    case OptimizerKind::kCenteredRmsprop:
    case OptimizerKind::kAdadelta:
      p->rho = values[0];
      return;
    case OptimizerKind::kRmspropMomentum:
    case OptimizerKind::kCenteredRmspropMomentum:
      p->rho = values[0];
      p->momentum = values[1];
      return;
    case OptimizerKind::kProximalSgd:
    case OptimizerKind::kProximalAdagrad:
      p->l1 = values[0];
      p->l2 = values[1];
      return;
    case OptimizerKind::kAdagradDa:
      p->l1 = values[0];
      p->l2 = values[1];
      p->global_step = values[2];
      return;
    case OptimizerKind::kNadam:
      p->schedule_decay = values[0];
      return;
    default:
      return;
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_PARAMS_H_
