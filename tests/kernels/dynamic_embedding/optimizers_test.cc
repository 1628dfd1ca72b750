// The row-wise optimizer math of optimizers.h against closed forms and double-precision
// references of TensorFlow's update rules (training_ops.cc).
#include "kernels/dynamic_embedding/core/optimizers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

OptimizerParams Params(OptimizerKind kind, float learning_rate) {
  OptimizerParams p;
  p.kind = kind;
  p.learning_rate = learning_rate;
  return p;
}

// One row of `dim` floats and its slots, initialised as the table initialises them.
struct Row {
  Row(const OptimizerParams& p, std::vector<float> initial) : embedding(std::move(initial)) {
    const int dim = static_cast<int>(embedding.size());
    for (float init : SlotInitialValues(p)) slots.insert(slots.end(), dim, init);
  }
  void Apply(const OptimizerParams& p, const std::vector<float>& grad) {
    ApplyGradient(p, updates++, grad.data(), static_cast<int>(embedding.size()), embedding.data(),
                  slots.data());
  }
  float slot(int index, int j = 0) const { return slots[index * embedding.size() + j]; }

  std::vector<float> embedding;
  std::vector<float> slots;
  int64_t updates = 0;
};

TEST(OptimizerKindsTest, EveryNameParsesAndUnknownNamesDoNot) {
  const std::vector<std::string> names = {"sgd",
                                          "adagrad",
                                          "adam",
                                          "amsgrad",
                                          "momentum",
                                          "keras_momentum",
                                          "ftrl",
                                          "rmsprop",
                                          "centered_rmsprop",
                                          "rmsprop_momentum",
                                          "centered_rmsprop_momentum",
                                          "adadelta",
                                          "proximal_sgd",
                                          "proximal_adagrad",
                                          "adagrad_da",
                                          "adamax",
                                          "nadam"};
  std::vector<OptimizerKind> kinds;
  for (const std::string& name : names) {
    OptimizerKind kind;
    ASSERT_TRUE(ParseOptimizerKind(name, &kind)) << name;
    EXPECT_EQ(std::count(kinds.begin(), kinds.end(), kind), 0) << name;
    EXPECT_LE(NumSlots(kind), kMaxSlots) << name;
    kinds.push_back(kind);
  }
  OptimizerKind kind = OptimizerKind::kAdam;
  EXPECT_FALSE(ParseOptimizerKind("lion", &kind));
  EXPECT_FALSE(ParseOptimizerKind("", &kind));
  EXPECT_EQ(kind, OptimizerKind::kAdam);  // untouched
}

TEST(OptimizerKindsTest, SlotsAndTheirInitialValues) {
  OptimizerParams p;
  p.initial_accumulator_value = 0.25f;
  const struct {
    OptimizerKind kind;
    std::vector<float> initial;
  } expected[] = {
      {OptimizerKind::kSgd, {}},
      {OptimizerKind::kAdagrad, {0.25f}},
      {OptimizerKind::kAdam, {0.0f, 0.0f}},
      {OptimizerKind::kAmsgrad, {0.0f, 0.0f, 0.0f}},
      {OptimizerKind::kMomentum, {0.0f}},
      {OptimizerKind::kKerasMomentum, {0.0f}},
      {OptimizerKind::kFtrl, {0.25f, 0.0f}},  // accumulator, linear
      {OptimizerKind::kRmsprop, {0.25f}},     // ms (TF1's starts at 1)
      {OptimizerKind::kCenteredRmsprop, {0.25f, 0.0f}},
      {OptimizerKind::kRmspropMomentum, {0.25f, 0.0f}},
      {OptimizerKind::kCenteredRmspropMomentum, {0.25f, 0.0f, 0.0f}},  // ms, mom, mg
      {OptimizerKind::kAdadelta, {0.0f, 0.0f}},
      {OptimizerKind::kProximalSgd, {}},
      {OptimizerKind::kProximalAdagrad, {0.25f}},
      {OptimizerKind::kAdagradDa, {0.0f, 0.25f}},  // gradient sum, squared gradient sum
      {OptimizerKind::kAdamax, {0.0f, 0.0f}},
      {OptimizerKind::kNadam, {0.0f, 0.0f}},
  };
  for (const auto& e : expected) {
    p.kind = e.kind;
    EXPECT_EQ(NumSlots(e.kind), static_cast<int>(e.initial.size()));
    EXPECT_EQ(SlotInitialValues(p), e.initial);
  }
}

TEST(OptimizerKindsTest, HyperparametersFillTheirFields) {
  const float values[] = {0.5f, 0.25f, 0.125f, -0.75f};
  OptimizerParams p = Params(OptimizerKind::kFtrl, 0.1f);
  ASSERT_EQ(NumHyperparameters(p.kind), 4);
  SetHyperparameters(values, &p);
  EXPECT_EQ(p.l1, 0.5f);
  EXPECT_EQ(p.l2, 0.25f);
  EXPECT_EQ(p.l2_shrinkage, 0.125f);
  EXPECT_EQ(p.learning_rate_power, -0.75f);
  for (OptimizerKind kind : {OptimizerKind::kMomentum, OptimizerKind::kKerasMomentum}) {
    OptimizerParams m = Params(kind, 0.1f);
    ASSERT_EQ(NumHyperparameters(kind), 1);
    SetHyperparameters(values, &m);
    EXPECT_EQ(m.momentum, 0.5f);
  }
  for (OptimizerKind kind :
       {OptimizerKind::kRmsprop, OptimizerKind::kCenteredRmsprop, OptimizerKind::kAdadelta}) {
    OptimizerParams r = Params(kind, 0.1f);
    ASSERT_EQ(NumHyperparameters(kind), 1);
    SetHyperparameters(values, &r);
    EXPECT_EQ(r.rho, 0.5f);
  }
  for (OptimizerKind kind :
       {OptimizerKind::kRmspropMomentum, OptimizerKind::kCenteredRmspropMomentum}) {
    OptimizerParams r = Params(kind, 0.1f);
    ASSERT_EQ(NumHyperparameters(kind), 2);
    SetHyperparameters(values, &r);
    EXPECT_EQ(r.rho, 0.5f);
    EXPECT_EQ(r.momentum, 0.25f);
  }
  for (OptimizerKind kind :
       {OptimizerKind::kProximalSgd, OptimizerKind::kProximalAdagrad, OptimizerKind::kAdagradDa}) {
    OptimizerParams r = Params(kind, 0.1f);
    ASSERT_EQ(NumHyperparameters(kind), kind == OptimizerKind::kAdagradDa ? 3 : 2);
    SetHyperparameters(values, &r);
    EXPECT_EQ(r.l1, 0.5f);
    EXPECT_EQ(r.l2, 0.25f);
    if (kind == OptimizerKind::kAdagradDa) {
      EXPECT_EQ(r.global_step, 0.125f);
    }
  }
  OptimizerParams nadam = Params(OptimizerKind::kNadam, 0.1f);
  ASSERT_EQ(NumHyperparameters(nadam.kind), 1);
  SetHyperparameters(values, &nadam);
  EXPECT_EQ(nadam.schedule_decay, 0.5f);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kAmsgrad, OptimizerKind::kAdamax}) {
    EXPECT_EQ(NumHyperparameters(kind), 0);
  }
}

TEST(MomentumTest, Tf1AndKerasMomentumMoveAlikeAtAConstantRateWithSlotsOfTheirOwn) {
  for (bool nesterov : {false, true}) {
    OptimizerParams tf1 = Params(OptimizerKind::kMomentum, 0.1f);
    OptimizerParams keras = Params(OptimizerKind::kKerasMomentum, 0.1f);
    for (OptimizerParams* p : {&tf1, &keras}) {
      p->momentum = 0.9f;
      p->use_nesterov = nesterov;
    }
    Row a(tf1, {0.0f}), b(keras, {0.0f});
    for (int step = 0; step < 2; ++step) {
      a.Apply(tf1, {1.0f});
      b.Apply(keras, {1.0f});
    }
    // accum: 1 then 1.9 (TF1); -lr times that (Keras). Plain: emb = -lr * (1 + 1.9); Nesterov
    // adds momentum * accum: -(0.1 + 0.09) - (0.1 + 0.09 * 1.9).
    const float expected = nesterov ? -0.461f : -0.29f;
    EXPECT_NEAR(a.embedding[0], expected, 1e-6) << nesterov;
    EXPECT_NEAR(b.embedding[0], expected, 1e-6) << nesterov;
    EXPECT_NEAR(a.slot(0), 1.9f, 1e-6);
    EXPECT_NEAR(b.slot(0), -0.19f, 1e-6);
  }
}

TEST(MomentumTest, KerasMomentumFollowsTheLearningRateOfEachStepIntoItsSlot) {
  // TF1 scales the whole accumulator by today's rate; Keras accumulated yesterday's rate.
  OptimizerParams tf1 = Params(OptimizerKind::kMomentum, 1.0f);
  OptimizerParams keras = Params(OptimizerKind::kKerasMomentum, 1.0f);
  tf1.momentum = keras.momentum = 0.5f;
  Row a(tf1, {0.0f}), b(keras, {0.0f});
  a.Apply(tf1, {1.0f});
  b.Apply(keras, {1.0f});
  tf1.learning_rate = keras.learning_rate = 0.1f;
  a.Apply(tf1, {1.0f});
  b.Apply(keras, {1.0f});
  EXPECT_NEAR(a.embedding[0], -1.0f - 0.1f * 1.5f, 1e-6);
  EXPECT_NEAR(b.embedding[0], -1.0f - (0.5f + 0.1f), 1e-6);
}

// TensorFlow's FTRL-Proximal for one coordinate, in double.
struct FtrlReference {
  double lr, l1, l2, shrinkage, power;
  double w, accum, linear = 0.0;
  void Apply(double g) {
    const double new_accum = accum + g * g;
    linear +=
        g + 2 * shrinkage * w - (std::pow(new_accum, -power) - std::pow(accum, -power)) / lr * w;
    const double quadratic = std::pow(new_accum, -power) / lr + 2 * l2;
    w = std::abs(linear) > l1 ? ((linear > 0 ? l1 : -l1) - linear) / quadratic : 0.0;
    accum = new_accum;
  }
};

TEST(FtrlTest, MatchesTheReferenceWithEveryRegularizer) {
  const struct {
    float l1, l2, shrinkage, power;
  } cases[] = {
      {0.0f, 0.0f, 0.0f, -0.5f},  {0.01f, 0.1f, 0.0f, -0.5f}, {0.01f, 0.1f, 0.05f, -0.5f},
      {0.02f, 0.0f, 0.1f, -0.7f}, {0.0f, 0.3f, 0.0f, 0.0f},
  };
  const std::vector<float> grads[] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-0.75f, 0.1f}, {0.3f, -0.2f}};
  for (const auto& c : cases) {
    OptimizerParams p = Params(OptimizerKind::kFtrl, 0.2f);
    p.l1 = c.l1;
    p.l2 = c.l2;
    p.l2_shrinkage = c.shrinkage;
    p.learning_rate_power = c.power;
    p.initial_accumulator_value = 0.1f;
    Row row(p, {0.3f, -0.4f});
    FtrlReference ref[2] = {{0.2, c.l1, c.l2, c.shrinkage, c.power, 0.3, 0.1},
                            {0.2, c.l1, c.l2, c.shrinkage, c.power, -0.4, 0.1}};
    for (const auto& g : grads) {
      row.Apply(p, g);
      for (int j = 0; j < 2; ++j) ref[j].Apply(g[j]);
    }
    for (int j = 0; j < 2; ++j) {
      SCOPED_TRACE(testing::Message() << "l1 " << c.l1 << " l2 " << c.l2 << " shrinkage "
                                      << c.shrinkage << " power " << c.power << " j " << j);
      EXPECT_NEAR(row.embedding[j], ref[j].w, 1e-5);
      EXPECT_NEAR(row.slot(0, j), ref[j].accum, 1e-5);
      EXPECT_NEAR(row.slot(1, j), ref[j].linear, 1e-4);
    }
  }
}

TEST(FtrlTest, L1MakesSmallWeightsExactlyZero) {
  OptimizerParams p = Params(OptimizerKind::kFtrl, 0.1f);
  p.initial_accumulator_value = 0.1f;
  p.l1 = 10.0f;  // |linear| stays below it
  Row row(p, {0.5f});
  row.Apply(p, {1.0f});
  EXPECT_EQ(row.embedding[0], 0.0f);
  EXPECT_NE(row.slot(1), 0.0f);  // the linear slot still moved
}

TEST(FtrlTest, FixedRateWithoutRegularizationIsDualAveraging) {
  // learning_rate_power 0: the weight is -lr times the sum of gradients, whatever it started at.
  OptimizerParams p = Params(OptimizerKind::kFtrl, 0.5f);
  p.learning_rate_power = 0.0f;
  Row row(p, {7.0f});
  row.Apply(p, {1.0f});
  row.Apply(p, {2.0f});
  EXPECT_NEAR(row.embedding[0], -1.5f, 1e-6);
}

TEST(AmsgradTest, UsesTheLargestSecondMomentSoFar) {
  OptimizerParams p = Params(OptimizerKind::kAmsgrad, 0.1f);
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.epsilon = 1e-7f;
  OptimizerParams adam = p;
  adam.kind = OptimizerKind::kAdam;
  Row a(p, {1.0f}), b(adam, {1.0f});
  a.Apply(p, {10.0f});
  b.Apply(adam, {10.0f});
  EXPECT_EQ(a.embedding[0], b.embedding[0]);  // first step: max(0, v) = v
  a.Apply(p, {0.01f});
  b.Apply(adam, {0.01f});
  // v decays after the large gradient; AMSGrad divides by the maximum, so it steps less.
  const double b1 = p.beta1, b2 = p.beta2;  // the float values, in double
  const double m = b1 * (1 - b1) * 10.0 + (1 - b1) * 0.01;
  const double v_max = (1 - b2) * 100.0;
  const double v = b2 * v_max + (1 - b2) * 0.0001;
  const double lr_t = 0.1 * std::sqrt(1 - b2 * b2) / (1 - b1 * b1);
  EXPECT_NEAR(a.slot(1), v, 1e-6 * v);
  EXPECT_NEAR(a.slot(2), v_max, 1e-6 * v_max);
  const double before = a.embedding[0] + lr_t * m / (std::sqrt(v_max) + 1e-7);
  EXPECT_NEAR(b.embedding[0], before - lr_t * m / (std::sqrt(v) + 1e-7), 1e-5);
  EXPECT_LT(std::abs(a.embedding[0] - before), std::abs(b.embedding[0] - before));
}

TEST(AmsgradTest, BiasCorrectsWithTheRowsOwnUpdateCount) {
  OptimizerParams p = Params(OptimizerKind::kAmsgrad, 0.1f);
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.epsilon = 1e-8f;
  float emb[1] = {1.0f}, slots[3] = {0.0f, 0.0f, 0.0f}, grad[1] = {2.0f};
  ApplyGradient(p, /*prior_updates=*/0, grad, 1, emb, slots);
  EXPECT_NEAR(emb[0], 0.9f, 1e-6);  // first update: lr * sign(g), as Adam
}

// TensorFlow's RMSprop kernels for one coordinate, in double: SparseApplyRMSProp and
// SparseApplyCenteredRMSProp, and Keras' updates without momentum.
struct RmspropReference {
  double lr, rho, momentum, eps;
  bool centered, with_momentum, eps_inside;
  double w, ms, mom = 0.0, mg = 0.0;
  void Apply(double g) {
    ms = rho * ms + (1 - rho) * g * g;
    if (centered) mg = rho * mg + (1 - rho) * g;
    const double variance = ms - mg * mg;
    if (with_momentum) {
      mom = momentum * mom + lr * g / std::sqrt(variance + eps);
      w -= mom;
    } else {
      w -= eps_inside ? lr * g / std::sqrt(variance + eps) : lr * g / (std::sqrt(variance) + eps);
    }
  }
};

TEST(RmspropTest, EveryVariantMatchesTheReference) {
  const std::vector<float> grads[] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-0.75f, 0.1f}, {0.3f, -0.2f}};
  for (OptimizerKind kind :
       {OptimizerKind::kRmsprop, OptimizerKind::kCenteredRmsprop, OptimizerKind::kRmspropMomentum,
        OptimizerKind::kCenteredRmspropMomentum}) {
    for (bool inside : {false, true}) {
      OptimizerParams p = Params(kind, 0.05f);
      p.rho = 0.8f;
      p.momentum = 0.5f;
      p.epsilon = 1e-3f;
      p.epsilon_inside_sqrt = inside;
      p.initial_accumulator_value = 1.0f;  // TF1's rms
      const bool centered = kind == OptimizerKind::kCenteredRmsprop ||
                            kind == OptimizerKind::kCenteredRmspropMomentum;
      const bool with_momentum = kind == OptimizerKind::kRmspropMomentum ||
                                 kind == OptimizerKind::kCenteredRmspropMomentum;
      Row row(p, {0.3f, -0.4f});
      RmspropReference ref[2] = {
          {0.05, p.rho, 0.5, p.epsilon, centered, with_momentum, inside, 0.3, 1.0},
          {0.05, p.rho, 0.5, p.epsilon, centered, with_momentum, inside, -0.4, 1.0}};
      for (const auto& g : grads) {
        row.Apply(p, g);
        for (int j = 0; j < 2; ++j) ref[j].Apply(g[j]);
      }
      for (int j = 0; j < 2; ++j) {
        SCOPED_TRACE(testing::Message()
                     << "kind " << static_cast<int>(kind) << " inside " << inside << " j " << j);
        EXPECT_NEAR(row.embedding[j], ref[j].w, 1e-5);
        EXPECT_NEAR(row.slot(0, j), ref[j].ms, 1e-6);
        if (with_momentum) {
          EXPECT_NEAR(row.slot(1, j), ref[j].mom, 1e-6);
        }
        if (centered) {
          EXPECT_NEAR(row.slot(with_momentum ? 2 : 1, j), ref[j].mg, 1e-6);
        }
      }
    }
  }
}

TEST(AdadeltaTest, MovesByTheUpdateBeforeItsAccumulatorDecays) {
  OptimizerParams p = Params(OptimizerKind::kAdadelta, 1.0f);
  p.rho = 0.9f;
  p.epsilon = 1e-2f;
  Row row(p, {0.0f});
  double w = 0.0, accum = 0.0, accum_update = 0.0;
  for (float g : {1.0f, -0.5f, 2.0f}) {
    row.Apply(p, {g});
    accum = 0.9 * accum + 0.1 * g * g;
    const double update = std::sqrt(accum_update + 1e-2) / std::sqrt(accum + 1e-2) * g;
    w -= update;
    accum_update = 0.9 * accum_update + 0.1 * update * update;
  }
  EXPECT_NEAR(row.embedding[0], w, 1e-5);
  EXPECT_NEAR(row.slot(0), accum, 1e-6);
  EXPECT_NEAR(row.slot(1), accum_update, 1e-6);
}

TEST(ProximalTest, L1ShrinksToZeroAndL2Scales) {
  // Gradient descent: w = 1 - 0.1 * 2 = 0.8, then shrunk by lr * l1 = 0.05 and divided by
  // 1 + lr * l2 = 1.02.
  OptimizerParams sgd = Params(OptimizerKind::kProximalSgd, 0.1f);
  sgd.l1 = 0.5f;
  sgd.l2 = 0.2f;
  Row a(sgd, {1.0f, 0.01f});
  a.Apply(sgd, {2.0f, 0.0f});
  EXPECT_NEAR(a.embedding[0], 0.75 / 1.02, 1e-6);
  EXPECT_EQ(a.embedding[1], 0.0f);  // |0.01| < lr * l1
  // Adagrad's rate: lr / sqrt(accum), accum = 0.1 + 4.
  OptimizerParams adagrad = Params(OptimizerKind::kProximalAdagrad, 0.1f);
  adagrad.l1 = 0.5f;
  adagrad.l2 = 0.2f;
  adagrad.initial_accumulator_value = 0.1f;
  Row b(adagrad, {1.0f});
  b.Apply(adagrad, {2.0f});
  const double rate = 0.1 / std::sqrt(4.1);
  EXPECT_NEAR(b.embedding[0], (1.0 - 2.0 * rate - rate * 0.5) / (1.0 + 0.2 * rate), 1e-6);
  EXPECT_NEAR(b.slot(0), 4.1, 1e-6);
}

TEST(AdagradDaTest, TheWeightFollowsTheSumsAtTheGlobalStep) {
  OptimizerParams p = Params(OptimizerKind::kAdagradDa, 0.5f);
  p.initial_accumulator_value = 0.1f;
  p.l1 = 0.01f;
  p.l2 = 0.2f;
  Row row(p, {7.0f});
  double g_sum = 0.0, g2_sum = 0.1;
  for (int step = 1; step <= 3; ++step) {
    const float g = 0.5f * step;
    p.global_step = static_cast<float>(step + 4);  // the optimizer's, not the row's
    row.Apply(p, {g});
    g_sum += g;
    g2_sum += g * g;
    const double t = step + 4;
    const double w = -(std::abs(g_sum) / t - 0.01) / (0.2 + std::sqrt(g2_sum) / (t * 0.5));
    EXPECT_NEAR(row.embedding[0], w, 1e-6) << step;
  }
  EXPECT_NEAR(row.slot(0), 3.0, 1e-6);
  EXPECT_NEAR(row.slot(1), 3.6, 1e-6);
}

TEST(AdamaxTest, BiasCorrectsWithTheRowsOwnUpdateCount) {
  OptimizerParams p = Params(OptimizerKind::kAdamax, 0.1f);
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.epsilon = 1e-7f;
  Row row(p, {1.0f});
  row.Apply(p, {2.0f});
  // First update: m = 0.2, u = 2, lr / (1 - 0.9) * m / u = lr.
  EXPECT_NEAR(row.embedding[0], 0.9f, 1e-6);
  row.Apply(p, {-1.0f});
  const double b1 = p.beta1, b2 = p.beta2;
  const double m = b1 * (1 - b1) * 2.0 - (1 - b1), u = std::max(b2 * 2.0, 1.0);
  EXPECT_NEAR(row.embedding[0], 0.9 - 0.1 / (1 - b1 * b1) * m / (u + 1e-7), 1e-6);
  EXPECT_NEAR(row.slot(1), u, 1e-6);
}

// Keras' Nadam for one coordinate, in double, with its momentum schedule.
struct NadamReference {
  double lr, beta1, beta2, eps, decay;
  double w, m = 0.0, v = 0.0, product = 1.0;
  int t = 0;
  double U(int i) const { return beta1 * (1 - 0.5 * std::pow(0.96, decay * i)); }
  void Apply(double g) {
    ++t;
    product *= U(t);
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_bar = (1 - U(t)) * g / (1 - product) + U(t + 1) * m / (1 - product * U(t + 1));
    w -= lr * m_bar / (std::sqrt(v / (1 - std::pow(beta2, t))) + eps);
  }
};

TEST(NadamTest, MatchesKerasScheduleForBothDecays) {
  for (float decay : {1.0f, 0.004f}) {
    OptimizerParams p = Params(OptimizerKind::kNadam, 0.05f);
    p.beta1 = 0.9f;
    p.beta2 = 0.999f;
    p.epsilon = 1e-7f;
    p.schedule_decay = decay;
    Row row(p, {0.3f});
    NadamReference ref{0.05, p.beta1, p.beta2, 1e-7, decay, 0.3};
    for (float g : {0.5f, -1.0f, 0.25f, 2.0f, -0.75f}) {
      row.Apply(p, {g});
      ref.Apply(g);
    }
    EXPECT_NEAR(row.embedding[0], ref.w, 1e-6) << decay;
    EXPECT_NEAR(row.slot(0), ref.m, 1e-6) << decay;
    EXPECT_NEAR(row.slot(1), ref.v, 1e-6) << decay;
  }
}

TEST(NadamTest, TheMomentumProductOfLongRunsIsEveryFactorMultipliedOut) {
  // Past the head the factors are beta1 (or the product is 0): a long-trained row's product costs
  // one pow, and equals the product of all its factors.
  for (float decay : {1.0f, 0.004f, 0.2f}) {
    for (float beta1 : {0.9f, 0.999f}) {
      OptimizerParams p = Params(OptimizerKind::kNadam, 0.05f);
      p.beta1 = beta1;
      p.schedule_decay = decay;
      const NadamHead head = NadamHeadOf(p);
      ASSERT_GE(head.length, 1);
      ASSERT_LT(head.length, int64_t{20000}) << decay << " " << beta1;
      double product = 1.0;
      for (int64_t t = 1; t <= 3 * head.length + 5; ++t) {
        product *= static_cast<double>(beta1) * (1.0 - 0.5 * std::pow(0.96, decay * t));
        const RowStep r = RowStepOf(p, head, t - 1);
        ASSERT_NEAR(r.one_minus_product, 1.0 - product, 1e-6) << decay << " " << beta1 << " " << t;
      }
      // Without a head, RowStepOf computes one: the same values.
      const RowStep with = RowStepOf(p, head, 2 * head.length),
                    without = RowStepOf(p, NadamHead{}, 2 * head.length);
      EXPECT_EQ(with.one_minus_product, without.one_minus_product);
      EXPECT_EQ(with.one_minus_product_next, without.one_minus_product_next);
    }
  }
}

TEST(RowStepTest, KindsWithoutOneReadNone) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAmsgrad, OptimizerKind::kAdamax,
                             OptimizerKind::kNadam}) {
    EXPECT_TRUE(NeedsRowStep(kind));
  }
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kRmsprop,
                             OptimizerKind::kAdagradDa, OptimizerKind::kFtrl}) {
    EXPECT_FALSE(NeedsRowStep(kind));
  }
}

// TF1's float32 beta power variables: beta multiplied in, step by step.
float Tf1Power(float beta, int64_t t) {
  float power = beta;
  for (int64_t i = 1; i < t; ++i) power *= beta;
  return power;
}

TEST(BiasCorrectionTest, NamesParse) {
  BiasCorrection mode;
  ASSERT_TRUE(ParseBiasCorrection("exact", &mode));
  EXPECT_EQ(mode, BiasCorrection::kExact);
  ASSERT_TRUE(ParseBiasCorrection("tf1", &mode));
  EXPECT_EQ(mode, BiasCorrection::kTf1);
  ASSERT_TRUE(ParseBiasCorrection("keras_legacy", &mode));
  EXPECT_EQ(mode, BiasCorrection::kKerasLegacy);
  ASSERT_TRUE(ParseBiasCorrection("keras", &mode));
  EXPECT_EQ(mode, BiasCorrection::kKeras);
  EXPECT_FALSE(ParseBiasCorrection("double", &mode));
}

TEST(BiasCorrectionTest, AdamStepSizesAreTheApisFloat32Ones) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAmsgrad}) {
    OptimizerParams p = Params(kind, 0.01f);
    p.beta1 = 0.9f;
    p.beta2 = 0.999f;
    for (int64_t t : {1, 2, 3, 10, 100, 257, 1000, 5000}) {
      const float b1_tf1 = Tf1Power(p.beta1, t), b2_tf1 = Tf1Power(p.beta2, t);
      const float b1_pow = powf(p.beta1, static_cast<float>(t));
      const float b2_pow = powf(p.beta2, static_cast<float>(t));
      p.bias_correction = BiasCorrection::kTf1;
      EXPECT_EQ(RowStepOf(p, NadamHead{}, t - 1).step_size,
                p.learning_rate * sqrtf(1.0f - b2_tf1) / (1.0f - b1_tf1))
          << t;
      EXPECT_EQ(internal::RememberedRowStep(p, t - 1).step_size,
                RowStepOf(p, NadamHead{}, t - 1).step_size)
          << t;
      p.bias_correction = BiasCorrection::kKerasLegacy;
      EXPECT_EQ(RowStepOf(p, NadamHead{}, t - 1).step_size,
                p.learning_rate * (sqrtf(1.0f - b2_pow) / (1.0f - b1_pow)))
          << t;
      p.bias_correction = BiasCorrection::kKeras;
      EXPECT_EQ(RowStepOf(p, NadamHead{}, t - 1).step_size,
                p.learning_rate * sqrtf(1.0f - b2_pow) / (1.0f - b1_pow))
          << t;
      EXPECT_EQ(internal::RememberedRowStep(p, t - 1).step_size,
                RowStepOf(p, NadamHead{}, t - 1).step_size)
          << t;
    }
  }
}

TEST(BiasCorrectionTest, AdamaxAndNadamUseFloatPow) {
  OptimizerParams p = Params(OptimizerKind::kAdamax, 0.002f);
  p.bias_correction = BiasCorrection::kKerasLegacy;
  EXPECT_EQ(RowStepOf(p, NadamHead{}, 9).step_size, p.learning_rate / (1.0f - powf(0.9f, 10.0f)));
  p.kind = OptimizerKind::kNadam;
  p.bias_correction = BiasCorrection::kKeras;
  EXPECT_EQ(RowStepOf(p, NadamHeadOf(p), 9).one_minus_beta2_power, 1.0f - powf(0.999f, 10.0f));
}

TEST(BiasCorrectionTest, Tf1RunningPowerOfLongRunsIsEveryFactorMultipliedOut) {
  for (float beta : {0.9f, 0.999f, 0.9999f}) {
    float power = beta;
    for (int64_t t = 1; t <= 40000; ++t) {
      if (t > 1) power *= beta;
      // Past 2^-25 the product may stop early: 1 - power is 1 either way.
      const float remembered = internal::RememberedRunningPower(beta, t);
      ASSERT_EQ(1.0f - remembered, 1.0f - power) << beta << " " << t;
      if (t % 997 == 0) {
        ASSERT_EQ(1.0f - internal::RunningPower(beta, t), 1.0f - power) << beta << " " << t;
      }
    }
  }
  // Betas at 1 end at the bound: beyond it, powf.
  EXPECT_EQ(internal::RunningPower(1.0f, int64_t{1} << 40), 1.0f);
}

TEST(BiasCorrectionTest, ASharedStepCorrectsEveryRowAsARowWithThatManyUpdates) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAmsgrad, OptimizerKind::kAdamax,
                             OptimizerKind::kNadam}) {
    for (BiasCorrection mode : {BiasCorrection::kExact, BiasCorrection::kTf1,
                                BiasCorrection::kKerasLegacy, BiasCorrection::kKeras}) {
      SCOPED_TRACE(testing::Message() << static_cast<int>(kind) << " " << static_cast<int>(mode));
      OptimizerParams own = Params(kind, 0.1f);
      own.bias_correction = mode;
      own.epsilon = 1e-7f;
      OptimizerParams shared = own;
      shared.shared_prior_updates = 6;
      const float grad[2] = {0.5f, -2.0f};
      float by_own[2] = {1.0f, -1.0f}, by_own_slots[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
      float by_shared[2] = {1.0f, -1.0f}, by_shared_slots[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
      ApplyGradient(own, /*prior_updates=*/6, grad, 2, by_own, by_own_slots);
      // A row updated once before: the shared step wins over its own count.
      ApplyGradient(shared, /*prior_updates=*/1, grad, 2, by_shared, by_shared_slots);
      for (int j = 0; j < 2; ++j) EXPECT_EQ(by_shared[j], by_own[j]);
      for (int j = 0; j < 6; ++j) EXPECT_EQ(by_shared_slots[j], by_own_slots[j]);
      // The GPU table's per-row step is the same.
      const RowStep a = RowStepOf(shared, NadamHeadOf(shared), 1);
      const RowStep b = RowStepOf(own, NadamHeadOf(own), 6);
      EXPECT_EQ(a.step_size, b.step_size);
      EXPECT_EQ(a.one_minus_product, b.one_minus_product);
      EXPECT_EQ(a.one_minus_beta2_power, b.one_minus_beta2_power);
    }
  }
  // Kinds without a bias correction ignore it.
  OptimizerParams adagrad = Params(OptimizerKind::kAdagrad, 0.1f);
  EXPECT_FALSE(NeedsRowStep(adagrad.kind));
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
