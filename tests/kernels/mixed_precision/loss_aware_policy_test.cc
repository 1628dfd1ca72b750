// The loss-aware precision policy alone: loss scaling, each fallback trigger, the return to half
// precision with back-off, skipped steps, and the state's round trip through its array.
#include "kernels/mixed_precision/core/loss_aware_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace tf_ext {
namespace amp {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

PolicyConfig Fp16() {
  PolicyConfig config;
  config.initial_loss_scale = 1024.0;
  config.growth_interval = 4;
  config.min_loss_scale = 1.0;
  config.max_nonfinite_streak = 3;
  config.spike_warmup_steps = 10;
  config.return_after_steps = 5;
  config.max_return_after_steps = 20;
  config.stable_half_steps = 50;
  return config;
}

PolicyConfig Bf16() {
  PolicyConfig config = Fp16();
  config.loss_scaling = false;
  return config;
}

Observation Loss(double loss, bool finite_gradients = true) {
  Observation seen;
  seen.loss = loss;
  seen.gradients_finite = finite_gradients;
  return seen;
}

// Runs `n` ordinary steps (loss 1 +- 0.01, finite); returns how many were applied.
int Ordinary(const PolicyConfig& config, int n, PolicyState* state) {
  int applied = 0;
  for (int i = 0; i < n; ++i) applied += Step(config, Loss(1.0 + 0.01 * (i % 3 - 1)), state).apply;
  return applied;
}

TEST(LossAwarePolicy, DefaultsAreValidAndBadValuesAreRejected) {
  std::string error;
  EXPECT_TRUE(PolicyConfig().Valid(&error)) << error;
  PolicyConfig config;
  config.loss_decay = 1.0;
  EXPECT_FALSE(config.Valid(&error));
  EXPECT_NE(error.find("loss_decay"), std::string::npos);
  config = PolicyConfig();
  config.min_loss_scale = 2 * config.initial_loss_scale;
  EXPECT_FALSE(config.Valid(&error));
  config = PolicyConfig();
  config.max_return_after_steps = config.return_after_steps - 1;
  EXPECT_FALSE(config.Valid(&error));
}

TEST(LossAwarePolicy, LossScaleGrowsAfterFiniteStepsAndHalvesOnOverflow) {
  const PolicyConfig config = Fp16();
  PolicyState state = InitialState(config, Precision::kHalf);
  EXPECT_EQ(state.loss_scale, 1024.0);
  EXPECT_EQ(Ordinary(config, 4, &state), 4);
  EXPECT_EQ(state.loss_scale, 2048.0);
  const Decision skipped = Step(config, Loss(1.0, /*finite_gradients=*/false), &state);
  EXPECT_FALSE(skipped.apply);
  EXPECT_FALSE(skipped.switched);
  EXPECT_EQ(state.loss_scale, 1024.0);
  EXPECT_EQ(state.precision, Precision::kHalf);
  EXPECT_EQ(state.skipped_steps, 1);
  // The streak of finite steps restarts after an overflow.
  EXPECT_EQ(Ordinary(config, 3, &state), 3);
  EXPECT_EQ(state.loss_scale, 1024.0);
  Ordinary(config, 1, &state);
  EXPECT_EQ(state.loss_scale, 2048.0);
}

TEST(LossAwarePolicy, Fp16FallsBackAfterConsecutiveOverflowsThenReturns) {
  const PolicyConfig config = Fp16();
  PolicyState state = InitialState(config, Precision::kHalf);
  Step(config, Loss(1.0, false), &state);
  Step(config, Loss(1.0, false), &state);
  EXPECT_EQ(state.precision, Precision::kHalf);
  const Decision third = Step(config, Loss(1.0, false), &state);
  EXPECT_TRUE(third.switched);
  EXPECT_FALSE(third.apply);
  EXPECT_EQ(state.precision, Precision::kFull);
  EXPECT_EQ(state.last_fallback, Fallback::kNonFiniteStreak);
  // It failed soon after starting: the wait doubles, from 5 to 10 applied full steps.
  EXPECT_EQ(state.return_after, 10);
  EXPECT_EQ(Ordinary(config, 9, &state), 9);
  EXPECT_EQ(state.precision, Precision::kFull);
  const Decision back = Step(config, Loss(1.0), &state);
  EXPECT_TRUE(back.apply);
  EXPECT_TRUE(back.switched);
  EXPECT_EQ(state.precision, Precision::kHalf);
  EXPECT_EQ(state.loss_scale, 1024.0);  // back to the initial scale
  EXPECT_EQ(state.switches, 2);
}

TEST(LossAwarePolicy, Fp16FallsBackWhenTheScaleFallsBelowItsFloor) {
  PolicyConfig config = Fp16();
  config.initial_loss_scale = 4.0;
  config.min_loss_scale = 2.0;
  PolicyState state = InitialState(config, Precision::kHalf);
  Step(config, Loss(1.0, false), &state);  // 4 -> 2: at the floor, still half
  EXPECT_EQ(state.precision, Precision::kHalf);
  Ordinary(config, 1, &state);             // resets the non-finite streak
  Step(config, Loss(1.0, false), &state);  // 2 -> 1: below
  EXPECT_EQ(state.precision, Precision::kFull);
  EXPECT_EQ(state.last_fallback, Fallback::kScaleFloor);
}

TEST(LossAwarePolicy, Bf16FallsBackAtOnceOnANonFiniteLossOrGradient) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  EXPECT_EQ(state.loss_scale, 1.0);
  const Decision nan_loss = Step(config, Loss(kNaN), &state);
  EXPECT_FALSE(nan_loss.apply);
  EXPECT_EQ(state.precision, Precision::kFull);
  EXPECT_EQ(state.last_fallback, Fallback::kNonFinite);
  EXPECT_EQ(state.losses_seen, 0);  // a NaN never enters the statistics
}

TEST(LossAwarePolicy, ProbeMismatchFallsBackAndIsRecorded) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  Observation seen = Loss(1.0);
  seen.probed = true;
  seen.probe_error = 0.01;
  EXPECT_TRUE(Step(config, seen, &state).apply);
  EXPECT_EQ(state.precision, Precision::kHalf);
  EXPECT_DOUBLE_EQ(state.last_probe_error, 0.01);
  seen.probe_error = 0.5;
  const Decision mismatch = Step(config, seen, &state);
  EXPECT_FALSE(mismatch.apply);
  EXPECT_EQ(state.precision, Precision::kFull);
  EXPECT_EQ(state.last_fallback, Fallback::kProbe);
  EXPECT_DOUBLE_EQ(state.last_probe_error, 0.5);
}

TEST(LossAwarePolicy, LossSpikeFallsBackOnlyAfterWarmup) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  Step(config, Loss(1.0), &state);
  Step(config, Loss(100.0), &state);  // a jump during warm-up is not a spike
  EXPECT_EQ(state.precision, Precision::kHalf);
  state = InitialState(config, Precision::kHalf);
  Ordinary(config, 20, &state);
  EXPECT_EQ(state.precision, Precision::kHalf);
  const double mean = state.loss_mean;
  const Decision spike = Step(config, Loss(5.0), &state);
  EXPECT_FALSE(spike.apply);
  EXPECT_EQ(state.last_fallback, Fallback::kLossSpike);
  EXPECT_DOUBLE_EQ(state.loss_mean, mean);  // the spike does not enter the statistics
}

TEST(LossAwarePolicy, FullPrecisionNeverAppliesNonFiniteStepsAndRestartsItsStreak) {
  const PolicyConfig config = Fp16();
  PolicyState state = InitialState(config, Precision::kFull);
  EXPECT_EQ(Ordinary(config, 4, &state), 4);
  EXPECT_FALSE(Step(config, Loss(1.0, false), &state).apply);
  EXPECT_EQ(state.full_streak, 0);
  EXPECT_EQ(Ordinary(config, 4, &state), 4);
  EXPECT_EQ(state.precision, Precision::kFull);
  Ordinary(config, 1, &state);
  EXPECT_EQ(state.precision, Precision::kHalf);
}

TEST(LossAwarePolicy, BackOffDoublesUpToItsCapAndResetsAfterAStableStretch) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  std::vector<int64_t> waits;
  for (int i = 0; i < 4; ++i) {
    Step(config, Loss(kNaN), &state);  // falls back at once
    waits.push_back(state.return_after);
    Ordinary(config, static_cast<int>(state.return_after), &state);
    ASSERT_EQ(state.precision, Precision::kHalf);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{10, 20, 20, 20}));
  Ordinary(config, static_cast<int>(config.stable_half_steps), &state);
  Step(config, Loss(kNaN), &state);
  EXPECT_EQ(state.return_after, config.return_after_steps);
}

TEST(LossAwarePolicy, CountsStepsInHalfPrecision) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  Ordinary(config, 10, &state);
  Step(config, Loss(kNaN), &state);
  Ordinary(config, 10, &state);  // 10 full steps, then back to half
  EXPECT_EQ(state.steps, 21);
  EXPECT_EQ(state.half_steps, 11);
  EXPECT_EQ(state.skipped_steps, 1);
}

TEST(LossAwarePolicy, StateRoundTripsThroughItsArray) {
  const PolicyConfig config = Fp16();
  PolicyState state = InitialState(config, Precision::kHalf);
  Ordinary(config, 7, &state);
  Step(config, Loss(1.0, false), &state);
  double values[PolicyState::kSize];
  state.ToArray(values);
  const PolicyState copy = PolicyState::FromArray(values);
  double again[PolicyState::kSize];
  copy.ToArray(again);
  for (int i = 0; i < PolicyState::kSize; ++i) EXPECT_EQ(values[i], again[i]) << i;
  // The copy decides as the original does.
  PolicyState a = state, b = copy;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(Step(config, Loss(1.0, i % 2 == 0), &a).apply,
              Step(config, Loss(1.0, i % 2 == 0), &b).apply);
  }
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.precision, b.precision);
}

// Found by tests/kernels/mixed_precision/fuzz/loss_aware_policy_fuzzer.cc: the state variable can
// hold anything (a checkpoint, a user's assign), and FromArray converted NaN and out-of-range
// doubles to int64 (undefined behaviour; on x86 a NaN streak became INT64_MIN). Counters are now
// clamped to [0, 2^62] and an unknown fallback code reads as none.
TEST(LossAwarePolicy, StateFromAnyArrayHasCountersInRange) {
  double values[PolicyState::kSize];
  for (int i = 0; i < PolicyState::kSize; ++i) values[i] = i % 2 ? std::nan("") : 1e300;
  values[3] = -5.0;
  values[11] = 99.0;  // no such fallback
  const PolicyState state = PolicyState::FromArray(values);
  const int64_t kMax = int64_t{1} << 62;
  EXPECT_EQ(state.finite_streak, kMax);  // 1e300
  EXPECT_EQ(state.nonfinite_streak, 0);  // -5
  EXPECT_EQ(state.full_streak, kMax);
  EXPECT_EQ(state.half_run, 0);  // NaN
  EXPECT_EQ(state.steps, 0);
  EXPECT_EQ(state.losses_seen, kMax);
  EXPECT_EQ(state.last_fallback, Fallback::kNone);
  PolicyState stepped = state;
  Step(Fp16(), Loss(1.0, true), &stepped);  // no overflow at the next increment
  EXPECT_EQ(stepped.steps, 1);
}

// Found by the same fuzzer: a fallback doubled a restored wait of 2^62 steps before capping it, a
// signed overflow. The doubling is capped before it happens now.
TEST(LossAwarePolicy, AFallbackCapsAHugeRestoredWaitWithoutOverflow) {
  const PolicyConfig config = Bf16();
  PolicyState state = InitialState(config, Precision::kHalf);
  state.return_after = int64_t{1} << 62;
  Step(config, Loss(kNaN), &state);
  EXPECT_EQ(state.last_fallback, Fallback::kNonFinite);
  EXPECT_EQ(state.return_after, config.max_return_after_steps);
}

}  // namespace
}  // namespace amp
}  // namespace tf_ext
