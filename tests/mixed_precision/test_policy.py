"""tf_ext.mixed_precision.PrecisionPolicy: the loss-aware precision policy's op, its state in a
variable (checkpointed), eagerly, in a tf.function and in a TF1 Session; its settings."""

import math
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tf_ext import mixed_precision
from tf_ext.mixed_precision import FALLBACKS, STATE_FIELDS, PolicyConfig, PrecisionPolicy

NAN = float("nan")


def fields(policy):
  return dict(zip(STATE_FIELDS, policy.state.numpy().tolist()))


def test_state_fields_match_the_op():
  config = PolicyConfig(initial_loss_scale=512.0, return_after_steps=7)
  state = fields(PrecisionPolicy(loss_scaling=True, config=config))
  assert len(STATE_FIELDS) == len(state) == 16
  assert state["precision"] == 1.0
  assert state["loss_scale"] == 512.0
  assert state["return_after"] == 7.0
  assert all(
    v == 0.0 for k, v in state.items() if k not in ("precision", "loss_scale", "return_after")
  )
  assert fields(PrecisionPolicy(loss_scaling=False, start_in_half=False))["precision"] == 0.0
  assert fields(PrecisionPolicy(loss_scaling=False))["loss_scale"] == 1.0  # bf16: no scaling


def test_bf16_falls_back_on_nan_then_returns_eagerly():
  config = PolicyConfig(return_after_steps=2, max_return_after_steps=4)
  policy = PrecisionPolicy(loss_scaling=False, config=config)
  assert bool(policy.decide(1.0, True))
  assert not bool(policy.decide(NAN, True))  # skipped, and full precision next
  report = policy.report()
  assert not bool(report["half"])
  assert FALLBACKS[int(report["last_fallback"])] == "nonfinite"
  # It failed right after starting: the wait doubled, 2 -> 4 applied full-precision steps.
  for _ in range(3):
    assert bool(policy.decide(1.0, True))
    assert not bool(policy.in_half())
  assert bool(policy.decide(1.0, True))
  report = policy.report()
  assert bool(report["half"])
  assert int(report["switches"]) == 2
  assert int(report["skipped_steps"]) == 1
  assert float(report["half_fraction"]) == pytest.approx(2 / 6)


def test_fp16_scaling_and_probe_in_a_tf_function():
  config = PolicyConfig(initial_loss_scale=1024.0, growth_interval=2, max_nonfinite_streak=2)
  policy = PrecisionPolicy(loss_scaling=True, config=config)

  @tf.function
  def step(loss, finite, probe_error):
    return policy.decide(loss, finite, probe_error)

  assert bool(step(1.0, True, -1.0))
  assert bool(step(1.0, True, 0.001))
  assert float(policy.report()["loss_scale"]) == 2048.0  # two finite steps
  assert float(policy.report()["last_probe_error"]) == pytest.approx(0.001)
  assert not bool(step(1.0, False, -1.0))  # overflow: skipped, scale halved
  assert float(policy.report()["loss_scale"]) == 1024.0
  assert bool(policy.in_half())
  assert not bool(step(1.0, True, 0.5))  # probe mismatch
  assert FALLBACKS[int(policy.report()["last_fallback"])] == "probe"
  assert not bool(policy.in_half())


def test_session_gates_updates_and_checkpoints_the_state(tmp_path):
  prefix = str(tmp_path / "ckpt")
  config = PolicyConfig(initial_loss_scale=8.0, max_nonfinite_streak=3)
  with tf.Graph().as_default():
    policy = PrecisionPolicy(loss_scaling=True, config=config)
    weight = tf.compat.v1.get_variable("w", initializer=1.0)
    loss = tf.compat.v1.placeholder(tf.float32, [])
    gradient = tf.compat.v1.placeholder(tf.float32, [])
    apply = policy.decide(loss, tf.math.is_finite(gradient))
    # The update runs only when the policy applies the step.
    train = tf.cond(apply, lambda: weight.assign_sub(gradient), lambda: tf.identity(weight))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      assert session.run(train, {loss: 1.0, gradient: 0.25}) == 0.75
      assert session.run(train, {loss: 1.0, gradient: math.inf}) == 0.75  # not applied
      assert session.run(train, {loss: 1.0, gradient: NAN}) == 0.75
      saved = session.run(policy.state)
      saver.save(session, prefix)
      session.run(train, {loss: 1.0, gradient: NAN})  # third in a row: full precision
      assert not session.run(policy.in_half())
    with tf.compat.v1.Session() as session:
      saver.restore(session, prefix)
      assert (session.run(policy.state) == saved).all()
      assert session.run(policy.in_half())
      assert session.run(policy.report()["loss_scale"]) == 2.0  # 8 halved twice


def test_bad_configs_are_clear_errors():
  with pytest.raises(TypeError, match="loss_scaling must be a bool"):
    PrecisionPolicy(loss_scaling="yes")
  with pytest.raises(TypeError, match="config must be a PolicyConfig"):
    PrecisionPolicy(loss_scaling=True, config={"growth_interval": 3})
  bad = PolicyConfig(return_after_steps=10, max_return_after_steps=5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="max_return_after_steps must be >="):
    PrecisionPolicy(loss_scaling=True, config=bad)


def test_settings_set_the_defaults_and_bad_values_name_the_variable():
  code = """
from tf_ext import mixed_precision
print(mixed_precision.config_from_settings().return_after_steps)
"""
  env = dict(os.environ, TF_EXT_AMP_RETURN_AFTER_STEPS="17", TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split()[-1] == "17"
  env["TF_EXT_AMP_LOSS_DECAY"] = "1.5"
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert proc.returncode != 0
  assert "TF_EXT_AMP_LOSS_DECAY='1.5' is invalid: must be in (0, 1)" in proc.stderr
  assert mixed_precision.config_from_settings() == PolicyConfig()  # this process: the defaults
