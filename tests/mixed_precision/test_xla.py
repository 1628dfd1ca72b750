"""Loss-aware AMP in steps XLA compiles (Keras jit_compile=True, tf_ext.jit): they compile and
train under the policy, whose XLA version decides as the op's kernel does."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import tf_ext  # noqa: E402
import tf_ext.mixed_precision as amp  # noqa: E402
from tf_ext import _ops_loader  # noqa: E402
from tf_ext.mixed_precision import xla_policy  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.normal(size=(64, 16)).astype(np.float32)
Y = (X[:, :1] > 0).astype(np.float32)
QUICK = amp.PolicyConfig(
  initial_loss_scale=1024.0,
  growth_interval=3,
  max_nonfinite_streak=2,
  min_loss_scale=300.0,
  spike_warmup_steps=3,
  spike_sigmas=2.0,
  return_after_steps=2,
  max_return_after_steps=8,
  stable_half_steps=5,
  probe_tolerance=0.05,
)


def observations(count, seed):
  """Steps that visit every rule: non-finite losses and gradients, failing and passing probes,
  NaN probes, spikes, and both precisions."""
  rng = np.random.default_rng(seed)
  for _ in range(count):
    loss = rng.choice([rng.normal(1.0, 0.1), 50.0, np.nan, np.inf], p=[0.8, 0.08, 0.06, 0.06])
    probe = rng.choice([-1.0, rng.uniform(0, 0.1), np.nan], p=[0.6, 0.35, 0.05])
    yield np.float32(loss), bool(rng.random() > 0.15), np.float32(probe), bool(rng.random() > 0.3)


@pytest.mark.parametrize("loss_scaling", [True, False], ids=["fp16", "bf16"])
def test_the_xla_policy_step_decides_exactly_as_the_kernel(loss_scaling):
  attributes = dict(QUICK.__dict__, loss_scaling=loss_scaling)
  ops = _ops_loader.load()
  state = ops.tf_ext_amp_policy_initial_state(start_in_half=True, **attributes)
  compiled_step = tf.function(lambda *a: xla_policy.policy_step(*a, attributes), jit_compile=True)
  fallbacks = set()
  for loss, finite, probe, ran_half in observations(400, seed=int(loss_scaling)):
    want_state, want_apply = ops.tf_ext_amp_policy_step(
      state, loss, finite, probe, ran_half, **attributes
    )
    got_state, got_apply = compiled_step(state, loss, finite, probe, ran_half)
    # Counters and modes exactly; XLA may fuse the loss statistics' arithmetic (an ulp or so).
    np.testing.assert_allclose(got_state.numpy(), want_state.numpy(), rtol=1e-12, atol=0)
    assert bool(got_apply) == bool(want_apply)
    fallbacks.add(amp.FALLBACKS[int(want_state[amp.STATE_FIELDS.index("last_fallback")])])
    state = want_state
  expected = {"probe", "loss_spike"} | (
    {"nonfinite_streak", "scale_floor"} if loss_scaling else {"nonfinite"}
  )
  assert expected <= fallbacks


def keras_model():
  init = tf.keras.initializers.GlorotUniform(seed=1)
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(16, "relu", kernel_initializer=init, input_shape=(16,)),
      tf.keras.layers.Dense(1, kernel_initializer=init),
    ]
  )


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_keras_fit_with_jit_compile_trains_under_the_policy(half):
  model = keras_model()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.Adam(1e-2), half, probe_interval=2)
  model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
  history = model.fit(X, Y, batch_size=16, epochs=3, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  weights = model.get_weights()
  model.fit(X[:16] * np.nan, Y[:16], batch_size=16, epochs=1, verbose=0)  # skipped, not applied
  for before, after in zip(weights, model.get_weights()):
    np.testing.assert_array_equal(before, after)
  report = amp.report(optimizer)
  assert report["steps"] == 13 and report["skipped_steps"] >= 1
  assert report["half_fraction"] == 0.0  # XLA's steps run in fp32: the rewrite sees none


def test_a_tf_ext_jit_function_compiles_a_loss_aware_step():
  model = keras_model()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.SGD(0.1), "float16", probe_interval=2)

  @tf_ext.jit.function(paddable="batch", min_observations=2)
  def train_step(x, y):
    with tf.GradientTape() as tape:
      per_example = tf.keras.losses.binary_crossentropy(y, model(x), from_logits=True)
      loss = tf_ext.jit.masked_mean(per_example)
    tape = amp.LossAwareGradientTape(tape, optimizer)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  try:
    for _ in range(2):
      for n in (16, 12, 16, 9):
        train_step(X[:n], Y[:n])
      assert train_step.wait_for_compiles(timeout=120)
    assert train_step.compiles > 0
    assert train_step.stats["compiled"] > 0, (dict(train_step.stats), train_step.events)
  finally:
    train_step.close()
  report = amp.report(optimizer)
  assert report["steps"] == 8 and report["skipped_steps"] == 0
