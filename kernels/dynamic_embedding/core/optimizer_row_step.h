// What a row's update takes from its update count, once per row: Adam's, AMSGrad's, Adamax's and
// Nadam's bias corrections and Nadam's momentum schedule (RowStep), as each wrapped optimizer's
// API computes them. Part of optimizers.h.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ROW_STEP_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ROW_STEP_H_

#include <math.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/host_device.h"
#include "kernels/dynamic_embedding/core/optimizer_params.h"

namespace tf_ext {
namespace de {

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

}  // namespace internal

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ROW_STEP_H_
