// The step of one element of a row, for each optimizer kind, as TensorFlow's sparse apply kernels
// compute it. Part of optimizers.h.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ELEMENTS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ELEMENTS_H_

#include <math.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/host_device.h"
#include "kernels/dynamic_embedding/core/optimizer_row_step.h"

namespace tf_ext {
namespace de {

namespace internal {

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

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_OPTIMIZER_ELEMENTS_H_
