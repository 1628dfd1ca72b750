#include "kernels/mixed_precision/core/loss_aware_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tf_ext {
namespace amp {

bool PolicyConfig::Valid(std::string* error) const {
  auto fail = [error](const char* why) {
    *error = why;
    return false;
  };
  if (!(initial_loss_scale >= 1.0) || !std::isfinite(initial_loss_scale)) {
    return fail("initial_loss_scale must be finite and >= 1");
  }
  if (growth_interval < 1) return fail("growth_interval must be >= 1");
  if (!(min_loss_scale > 0.0) || min_loss_scale > initial_loss_scale) {
    return fail("min_loss_scale must be in (0, initial_loss_scale]");
  }
  if (max_nonfinite_streak < 1) return fail("max_nonfinite_streak must be >= 1");
  if (!(probe_tolerance > 0.0)) return fail("probe_tolerance must be > 0");
  if (!(spike_sigmas > 0.0)) return fail("spike_sigmas must be > 0");
  if (spike_warmup_steps < 2) return fail("spike_warmup_steps must be >= 2");
  if (!(loss_decay > 0.0 && loss_decay < 1.0)) return fail("loss_decay must be in (0, 1)");
  if (return_after_steps < 1) return fail("return_after_steps must be >= 1");
  if (max_return_after_steps < return_after_steps) {
    return fail("max_return_after_steps must be >= return_after_steps");
  }
  if (stable_half_steps < 1) return fail("stable_half_steps must be >= 1");
  return true;
}

void PolicyState::ToArray(double* out) const {
  const double values[kSize] = {static_cast<double>(precision),
                                loss_scale,
                                static_cast<double>(finite_streak),
                                static_cast<double>(nonfinite_streak),
                                static_cast<double>(full_streak),
                                static_cast<double>(half_run),
                                static_cast<double>(return_after),
                                static_cast<double>(steps),
                                static_cast<double>(half_steps),
                                static_cast<double>(skipped_steps),
                                static_cast<double>(switches),
                                static_cast<double>(last_fallback),
                                loss_mean,
                                loss_variance,
                                static_cast<double>(losses_seen),
                                last_probe_error};
  std::copy(values, values + kSize, out);
}

namespace {

// A counter from the state's array, which a checkpoint or a user's assign may fill with anything:
// NaN, an infinity or a value outside int64's range would be undefined behaviour to convert, and a
// counter near int64's top would overflow at its next increment. Clamped to [0, 2^62]: far past any
// real count, far below int64's top, and a clamped counter's next increments round to the same
// double, so the state still round-trips through its array.
int64_t CounterFrom(double value) {
  constexpr double kMaxCounter = 4611686018427387904.0;  // 2^62
  if (!(value > 0.0)) return 0;                          // NaN too
  return static_cast<int64_t>(std::min(value, kMaxCounter));
}

Fallback FallbackFrom(double value) {
  const int64_t code = CounterFrom(value);
  return code <= static_cast<int64_t>(Fallback::kLossSpike) ? static_cast<Fallback>(code)
                                                            : Fallback::kNone;
}

}  // namespace

PolicyState PolicyState::FromArray(const double* v) {
  PolicyState s;
  s.precision = v[0] != 0.0 ? Precision::kHalf : Precision::kFull;
  s.loss_scale = v[1];
  s.finite_streak = CounterFrom(v[2]);
  s.nonfinite_streak = CounterFrom(v[3]);
  s.full_streak = CounterFrom(v[4]);
  s.half_run = CounterFrom(v[5]);
  s.return_after = CounterFrom(v[6]);
  s.steps = CounterFrom(v[7]);
  s.half_steps = CounterFrom(v[8]);
  s.skipped_steps = CounterFrom(v[9]);
  s.switches = CounterFrom(v[10]);
  s.last_fallback = FallbackFrom(v[11]);
  s.loss_mean = v[12];
  s.loss_variance = v[13];
  s.losses_seen = CounterFrom(v[14]);
  s.last_probe_error = v[15];
  return s;
}

PolicyState InitialState(const PolicyConfig& config, Precision start) {
  PolicyState state;
  state.precision = start;
  state.loss_scale = config.loss_scaling ? config.initial_loss_scale : 1.0;
  state.return_after = config.return_after_steps;
  return state;
}

namespace {

bool IsSpike(const PolicyConfig& config, const PolicyState& state, double loss) {
  if (state.losses_seen < config.spike_warmup_steps) return false;
  return loss > state.loss_mean + config.spike_sigmas * std::sqrt(state.loss_variance);
}

// Exponential moving mean and variance; the first loss seeds the mean.
void TrackLoss(const PolicyConfig& config, double loss, PolicyState* state) {
  if (state->losses_seen == 0) {
    state->loss_mean = loss;
    state->loss_variance = 0.0;
  } else {
    const double delta = loss - state->loss_mean;
    const double alpha = 1.0 - config.loss_decay;
    state->loss_mean += alpha * delta;
    state->loss_variance = (1.0 - alpha) * (state->loss_variance + alpha * delta * delta);
  }
  ++state->losses_seen;
}

void FallBack(const PolicyConfig& config, Fallback why, PolicyState* state) {
  // A half stretch that failed soon after its return doubles the wait before the next one, up to
  // its cap (compared before doubling: a restored wait may be near int64's top).
  const int64_t cap = config.max_return_after_steps;
  state->return_after = state->half_run >= config.stable_half_steps ? config.return_after_steps
                        : state->return_after > cap / 2             ? cap
                                                                    : state->return_after * 2;
  state->precision = Precision::kFull;
  state->last_fallback = why;
  state->full_streak = 0;
  state->nonfinite_streak = 0;
  state->finite_streak = 0;
  ++state->switches;
}

void ReturnToHalf(const PolicyConfig& config, PolicyState* state) {
  state->precision = Precision::kHalf;
  state->loss_scale = config.loss_scaling ? config.initial_loss_scale : 1.0;
  state->half_run = 0;
  state->full_streak = 0;
  ++state->switches;
}

// The half-precision step: the fallback it triggers (kNone if none), scaling on the way.
Fallback HalfStep(const PolicyConfig& config, const Observation& seen, bool loss_finite,
                  PolicyState* state) {
  if (seen.ran_half) ++state->half_steps;
  ++state->half_run;
  if (seen.probed) state->last_probe_error = seen.probe_error;
  const bool finite = loss_finite && seen.gradients_finite;
  if (!finite) {
    if (!config.loss_scaling) return Fallback::kNonFinite;
    state->finite_streak = 0;
    state->loss_scale /= 2.0;
    if (++state->nonfinite_streak >= config.max_nonfinite_streak) {
      return Fallback::kNonFiniteStreak;
    }
    return state->loss_scale < config.min_loss_scale ? Fallback::kScaleFloor : Fallback::kNone;
  }
  state->nonfinite_streak = 0;
  if (seen.probed && !(seen.probe_error <= config.probe_tolerance)) return Fallback::kProbe;
  if (IsSpike(config, *state, seen.loss)) return Fallback::kLossSpike;
  if (config.loss_scaling && ++state->finite_streak >= config.growth_interval) {
    state->finite_streak = 0;
    state->loss_scale *= 2.0;
  }
  return Fallback::kNone;
}

}  // namespace

Decision Step(const PolicyConfig& config, const Observation& seen, PolicyState* state) {
  Decision decision;
  const bool loss_finite = std::isfinite(seen.loss);
  const bool spike = loss_finite && IsSpike(config, *state, seen.loss);
  ++state->steps;
  if (state->precision == Precision::kHalf) {
    const Fallback why = HalfStep(config, seen, loss_finite, state);
    decision.apply = why == Fallback::kNone && loss_finite && seen.gradients_finite;
    if (why != Fallback::kNone) {
      FallBack(config, why, state);
      decision.switched = true;
    }
  } else {
    decision.apply = loss_finite && seen.gradients_finite;
    state->full_streak = decision.apply ? state->full_streak + 1 : 0;
    if (state->full_streak >= state->return_after) {
      ReturnToHalf(config, state);
      decision.switched = true;
    }
  }
  if (loss_finite && !spike) TrackLoss(config, seen.loss, state);
  if (!decision.apply) ++state->skipped_steps;
  return decision;
}

double RelativeLossError(double loss, double reference) {
  if (!std::isfinite(loss) || !std::isfinite(reference)) {
    return std::numeric_limits<double>::infinity();
  }
  return std::fabs(loss - reference) / std::max(std::fabs(reference), 1e-30);
}

}  // namespace amp
}  // namespace tf_ext
