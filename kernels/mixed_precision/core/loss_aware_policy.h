// The policy of loss-aware mixed precision: after each training step, from what the step saw
// (its loss, whether its gradients were finite, a precision probe's error), decide whether the
// step's update is applied, the loss scale, and whether the next step runs in half or full
// precision. Plain C++17, no TensorFlow types (kernels/mixed_precision/policy_kernels.cc adapts
// it; googletest covers it alone).
//
// In half precision:
//   - with loss scaling (fp16): a step with non-finite gradients is skipped and halves the scale;
//     growth_interval finite steps in a row double it. max_nonfinite_streak non-finite steps in a
//     row, or a scale below min_loss_scale, fall back to full precision;
//   - without (bf16): a non-finite loss or gradient falls back at once;
//   - in both: a probe whose relative loss error exceeds probe_tolerance falls back, and so does a
//     loss spike: a loss above its running mean by spike_sigmas running standard deviations
//     (once spike_warmup_steps losses were seen). A step that falls back is not applied.
// In full precision a step is applied when its gradients are finite. After return_after_steps
// applied steps in a row the policy returns to half precision with the initial loss scale. Each
// fallback that comes within `stable_half_steps` of a return doubles the wait (up to
// max_return_after_steps); a fallback after a longer stable stretch resets it.
//
// The running loss statistics (exponential moving mean and variance, `loss_decay`) take every
// finite loss that is not a spike, in either precision.
#ifndef TF_EXT_KERNELS_MIXED_PRECISION_CORE_LOSS_AWARE_POLICY_H_
#define TF_EXT_KERNELS_MIXED_PRECISION_CORE_LOSS_AWARE_POLICY_H_

#include <cstdint>
#include <string>

namespace tf_ext {
namespace amp {

enum class Precision : int64_t { kFull = 0, kHalf = 1 };

// Why the policy last fell back to full precision.
enum class Fallback : int64_t {
  kNone = 0,
  kNonFiniteStreak = 1,  // fp16: max_nonfinite_streak non-finite steps in a row
  kScaleFloor = 2,       // fp16: the loss scale fell below min_loss_scale
  kNonFinite = 3,        // bf16: a non-finite loss or gradient
  kProbe = 4,            // the precision probe's relative loss error exceeded its tolerance
  kLossSpike = 5,        // the loss exceeded its running mean by spike_sigmas deviations
};

struct PolicyConfig {
  bool loss_scaling = true;
  double initial_loss_scale = 32768.0;
  int64_t growth_interval = 2000;
  double min_loss_scale = 1.0;
  int64_t max_nonfinite_streak = 8;
  double probe_tolerance = 0.02;
  double spike_sigmas = 6.0;
  int64_t spike_warmup_steps = 50;
  double loss_decay = 0.99;
  int64_t return_after_steps = 200;
  int64_t max_return_after_steps = 200 * 64;
  int64_t stable_half_steps = 2000;

  // False, with the reason in *error, for values out of range.
  bool Valid(std::string* error) const;
};

struct PolicyState {
  Precision precision = Precision::kHalf;
  double loss_scale = 1.0;
  int64_t finite_streak = 0;     // half: finite steps since the scale last changed
  int64_t nonfinite_streak = 0;  // half: non-finite steps in a row
  int64_t full_streak = 0;       // full: applied steps in a row
  int64_t half_run = 0;          // half: steps since the last return to half precision
  int64_t return_after = 0;      // full: applied steps in a row needed to return
  int64_t steps = 0;             // steps decided
  int64_t half_steps = 0;        // of which ran in half precision
  int64_t skipped_steps = 0;     // of which not applied
  int64_t switches = 0;          // precision changes, either way
  Fallback last_fallback = Fallback::kNone;
  double loss_mean = 0.0;
  double loss_variance = 0.0;
  int64_t losses_seen = 0;
  double last_probe_error = 0.0;

  // A flat array of doubles (what the TensorFlow op keeps in a variable, so checkpoints hold it).
  // Counters are exact up to 2^53.
  static constexpr int kSize = 16;
  void ToArray(double* out) const;
  static PolicyState FromArray(const double* values);
};

// The state a policy starts in: `start` precision, initial loss scale (1 without scaling).
PolicyState InitialState(const PolicyConfig& config, Precision start);

struct Observation {
  double loss = 0.0;
  bool gradients_finite = true;
  bool ran_half = true;      // whether this step's compute ran in half (counted in half_steps)
  bool probed = false;       // whether a precision probe ran this step
  double probe_error = 0.0;  // its |loss_half - loss_full| / max(|loss_full|, tiny)
};

struct Decision {
  bool apply = false;  // whether this step's update is applied
  bool switched = false;
};

// The probe's relative loss error |loss - reference| / max(|reference|, tiny); non-finite values
// give +infinity (a probe that overflowed disagrees).
double RelativeLossError(double loss, double reference);

// Decides the step `observation` describes, updating *state for the next step.
Decision Step(const PolicyConfig& config, const Observation& observation, PolicyState* state);

}  // namespace amp
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_MIXED_PRECISION_CORE_LOSS_AWARE_POLICY_H_
