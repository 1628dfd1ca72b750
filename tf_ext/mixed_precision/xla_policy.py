"""The policy's step in XLA-compilable TensorFlow ops, for training steps that XLA compiles
(jit_compile=True, tf_ext.jit), where the op library's kernels cannot run: XLA has no kernel for a
custom op, and TensorFlow does not let a library add one.

policy_step() follows Step() of kernels/mixed_precision/core/loss_aware_policy.cc rule by rule, on
the same float64 state; tests/mixed_precision/test_xla.py checks that both give the same states
and decisions on the same observations. The policy's attributes reach the kernel as float32, so
the real-valued knobs are rounded to float32 here too.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from tf_ext.mixed_precision.policy_state import FALLBACKS, STATE_FIELDS

_NONE, _NONFINITE_STREAK, _SCALE_FLOOR, _NONFINITE, _PROBE, _LOSS_SPIKE = (
  float(FALLBACKS.index(name))
  for name in ("none", "nonfinite_streak", "scale_floor", "nonfinite", "probe", "loss_spike")
)
_FLOAT_ATTRIBUTES = (
  "initial_loss_scale",
  "min_loss_scale",
  "probe_tolerance",
  "spike_sigmas",
  "loss_decay",
)


def in_xla_context():
  """Whether the ops being built now go into an XLA-compiled function."""
  return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def policy_step(state, loss, gradients_finite, probe_error, ran_half, attributes):
  """(next state, apply) of one step, as the TfExtAmpPolicyStep op computes them.

  `attributes`: the op's attributes (the PolicyConfig's fields and loss_scaling).
  """
  c = {k: float(np.float32(v)) if k in _FLOAT_ATTRIBUTES else v for k, v in attributes.items()}
  s = {name: state[i] for i, name in enumerate(STATE_FIELDS)}
  f64 = tf.float64

  def where(condition, yes, no):
    return tf.where(condition, tf.cast(yes, f64), tf.cast(no, f64))

  loss = tf.cast(loss, f64)
  probe = tf.cast(probe_error, f64)
  probed = tf.logical_not(probe < 0.0)  # NaN counts as a probe that failed
  loss_finite = tf.math.is_finite(loss)
  gradients_finite = tf.convert_to_tensor(gradients_finite, tf.bool)
  finite = tf.logical_and(loss_finite, gradients_finite)
  spike = tf.logical_and(
    s["losses_seen"] >= c["spike_warmup_steps"],
    loss > s["loss_mean"] + c["spike_sigmas"] * tf.sqrt(s["loss_variance"]),
  )
  spike = tf.logical_and(loss_finite, spike)
  in_half = s["precision"] != 0.0
  initial_scale = c["initial_loss_scale"] if c["loss_scaling"] else 1.0

  # Half precision (HalfStep): the fallback it triggers, scaling on the way.
  half_run = s["half_run"] + 1.0
  if c["loss_scaling"]:
    nonfinite_scale = s["loss_scale"] / 2.0
    nonfinite_streak = s["nonfinite_streak"] + 1.0
    nonfinite_why = where(
      nonfinite_streak >= c["max_nonfinite_streak"],
      _NONFINITE_STREAK,
      where(nonfinite_scale < c["min_loss_scale"], _SCALE_FLOOR, _NONE),
    )
    nonfinite_finite_streak = tf.zeros([], f64)
  else:
    nonfinite_scale, nonfinite_streak = s["loss_scale"], s["nonfinite_streak"]
    nonfinite_why = tf.constant(_NONFINITE, f64)
    nonfinite_finite_streak = s["finite_streak"]
  probe_failed = tf.logical_and(probed, tf.logical_not(probe <= c["probe_tolerance"]))
  finite_why = where(probe_failed, _PROBE, where(spike, _LOSS_SPIKE, _NONE))
  finite_streak, finite_scale = s["finite_streak"], s["loss_scale"]
  if c["loss_scaling"]:
    counted = where(finite_why == _NONE, finite_streak + 1.0, finite_streak)
    grow = tf.logical_and(finite_why == _NONE, counted >= c["growth_interval"])
    finite_streak = where(grow, 0.0, counted)
    finite_scale = where(grow, finite_scale * 2.0, finite_scale)
  why = where(finite, finite_why, nonfinite_why)
  half = dict(
    s,
    half_steps=s["half_steps"] + where(ran_half, 1.0, 0.0),
    half_run=half_run,
    last_probe_error=where(probed, probe, s["last_probe_error"]),
    loss_scale=where(finite, finite_scale, nonfinite_scale),
    finite_streak=where(finite, finite_streak, nonfinite_finite_streak),
    nonfinite_streak=where(finite, 0.0, nonfinite_streak),
  )
  half_apply = tf.logical_and(why == _NONE, finite)
  fell_back = why != _NONE
  # FallBack: a half stretch that failed soon after its return doubles the next wait.
  fallback = dict(
    half,
    return_after=where(
      half_run < c["stable_half_steps"],
      tf.minimum(s["return_after"] * 2.0, float(c["max_return_after_steps"])),
      float(c["return_after_steps"]),
    ),
    precision=tf.zeros([], f64),
    last_fallback=why,
    full_streak=tf.zeros([], f64),
    nonfinite_streak=tf.zeros([], f64),
    finite_streak=tf.zeros([], f64),
    switches=s["switches"] + 1.0,
  )
  half = {k: where(fell_back, fallback[k], v) for k, v in half.items()}

  # Full precision: applied when finite; return_after applied steps in a row return to half.
  full_apply = finite
  full_streak = where(full_apply, s["full_streak"] + 1.0, 0.0)
  back = full_streak >= s["return_after"]
  full = dict(
    s,
    full_streak=where(back, 0.0, full_streak),
    precision=where(back, 1.0, s["precision"]),
    loss_scale=where(back, initial_scale, s["loss_scale"]),
    half_run=where(back, 0.0, s["half_run"]),
    switches=where(back, s["switches"] + 1.0, s["switches"]),
  )

  apply = tf.where(in_half, half_apply, full_apply)
  after = {k: where(in_half, half[k], full[k]) for k in STATE_FIELDS}
  after["steps"] = s["steps"] + 1.0
  # TrackLoss: exponential moving mean and variance of finite losses that are no spike.
  alpha = 1.0 - c["loss_decay"]
  delta = loss - s["loss_mean"]
  first = s["losses_seen"] == 0.0
  tracked = tf.logical_and(loss_finite, tf.logical_not(spike))
  mean = where(first, loss, s["loss_mean"] + alpha * delta)
  variance = where(first, 0.0, (1.0 - alpha) * (s["loss_variance"] + alpha * delta * delta))
  after["loss_mean"] = where(tracked, mean, s["loss_mean"])
  after["loss_variance"] = where(tracked, variance, s["loss_variance"])
  after["losses_seen"] = where(tracked, s["losses_seen"] + 1.0, s["losses_seen"])
  after["skipped_steps"] = where(apply, after["skipped_steps"], after["skipped_steps"] + 1.0)
  return tf.stack([after[k] for k in STATE_FIELDS]), apply
