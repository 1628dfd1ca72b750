// libFuzzer harness of the loss-aware precision policy (loss_aware_policy.h): a state restored
// from any 16 doubles (what the op keeps in a variable: a checkpoint or a user's assign can put
// anything there), a valid configuration, then steps with any loss, finiteness and probe. No
// undefined behaviour (a double outside int64's range converted, a counter overflowing), a
// precision that is full or half, and the state's array form round-trips.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/mixed_precision/core/loss_aware_policy.h"
#include "tests/fuzz/fuzz_input.h"

namespace amp = tf_ext::amp;

namespace {

// Any double: special values often, else the raw bits.
double AnyDouble(FuzzInput& in) {
  switch (in.Byte() % 8) {
    case 0:
      return NAN;
    case 1:
      return INFINITY;
    case 2:
      return -INFINITY;
    case 3:
      return in.Byte() - 128.0;
    case 4:
      return std::ldexp(1.0, in.Byte() % 80);
    default: {
      const uint64_t bits = in.Unsigned(8);
      double value;
      memcpy(&value, &bits, 8);
      return value;
    }
  }
}

bool SameBits(const double* a, const double* b, int n) { return memcmp(a, b, 8 * n) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  amp::PolicyConfig config;
  const uint8_t knobs = in.Byte();
  config.loss_scaling = knobs & 1;
  if (knobs & 2) config.initial_loss_scale = AnyDouble(in);
  if (knobs & 4) config.growth_interval = in.Byte() % 8;
  if (knobs & 8) config.min_loss_scale = AnyDouble(in);
  if (knobs & 16) config.max_nonfinite_streak = in.Byte() % 4;
  if (knobs & 32) config.probe_tolerance = AnyDouble(in);
  if (knobs & 64) config.spike_sigmas = AnyDouble(in);
  if (knobs & 128) {
    config.spike_warmup_steps = in.Byte() % 8;
    config.loss_decay = AnyDouble(in);
    config.return_after_steps = in.Byte() % 8;
    config.max_return_after_steps = config.return_after_steps * (1 + in.Byte() % 4);
    config.stable_half_steps = in.Byte() % 16;
  }
  std::string error;
  if (!config.Valid(&error)) {
    CHECK(!error.empty());
    return 0;
  }
  amp::PolicyState state;
  if (in.Byte() & 1) {
    double values[amp::PolicyState::kSize];
    for (double& v : values) v = AnyDouble(in);
    state = amp::PolicyState::FromArray(values);
  } else {
    state =
        amp::InitialState(config, in.Byte() & 1 ? amp::Precision::kHalf : amp::Precision::kFull);
  }
  for (int step = 0; step < 256 && !in.empty(); ++step) {
    amp::Observation observation;
    const uint8_t shape = in.Byte();
    observation.loss = shape & 1 ? AnyDouble(in) : 1.0 + (shape >> 4) * 0.01;
    observation.gradients_finite = !(shape & 2);
    observation.ran_half = shape & 4;
    observation.probed = shape & 8;
    if (observation.probed) observation.probe_error = AnyDouble(in);
    amp::Step(config, observation, &state);
    CHECK(state.precision == amp::Precision::kFull || state.precision == amp::Precision::kHalf);
    double once[amp::PolicyState::kSize], twice[amp::PolicyState::kSize];
    state.ToArray(once);
    amp::PolicyState::FromArray(once).ToArray(twice);
    CHECK(SameBits(once, twice, amp::PolicyState::kSize));
  }
  return 0;
}
