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
  const std::vector<std::string> names = {"sgd",      "adagrad",        "adam", "amsgrad",
                                          "momentum", "keras_momentum", "ftrl"};
  std::vector<OptimizerKind> kinds;
  for (const std::string& name : names) {
    OptimizerKind kind;
    ASSERT_TRUE(ParseOptimizerKind(name, &kind)) << name;
    EXPECT_EQ(std::count(kinds.begin(), kinds.end(), kind), 0) << name;
    EXPECT_LE(NumSlots(kind), kMaxSlots) << name;
    kinds.push_back(kind);
  }
  OptimizerKind kind = OptimizerKind::kAdam;
  EXPECT_FALSE(ParseOptimizerKind("rmsprop", &kind));
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
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kAmsgrad}) {
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

}  // namespace
}  // namespace de
}  // namespace tf_ext
