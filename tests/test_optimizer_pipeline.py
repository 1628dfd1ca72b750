"""The optimizer pipeline (tf_ext/optimizer_pipeline.py): wrappers compose in any order, the
steps run in the documented order in TF1, Keras and GradientTape training, a gate skips steps,
and the wrapped optimizer is found through other libraries' wrappers."""

import itertools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tf_ext  # noqa: E402
from tf_ext import optimizer_pipeline  # noqa: E402


class Recorder(optimizer_pipeline.Stage):
  """A stage of a given kind that logs what the pipeline asks of it."""

  def __init__(self, kind, log, scale=1.0, gate=None):
    self.kind, self.log, self.scale, self.gate = kind, log, scale, gate

  def scale_loss(self, loss):
    self.log.append(f"scale_loss {self.kind}")
    return loss * self.scale

  def transform(self, grads_and_vars):
    self.log.append(f"transform {self.kind}")
    if self.scale == 1.0:
      return grads_and_vars
    return [(None if g is None else g / self.scale, v) for g, v in grads_and_vars]

  def should_apply(self, grads_and_vars):
    return None if self.gate is None else tf.constant(self.gate)

  def apply(self, optimizer, grads_and_vars, step):
    self.log.append(f"apply {self.kind}")
    return [], grads_and_vars


def _wrappers(log):
  return {
    kind: (lambda opt, kind=kind: optimizer_pipeline.add_stage(opt, Recorder(kind, log)))
    for kind in optimizer_pipeline.KINDS
  }


EXPECTED_ORDER = {
  # v1: compute_gradients does the loss and the transforms, apply_gradients the rest.
  "v1": [
    "scale_loss loss_scale",
    "scale_loss reduce",
    "scale_loss tables",
    "transform loss_scale",
    "transform reduce",
    "transform tables",
    "apply loss_scale",
    "apply reduce",
    "apply tables",
  ],
}
EXPECTED_ORDER["keras"] = EXPECTED_ORDER["v1"]


@pytest.mark.parametrize("order", list(itertools.permutations(optimizer_pipeline.KINDS)))
def test_steps_run_in_kinds_order_whatever_the_wrapping_order_keras(order):
  log = []
  wrappers = _wrappers(log)
  optimizer = tf.keras.optimizers.SGD(0.1)
  for kind in order:
    optimizer = wrappers[kind](optimizer)
  variable = tf.Variable([1.0, 2.0])
  optimizer.minimize(lambda: tf.reduce_sum(variable * variable), [variable])
  assert log == EXPECTED_ORDER["keras"]
  np.testing.assert_allclose(variable.numpy(), [0.8, 1.6])  # dense applied once, unscaled
  assert [s.kind for s in optimizer_pipeline.stages(optimizer)] == list(optimizer_pipeline.KINDS)


@pytest.mark.parametrize("order", list(itertools.permutations(optimizer_pipeline.KINDS)))
def test_steps_run_in_kinds_order_whatever_the_wrapping_order_tf1(order):
  log = []
  wrappers = _wrappers(log)
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("v", initializer=[1.0, 2.0])
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for kind in order:
      optimizer = wrappers[kind](optimizer)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = optimizer.minimize(tf.reduce_sum(variable * variable), global_step=step)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(train)
      np.testing.assert_allclose(sess.run(variable), [0.8, 1.6])
      assert sess.run(step) == 1
  assert log == EXPECTED_ORDER["v1"]


def test_loss_scale_stage_scales_the_loss_inside_the_tape_and_unscales_gradients():
  log = []
  optimizer = optimizer_pipeline.add_stage(
    tf.keras.optimizers.SGD(0.1), Recorder("loss_scale", log, scale=1024.0)
  )
  variable = tf.Variable([1.0, 2.0])
  seen = []
  probe = Recorder("reduce", [])
  probe.transform = lambda pairs: seen.append([g.numpy() for g, _ in pairs]) or pairs
  optimizer_pipeline.add_stage(optimizer, probe)

  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(variable * variable)
  optimizer.minimize(loss, [variable], tape=tape)
  np.testing.assert_allclose(seen[0][0], [2.0, 4.0])  # the reduce stage sees unscaled gradients
  np.testing.assert_allclose(variable.numpy(), [0.8, 1.6])


@pytest.mark.parametrize("apply", [True, False])
def test_a_gate_skips_tables_and_dense_but_advances_the_step_keras_tf_function(apply):
  table = tf_ext.get_dynamic_embedding_variable(f"gate_table_{apply}", 2, initializer="zeros")
  dense = tf.Variable([1.0])
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
  optimizer_pipeline.add_stage(optimizer, Recorder("loss_scale", [], gate=apply))

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(table.lookup([3, 4])) * dense[0]
    variables = [table.gradient_anchor, dense]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

  step()
  step()
  assert int(optimizer.iterations.numpy()) == 2
  assert int(table.size()) == (2 if apply else 0)
  assert (dense.numpy()[0] != 1.0) == apply


@pytest.mark.parametrize("apply", [True, False])
def test_a_gate_skips_the_update_in_a_tf1_session(apply):
  with tf.Graph().as_default():
    emb = tf_ext.dynamic_embedding(tf.constant([1, 2], tf.int64), 2, name="gate_tf1")
    w = tf.compat.v1.get_variable("w", initializer=[1.0, 1.0])
    loss = tf.reduce_sum(emb * w)
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    optimizer_pipeline.add_stage(optimizer, Recorder("loss_scale", [], gate=apply))
    train = optimizer.minimize(loss, global_step=step)
    table = tf_ext.get_dynamic_embedding_variable("gate_tf1", 2)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(train)
      assert sess.run(step) == 1
      assert sess.run(table.size()) == (2 if apply else 0)
      assert (sess.run(w)[0] != 1.0) == apply


def test_tape_stages_scale_the_target_and_transform_the_gradients():
  log = []
  variable = tf.Variable([1.0, 2.0])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(variable * variable)
  tape = optimizer_pipeline.add_stage(tape, Recorder("reduce", log, scale=2.0))
  (grad,) = tape.gradient(loss, [variable])
  # The target is scaled by 2 (recorded on the tape), the gradients divided by 2: d(v.v)/dv.
  np.testing.assert_allclose(grad.numpy(), [2.0, 4.0])
  assert log == ["scale_loss reduce", "transform reduce"]
  with pytest.raises(TypeError, match="optimizer"):
    optimizer_pipeline.add_stage(tf.GradientTape(), Recorder("tables", log))


def test_tables_train_through_keras_loss_scale_optimizer_in_either_order():
  for wrap in (
    lambda o: tf_ext.DynamicEmbeddingOptimizer(tf.keras.mixed_precision.LossScaleOptimizer(o)),
    lambda o: tf.keras.mixed_precision.LossScaleOptimizer(tf_ext.DynamicEmbeddingOptimizer(o)),
  ):
    table = tf_ext.DynamicEmbeddingVariable("lso_table", 2, initializer="zeros")
    optimizer = wrap(tf.keras.optimizers.SGD(0.5))
    assert isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    assert optimizer_pipeline.find_stage(optimizer, "tables") is not None
    with tf.GradientTape() as tape:
      loss = optimizer.get_scaled_loss(tf.reduce_sum(table.lookup([7]) - 1.0))
    grads = optimizer.get_unscaled_gradients(tape.gradient(loss, [table.gradient_anchor]))
    optimizer.apply_gradients(zip(grads, [table.gradient_anchor]))
    np.testing.assert_allclose(table.lookup([7]).numpy(), [[-0.5, -0.5]])


def test_wrapped_optimizer_is_found_through_wrappers_and_bad_objects_are_refused():
  adam = tf.keras.optimizers.Adam()
  lso = tf.keras.mixed_precision.LossScaleOptimizer(adam)
  assert optimizer_pipeline.wrapped_optimizer(lso) is adam
  assert optimizer_pipeline.wrapped_optimizer(tf_ext.DynamicEmbeddingOptimizer(lso)) is adam
  with pytest.raises(TypeError, match="not an optimizer tf_ext can extend"):
    optimizer_pipeline.add_stage(object(), Recorder("reduce", []))
  with pytest.raises(ValueError, match="unknown stage kind"):
    optimizer_pipeline.add_stage(adam, Recorder("clip", []))
  with pytest.raises(tf.errors.InvalidArgumentError, match="Adafactor is not supported"):
    tf_ext.DynamicEmbeddingOptimizer(
      tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adafactor())
    )


def test_wrapping_keeps_the_object_its_class_name_and_its_config():
  adam = tf.keras.optimizers.Adam(0.003)
  config = adam.get_config()
  wrapped = tf_ext.DynamicEmbeddingOptimizer(adam)
  assert wrapped is adam and type(adam).__name__ == "Adam"
  assert isinstance(adam, tf.keras.optimizers.Adam)
  assert tf_ext.DynamicEmbeddingOptimizer(adam) is adam  # twice: still one tables stage
  assert len(optimizer_pipeline.stages(adam)) == 1
  saved = adam.get_config()
  assert saved.pop("tf_ext_stages") == ["tables"] and saved == config
  clone = type(adam).from_config(adam.get_config())
  assert optimizer_pipeline.find_stage(clone, "tables") is not None
