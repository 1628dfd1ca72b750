"""The loss-aware precision policy as a TensorFlow object: its state in a variable (so checkpoints
hold it), one op per step that decides (kernels/mixed_precision/core/loss_aware_policy.h).

Each step reports what it saw (its loss, whether its gradients were finite, a precision probe's
error); the policy answers whether the step's update is applied and updates the precision (half
or full), the loss scale and its counters for the next step. Works eagerly, in a tf.function and
in TF1 graphs.
"""

import dataclasses
import functools

import tensorflow as tf

from tf_ext import _ops_loader, settings
from tf_ext.mixed_precision import xla_policy
from tf_ext.mixed_precision.policy_state import STATE_FIELDS

PolicyConfig = settings.config_class(
  "mixed_precision",
  "PolicyConfig",
  namespace={
    "__doc__": "The policy's knobs, one per TF_EXT_AMP_* setting (defaults from tf_ext.settings)."
  },
  module=__name__,
)
"""The policy's knobs: a frozen dataclass with one field per TF_EXT_AMP_* setting, defaulting to
the setting's default (config_from_settings() reads the environment instead)."""


def config_from_settings():
  """A PolicyConfig of the TF_EXT_AMP_* settings as the environment holds them."""
  return PolicyConfig(
    **{s.attribute: settings.get(s.name) for s in settings.of("mixed_precision") if s.attribute}
  )


class PrecisionPolicy(tf.Module):
  """Decides, step by step, half or full precision, the loss scale and which updates apply.

  Args:
    loss_scaling: True for fp16 (dynamic loss scaling), False for bf16.
    start_in_half: the precision of the first step.
    config: a PolicyConfig; default: the TF_EXT_AMP_* settings.
  """

  def __init__(self, loss_scaling, start_in_half=True, config=None, name="loss_aware_precision"):
    super().__init__(name=name)
    if not isinstance(loss_scaling, bool):
      raise TypeError(f"PrecisionPolicy: loss_scaling must be a bool, got {loss_scaling!r}")
    config = config or config_from_settings()
    if not isinstance(config, PolicyConfig):
      raise TypeError(f"PrecisionPolicy: config must be a PolicyConfig, got {config!r}")
    self._attrs = dict(dataclasses.asdict(config), loss_scaling=loss_scaling)
    with tf.init_scope(), self.name_scope:
      initial = _ops_loader.load().tf_ext_amp_policy_initial_state(
        start_in_half=start_in_half, **self._attrs
      )
      self.state = tf.Variable(initial, trainable=False, name="state")

  def decide(self, loss, gradients_finite, probe_error=None, ran_half=None):
    """Decides the current step: a boolean scalar, whether its update is to be applied.

    Evaluating it also moves the state to the next step, so evaluate it once per step and gate
    the update on it. `probe_error`: the relative loss error of this step's precision probe, or
    None when no probe ran. `ran_half`: whether the step's compute ran in half precision
    (default: as the state says).
    """
    probe = tf.constant(-1.0) if probe_error is None else tf.cast(probe_error, tf.float32)
    if ran_half is None:
      ran_half = self.in_half()
    inputs = (
      tf.cast(loss, tf.float32),
      tf.convert_to_tensor(gradients_finite, tf.bool),
      probe,
      tf.convert_to_tensor(ran_half, tf.bool),
    )
    if xla_policy.in_xla_context():  # XLA has no kernel for the op: the same rules in TF ops
      next_state, apply = xla_policy.policy_step(self.state.read_value(), *inputs, self._attrs)
    else:
      next_state, apply = _ops_loader.load().tf_ext_amp_policy_step(
        self.state, *inputs, **self._attrs
      )
    with tf.control_dependencies([self.state.assign(next_state)]):
      return tf.identity(apply)

  def field(self, name):
    """One field of the state (see STATE_FIELDS) as a float64 scalar."""
    return self.field_of(self.state, name)

  def in_half(self):
    """Whether the next step runs in half precision (boolean scalar)."""
    return self.in_half_of(self.state)

  def report(self):
    """{name: scalar tensor}: half (bool), loss_scale, switches, steps, half_fraction (of the
    steps decided), skipped_steps, last_probe_error, last_fallback (an index into FALLBACKS)."""
    return self.report_of_state(self.state)

  @staticmethod
  def field_of(state, name):
    """field() of a policy state (a variable or tensor of STATE_FIELDS)."""
    return state[STATE_FIELDS.index(name)]

  @staticmethod
  def in_half_of(state):
    """in_half() of a policy state."""
    return PrecisionPolicy.field_of(state, "precision") > 0.5

  @staticmethod
  def report_of_state(state):
    """report() of a policy state."""
    field = functools.partial(PrecisionPolicy.field_of, state)
    steps = field("steps")
    return {
      "half": PrecisionPolicy.in_half_of(state),
      "loss_scale": field("loss_scale"),
      "switches": tf.cast(field("switches"), tf.int64),
      "steps": tf.cast(steps, tf.int64),
      "half_fraction": field("half_steps") / tf.maximum(steps, 1.0),
      "skipped_steps": tf.cast(field("skipped_steps"), tf.int64),
      "last_probe_error": field("last_probe_error"),
      "last_fallback": tf.cast(field("last_fallback"), tf.int64),
    }
