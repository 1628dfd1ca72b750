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

#include "kernels/dynamic_embedding/core/optimizer_elements.h"
#include "kernels/dynamic_embedding/core/optimizer_params.h"
#include "kernels/dynamic_embedding/core/optimizer_row_step.h"

namespace tf_ext {
namespace de {

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
