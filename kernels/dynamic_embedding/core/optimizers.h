// Row-wise optimizer updates over a table row and its co-located slots. Each function
// receives the row's update count *before* this update (Adam's, Adamax's and Nadam's bias
// corrections and Nadam's momentum schedule use the row's own step by default, so a row that
// appears in every batch matches the dense optimizer exactly and a rare row is not
// over-corrected; OptimizerParams::shared_prior_updates gives every row the optimizer's step
// instead, as TensorFlow's dense optimizers and TFRA do).
//
// The arithmetic follows TensorFlow's sparse apply kernels (training_ops.cc) operation by
// operation, so a row updated here matches the same row of a dense variable updated by
// TensorFlow's optimizer to float rounding.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_

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

// What a row's update takes from the row's update count, computed once per row (not per element):
// the bias corrections and Nadam's momentum schedule at the row's update number t (1-based).
struct RowStep {
  // Adam, AMSGrad: lr * sqrt(1 - beta2^t) / (1 - beta1^t). Adamax: lr / (1 - beta1^t).
  float step_size = 0.0f;
  // Nadam, with u_t = beta1 * (1 - 0.5 * 0.96^(schedule_decay * t)) and U_t = u_1 * ... * u_t.
  float one_minus_u = 0.0f;             // 1 - u_t
  float u_next = 0.0f;                  // u_{t+1}
  float one_minus_product = 1.0f;       // 1 - U_t
  float one_minus_product_next = 1.0f;  // 1 - U_{t+1}
  float one_minus_beta2_power = 1.0f;   // 1 - beta2^t
};

// Nadam's U_t up to where its factors stop changing: from `length` on, every factor is beta1 in
// double (0.5 * 0.96^(decay * i) < 2^-54), or the product is below 1e-20, where 1 - U_t is 1 in
// double and float alike (product 0). Computed once per step's hyperparameters, so that a row's
// U_t costs at most `length` multiplications, one pow past it. length -1: not computed yet.
struct NadamHead {
  int64_t length = -1;
  double product = 1.0;
};

namespace internal {

// Adam's step size for the row's update number t (1-based): lr * sqrt(1 - b2^t) / (1 - b1^t).
TF_EXT_HOST_DEVICE inline float AdamStepSizeOf(float learning_rate, float beta1, float beta2,
                                               int64_t prior_updates) {
  const double t = static_cast<double>(prior_updates + 1);
  return static_cast<float>(learning_rate * ::sqrt(1.0 - ::pow(beta2, t)) /
                            (1.0 - ::pow(beta1, t)));
}

// powf(beta, t) as TensorFlow's float32 tf.pow computes it on the CPU (glibc's powf). CUDA's powf
// differs from glibc's by an ulp at times; on the device the double pow rounded once (glibc's
// powf to an ulp at most).
TF_EXT_HOST_DEVICE inline float FloatPow(float beta, int64_t t) {
#ifdef __CUDA_ARCH__
  return static_cast<float>(::pow(static_cast<double>(beta), static_cast<double>(t)));
#else
  return ::powf(beta, static_cast<float>(t));
#endif
}

// TF1's running product stops mattering once |beta^t| < 2^-25: 1 - beta^t is then 1.0f exactly,
// as it is for every later (smaller) power. Past kMaxRunningFactors factors (betas within ~1e-4
// of 1) the rest of the power is FloatPow's.
constexpr float kNegligiblePower = 2.98023223876953125e-8f;  // 2^-25
constexpr int64_t kMaxRunningFactors = int64_t{1} << 16;

// Continues TF1's running product `power` = beta^from (float32, beta multiplied in order) to
// beta^t, t >= from.
TF_EXT_HOST_DEVICE inline float ContinueRunningPower(float beta, float power, int64_t from,
                                                     int64_t t) {
  int64_t i = from;
  for (; i < t && i < kMaxRunningFactors; ++i) {
    if (::fabsf(power) < kNegligiblePower) return power;  // 1 - power == 1.0f from here on
    power *= beta;
  }
  return i < t ? power * FloatPow(beta, t - i) : power;
}

// TF1's beta power variable at the row's update number t >= 1: beta * beta * ... (t factors).
TF_EXT_HOST_DEVICE inline float RunningPower(float beta, int64_t t) {
  return ContinueRunningPower(beta, beta, 1, t);
}

// beta1^t and beta2^t in float32 as p.bias_correction computes them (not for kExact).
struct BetaPowers {
  float beta1 = 0.0f, beta2 = 0.0f;
};

TF_EXT_HOST_DEVICE inline BetaPowers BetaPowersOf(const OptimizerParams& p, int64_t t) {
  if (p.bias_correction == BiasCorrection::kTf1) {
    return BetaPowers{RunningPower(p.beta1, t), RunningPower(p.beta2, t)};
  }
  return BetaPowers{FloatPow(p.beta1, t), FloatPow(p.beta2, t)};
}

// Nadam's factor ratio: 0.96^(decay * i) is base^i.
TF_EXT_HOST_DEVICE inline double NadamBase(float schedule_decay) {
  return ::pow(0.96, static_cast<double>(schedule_decay));
}

// Bounds the loops below whatever the hyperparameters: with 0 < decay and |beta1| <= 1 they stop
// within a few thousand factors (the product falls below 1e-20 or the factors reach beta1). Past
// the bound every factor counts as beta1.
constexpr int64_t kMaxNadamFactors = int64_t{1} << 16;

// U_t in double, the factors multiplied in order from u_1; `head` (NadamHeadOf) ends the loop.
TF_EXT_HOST_DEVICE inline double NadamProduct(double beta1, double base, const NadamHead& head,
                                              int64_t t) {
  if (t >= head.length) return head.product * ::pow(beta1, static_cast<double>(t - head.length));
  double product = 1.0, base_i = 1.0;
  for (int64_t i = 1; i <= t; ++i) {
    base_i *= base;
    product *= beta1 * (1.0 - 0.5 * base_i);
  }
  return product;
}

}  // namespace internal

// The NadamHead of p's beta1 and schedule_decay (the same loop as NadamProduct's).
TF_EXT_HOST_DEVICE inline NadamHead NadamHeadOf(const OptimizerParams& p) {
  const double beta1 = p.beta1, base = internal::NadamBase(p.schedule_decay);
  NadamHead head{0, 1.0};
  double base_i = 1.0;
  for (int64_t i = 1; i <= internal::kMaxNadamFactors; ++i) {
    base_i *= base;
    const double factor = 1.0 - 0.5 * base_i;
    if (factor == 1.0) return head;  // u_i = beta1 from here on
    head.product *= beta1 * factor;
    head.length = i;
    if (!(::fabs(head.product) >= 1e-20)) {  // also NaN: the rest of the product is 0
      head.product = 0.0;
      return head;
    }
  }
  return head;
}

// The row's RowStep for its update number prior_updates + 1, given `powers`
// (internal::BetaPowersOf(p, prior_updates + 1), read unless p.bias_correction is kExact);
// `head` is NadamHeadOf(p), or not computed (read by Nadam only).
TF_EXT_HOST_DEVICE inline RowStep RowStepWith(const OptimizerParams& p, const NadamHead& head,
                                              int64_t prior_updates,
                                              const internal::BetaPowers& powers) {
  RowStep r;
  const bool exact = p.bias_correction == BiasCorrection::kExact;
  switch (p.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAmsgrad:
      if (exact) {
        r.step_size = internal::AdamStepSizeOf(p.learning_rate, p.beta1, p.beta2, prior_updates);
      } else if (p.bias_correction == BiasCorrection::kKerasLegacy) {
        r.step_size = p.learning_rate * (::sqrtf(1.0f - powers.beta2) / (1.0f - powers.beta1));
      } else {
        r.step_size = p.learning_rate * ::sqrtf(1.0f - powers.beta2) / (1.0f - powers.beta1);
      }
      break;
    case OptimizerKind::kAdamax: {
      if (exact) {
        const double t = static_cast<double>(prior_updates + 1);
        r.step_size = static_cast<float>(p.learning_rate / (1.0 - ::pow(p.beta1, t)));
      } else {
        r.step_size = p.learning_rate / (1.0f - powers.beta1);
      }
      break;
    }
    case OptimizerKind::kNadam: {
      const int64_t t = prior_updates + 1;
      const double beta1 = p.beta1, base = internal::NadamBase(p.schedule_decay);
      const double decay = p.schedule_decay;
      // Keras computes u_t from pow(0.96, decay * t); the product's factors step by base.
      const double u = beta1 * (1.0 - 0.5 * ::pow(0.96, decay * static_cast<double>(t)));
      const double u_next = beta1 * (1.0 - 0.5 * ::pow(0.96, decay * static_cast<double>(t + 1)));
      const double product =
          internal::NadamProduct(beta1, base, head.length < 0 ? NadamHeadOf(p) : head, t);
      r.one_minus_u = static_cast<float>(1.0 - u);
      r.u_next = static_cast<float>(u_next);
      r.one_minus_product = static_cast<float>(1.0 - product);
      r.one_minus_product_next = static_cast<float>(1.0 - product * u_next);
      r.one_minus_beta2_power = exact ? static_cast<float>(1.0 - ::pow(static_cast<double>(p.beta2),
                                                                       static_cast<double>(t)))
                                      : 1.0f - powers.beta2;
      break;
    }
    default:
      break;
  }
  return r;
}

// Whether the kind reads BetaPowers (RowStepWith) under p's bias correction.
TF_EXT_HOST_DEVICE inline bool NeedsBetaPowers(const OptimizerParams& p) {
  return p.bias_correction != BiasCorrection::kExact &&
         (p.kind == OptimizerKind::kAdam || p.kind == OptimizerKind::kAmsgrad ||
          p.kind == OptimizerKind::kAdamax || p.kind == OptimizerKind::kNadam);
}

// RowStepWith, the powers computed here: as the GPU table computes it per row.
TF_EXT_HOST_DEVICE inline RowStep RowStepOf(const OptimizerParams& p, const NadamHead& head,
                                            int64_t prior_updates) {
  const int64_t prior = BiasCorrectionPriorUpdates(p, prior_updates);
  return RowStepWith(
      p, head, prior,
      NeedsBetaPowers(p) ? internal::BetaPowersOf(p, prior + 1) : internal::BetaPowers{});
}

// Whether the kind reads RowStep.
TF_EXT_HOST_DEVICE inline bool NeedsRowStep(OptimizerKind kind) {
  return kind == OptimizerKind::kAdam || kind == OptimizerKind::kAmsgrad ||
         kind == OptimizerKind::kAdamax || kind == OptimizerKind::kNadam;
}

namespace internal {

// NadamHeadOf(p), remembered per thread for the last beta1 and schedule_decay (fixed in training).
inline const NadamHead& RememberedNadamHead(const OptimizerParams& p) {
  struct Remembered {
    bool valid = false;
    float beta1, schedule_decay;
    NadamHead head;
  };
  thread_local Remembered r;
  if (!r.valid || r.beta1 != p.beta1 || r.schedule_decay != p.schedule_decay) {
    r = Remembered{true, p.beta1, p.schedule_decay, NadamHeadOf(p)};
  }
  return r.head;
}

// TF1's RunningPower(beta, t), remembered per thread: every kRunningStride-th power of the
// product (for the betas last asked for), so that a power costs at most kRunningStride - 1
// multiplications past them. The product continued from a remembered power is the same product,
// so this changes no result (the GPU table's RunningPower loops from the start).
inline float RememberedRunningPower(float beta, int64_t t) {
  constexpr int64_t kRunningStride = 64;
  struct Remembered {
    uint32_t beta_bits = 0;
    bool valid = false;
    std::vector<float> powers;  // powers[k] = beta^(k * kRunningStride + 1)
  };
  thread_local Remembered remembered[2];  // beta1's and beta2's
  uint32_t bits;
  std::memcpy(&bits, &beta, sizeof(bits));  // by bits: NaN betas too
  Remembered* r = &remembered[0];
  if (!(r->valid && r->beta_bits == bits)) {
    r = &remembered[1];
    if (!(r->valid && r->beta_bits == bits)) {
      std::swap(remembered[0], remembered[1]);  // the older one goes
      r = &remembered[1];
      r->valid = true;
      r->beta_bits = bits;
      r->powers.assign(1, beta);
    }
  }
  const int64_t bounded = t < kMaxRunningFactors ? t : kMaxRunningFactors;
  const int64_t k = (bounded - 1) / kRunningStride;
  while (static_cast<int64_t>(r->powers.size()) <= k) {
    const int64_t from = (static_cast<int64_t>(r->powers.size()) - 1) * kRunningStride + 1;
    r->powers.push_back(ContinueRunningPower(beta, r->powers.back(), from, from + kRunningStride));
  }
  return ContinueRunningPower(beta, r->powers[k], k * kRunningStride + 1, t);
}

// RowStepOf, remembered per thread for the last hyperparameters and update numbers: rows repeat
// the same few small update numbers, and its pow() calls cost as much as the rest of a 16-wide
// update. The same inputs give the same value, so this changes no result.
inline RowStep RememberedRowStep(const OptimizerParams& p, int64_t prior_updates) {
  struct Remembered {
    OptimizerKind kind;
    BiasCorrection bias_correction;
    float learning_rate, beta1, beta2, schedule_decay;
    int64_t prior_updates = -1;
    RowStep step;
  };
  constexpr int64_t kRemembered = 256;
  thread_local Remembered remembered[kRemembered];
  Remembered& r = remembered[static_cast<uint64_t>(prior_updates) % kRemembered];
  if (r.prior_updates != prior_updates || r.kind != p.kind ||
      r.bias_correction != p.bias_correction || r.learning_rate != p.learning_rate ||
      r.beta1 != p.beta1 || r.beta2 != p.beta2 || r.schedule_decay != p.schedule_decay) {
    const NadamHead head = p.kind == OptimizerKind::kNadam ? RememberedNadamHead(p) : NadamHead{};
    BetaPowers powers;
    if (NeedsBetaPowers(p)) {
      const int64_t t = prior_updates + 1;
      powers =
          p.bias_correction == BiasCorrection::kTf1
              ? BetaPowers{RememberedRunningPower(p.beta1, t), RememberedRunningPower(p.beta2, t)}
              : BetaPowersOf(p, t);
    }
    r = Remembered{
        p.kind,  p.bias_correction, p.learning_rate, p.beta1,
        p.beta2, p.schedule_decay,  prior_updates,   RowStepWith(p, head, prior_updates, powers)};
  }
  return r.step;
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

// TensorFlow's rsqrt (Eigen's, 1 / sqrt(x) to an ulp) as the exactly rounded 1 / sqrt(x).
TF_EXT_HOST_DEVICE inline float Rsqrt(float x) { return 1.0f / sqrtf(x); }

// Eigen's sign(x): -1, 0 or 1 (0 for 0 and NaN).
TF_EXT_HOST_DEVICE inline float Sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

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

// RMSprop without momentum (Keras; TF1 with momentum 0, whose momentum slot stays 0): Keras 2.11+
// e -= lr * g * rsqrt(ms + eps), legacy Keras e -= lr * g / (sqrt(ms) + eps).
TF_EXT_HOST_DEVICE inline void Rmsprop(float lr, float rho, float epsilon, bool epsilon_inside_sqrt,
                                       float g, float& e, float& ms) {
  ms = ms * rho + g * g * (1.0f - rho);
  e -=
      epsilon_inside_sqrt ? lr * g * internal::Rsqrt(ms + epsilon) : lr * g / (sqrtf(ms) + epsilon);
}

// Centered: the denominator is the variance ms - mg^2 (Keras 2.11+ adds eps inside the root).
TF_EXT_HOST_DEVICE inline void CenteredRmsprop(float lr, float rho, float epsilon,
                                               bool epsilon_inside_sqrt, float g, float& e,
                                               float& ms, float& mg) {
  ms = ms * rho + g * g * (1.0f - rho);
  mg = mg * rho + g * (1.0f - rho);
  e -= epsilon_inside_sqrt ? lr * g * internal::Rsqrt(ms - mg * mg + epsilon)
                           : lr * g / (sqrtf(ms - mg * mg) + epsilon);
}

// TF's SparseApplyRMSProp.
TF_EXT_HOST_DEVICE inline void RmspropMomentum(float lr, float rho, float momentum, float epsilon,
                                               float g, float& e, float& ms, float& mom) {
  ms = ms * rho + g * g * (1.0f - rho);
  mom = mom * momentum + internal::Rsqrt(ms + epsilon) * lr * g;
  e -= mom;
}

// TF's SparseApplyCenteredRMSProp.
TF_EXT_HOST_DEVICE inline void CenteredRmspropMomentum(float lr, float rho, float momentum,
                                                       float epsilon, float g, float& e, float& ms,
                                                       float& mom, float& mg) {
  ms = ms * rho + g * g * (1.0f - rho);
  mg = mg * rho + g * (1.0f - rho);
  mom = mom * momentum + internal::Rsqrt(ms + epsilon - mg * mg) * lr * g;
  e -= mom;
}

// TF's SparseApplyAdadelta (TF 2.15: the variable moves by the update before accum_update decays).
TF_EXT_HOST_DEVICE inline void Adadelta(float lr, float rho, float epsilon, float g, float& e,
                                        float& accum, float& accum_update) {
  accum = accum * rho + g * g * (1.0f - rho);
  const float update = sqrtf(accum_update + epsilon) * internal::Rsqrt(accum + epsilon) * g;
  e -= update * lr;
  accum_update = accum_update * rho + update * update * (1.0f - rho);
}

// The proximal (FOBOS) step of TF's SparseApplyProximalGradientDescent and ProximalAdagrad from
// e - rate * g.
TF_EXT_HOST_DEVICE inline void ProximalStep(float rate, float l1, float l2, float g, float& e) {
  const float prox = e - g * rate;
  e = l1 > 0.0f ? internal::Sign(prox) * MaxOf(fabsf(prox) - rate * l1, 0.0f) / (1.0f + l2 * rate)
                : prox / (1.0f + l2 * rate);
}

// TF's SparseApplyProximalAdagrad.
TF_EXT_HOST_DEVICE inline void ProximalAdagrad(float lr, float l1, float l2, float g, float& e,
                                               float& accum) {
  accum += g * g;
  ProximalStep(lr * internal::Rsqrt(accum), l1, l2, g, e);
}

// TF's SparseApplyAdagradDA (rows of more than one element): the weight follows from the sums of
// gradients and squared gradients at the global step; gs_lr = global_step * lr in float.
TF_EXT_HOST_DEVICE inline void AdagradDa(float global_step, float gs_lr, float l1, float l2,
                                         float g, float& e, float& g_sum, float& g2_sum) {
  g_sum += g;
  g2_sum += g * g;
  const float denominator = l2 + sqrtf(g2_sum) / gs_lr;
  e = l1 > 0.0f ? -1.0f * internal::Sign(g_sum) * MaxOf(fabsf(g_sum) / global_step - l1, 0.0f) /
                      denominator
                : -1.0f * (g_sum / global_step) / denominator;
}

// Legacy Keras' sparse Adamax (TF1 has none); step_size = lr / (1 - beta1^t).
TF_EXT_HOST_DEVICE inline void Adamax(float step_size, float beta1, float beta2, float epsilon,
                                      float g, float& e, float& m, float& u) {
  m = m * beta1 + g * (1.0f - beta1);
  u = MaxOf(u * beta2, fabsf(g));
  e -= step_size * (m / (u + epsilon));
}

// Legacy Keras' sparse Nadam, its scalars from the row's RowStep.
TF_EXT_HOST_DEVICE inline void Nadam(float lr, float beta1, float beta2, float epsilon,
                                     const RowStep& r, float g, float& e, float& m, float& v) {
  m = m * beta1 + g * (1.0f - beta1);
  v = v * beta2 + g * g * (1.0f - beta2);
  const float m_bar =
      r.one_minus_u * (g / r.one_minus_product) + r.u_next * (m / r.one_minus_product_next);
  e -= lr * m_bar / (sqrtf(v / r.one_minus_beta2_power) + epsilon);
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
  const float beta1 = p.beta1, beta2 = p.beta2, rho = p.rho, l1 = p.l1, l2 = p.l2;
  const RowStep r = NeedsRowStep(p.kind) ? internal::RememberedRowStep(
                                               p, BiasCorrectionPriorUpdates(p, prior_updates))
                                         : RowStep{};
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
      const float lr_t = r.step_size;
      for (int j = 0; j < dim; ++j) {
        element::Adam(lr_t, beta1, beta2, epsilon, g[j], e[j], s0[j], s1[j]);
      }
      return;
    }
    case OptimizerKind::kAmsgrad: {
      const float lr_t = r.step_size;
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
    case OptimizerKind::kRmsprop:
      if (p.epsilon_inside_sqrt) {
        for (int j = 0; j < dim; ++j) element::Rmsprop(lr, rho, epsilon, true, g[j], e[j], s0[j]);
      } else {
        for (int j = 0; j < dim; ++j) element::Rmsprop(lr, rho, epsilon, false, g[j], e[j], s0[j]);
      }
      return;
    case OptimizerKind::kCenteredRmsprop:
      if (p.epsilon_inside_sqrt) {
        for (int j = 0; j < dim; ++j)
          element::CenteredRmsprop(lr, rho, epsilon, true, g[j], e[j], s0[j], s1[j]);
      } else {
        for (int j = 0; j < dim; ++j)
          element::CenteredRmsprop(lr, rho, epsilon, false, g[j], e[j], s0[j], s1[j]);
      }
      return;
    case OptimizerKind::kRmspropMomentum:
      for (int j = 0; j < dim; ++j)
        element::RmspropMomentum(lr, rho, momentum, epsilon, g[j], e[j], s0[j], s1[j]);
      return;
    case OptimizerKind::kCenteredRmspropMomentum:
      for (int j = 0; j < dim; ++j) {
        element::CenteredRmspropMomentum(lr, rho, momentum, epsilon, g[j], e[j], s0[j], s1[j],
                                         s2[j]);
      }
      return;
    case OptimizerKind::kAdadelta:
      for (int j = 0; j < dim; ++j) element::Adadelta(lr, rho, epsilon, g[j], e[j], s0[j], s1[j]);
      return;
    case OptimizerKind::kProximalSgd:
      for (int j = 0; j < dim; ++j) element::ProximalStep(lr, l1, l2, g[j], e[j]);
      return;
    case OptimizerKind::kProximalAdagrad:
      for (int j = 0; j < dim; ++j) element::ProximalAdagrad(lr, l1, l2, g[j], e[j], s0[j]);
      return;
    case OptimizerKind::kAdagradDa: {
      const float global_step = p.global_step, gs_lr = p.global_step * lr;
      for (int j = 0; j < dim; ++j)
        element::AdagradDa(global_step, gs_lr, l1, l2, g[j], e[j], s0[j], s1[j]);
      return;
    }
    case OptimizerKind::kAdamax: {
      const float step_size = r.step_size;
      for (int j = 0; j < dim; ++j)
        element::Adamax(step_size, beta1, beta2, epsilon, g[j], e[j], s0[j], s1[j]);
      return;
    }
    case OptimizerKind::kNadam:
      for (int j = 0; j < dim; ++j)
        element::Nadam(lr, beta1, beta2, epsilon, r, g[j], e[j], s0[j], s1[j]);
      return;
  }
}

// ApplyGradient for element j of one row, given the row's RowStep (RowStepOf; any value for the
// kinds that read none): one GPU thread's share of a row's update.
TF_EXT_HOST_DEVICE inline void ApplyGradientToElement(const OptimizerParams& p, const RowStep& r,
                                                      float g, int dim, int j, float* embedding,
                                                      float* slots) {
  float& e = embedding[j];
  float* s0 = slots + j;
  const float lr = p.learning_rate;
  switch (p.kind) {
    case OptimizerKind::kSgd:
      element::Sgd(lr, g, e);
      return;
    case OptimizerKind::kAdagrad:
      element::Adagrad(lr, p.epsilon, p.epsilon_inside_sqrt, g, e, *s0);
      return;
    case OptimizerKind::kAdam:
      element::Adam(r.step_size, p.beta1, p.beta2, p.epsilon, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kAmsgrad:
      element::Amsgrad(r.step_size, p.beta1, p.beta2, p.epsilon, g, e, s0[0], s0[dim], s0[2 * dim]);
      return;
    case OptimizerKind::kMomentum:
      element::Momentum(lr, p.momentum, p.use_nesterov, g, e, *s0);
      return;
    case OptimizerKind::kKerasMomentum:
      element::KerasMomentum(lr, p.momentum, p.use_nesterov, g, e, *s0);
      return;
    case OptimizerKind::kFtrl:
      if (p.learning_rate_power == -0.5f) {
        element::Ftrl(element::FtrlScalars(p), internal::FtrlSqrt(), g, e, s0[0], s0[dim]);
      } else {
        element::Ftrl(element::FtrlScalars(p), internal::FtrlPow{-p.learning_rate_power}, g, e,
                      s0[0], s0[dim]);
      }
      return;
    case OptimizerKind::kRmsprop:
      element::Rmsprop(lr, p.rho, p.epsilon, p.epsilon_inside_sqrt, g, e, *s0);
      return;
    case OptimizerKind::kCenteredRmsprop:
      element::CenteredRmsprop(lr, p.rho, p.epsilon, p.epsilon_inside_sqrt, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kRmspropMomentum:
      element::RmspropMomentum(lr, p.rho, p.momentum, p.epsilon, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kCenteredRmspropMomentum:
      element::CenteredRmspropMomentum(lr, p.rho, p.momentum, p.epsilon, g, e, s0[0], s0[dim],
                                       s0[2 * dim]);
      return;
    case OptimizerKind::kAdadelta:
      element::Adadelta(lr, p.rho, p.epsilon, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kProximalSgd:
      element::ProximalStep(lr, p.l1, p.l2, g, e);
      return;
    case OptimizerKind::kProximalAdagrad:
      element::ProximalAdagrad(lr, p.l1, p.l2, g, e, *s0);
      return;
    case OptimizerKind::kAdagradDa:
      element::AdagradDa(p.global_step, p.global_step * lr, p.l1, p.l2, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kAdamax:
      element::Adamax(r.step_size, p.beta1, p.beta2, p.epsilon, g, e, s0[0], s0[dim]);
      return;
    case OptimizerKind::kNadam:
      element::Nadam(lr, p.beta1, p.beta2, p.epsilon, r, g, e, s0[0], s0[dim]);
      return;
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZERS_H_
